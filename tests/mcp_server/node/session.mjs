// One full MCP session against ipybox's MCP server with the TypeScript SDK's client, for
// tests/mcp_server/test_node_clients.py.
//
// Usage: node session.mjs CONFIG_JSON, where CONFIG_JSON is
//   {"nodeModules": ".../node_modules", "transport": "stdio", "command": "...", "args": [...],
//    "edge": {"command": "...", "args": [...]}}
// or with "transport": "http", "url": "...", "token": "..." in place of command and args.
// Prints one JSON object (the summary the test asserts on) on stdout; exits 1 with the error on stderr
// when the session itself breaks.

import { join } from "node:path";
import { pathToFileURL } from "node:url";

const config = JSON.parse(process.argv[2]);
// The SDK lives in .cache/, not beside this file, so it is imported by path.
const sdk = (module) =>
  import(pathToFileURL(join(config.nodeModules, "@modelcontextprotocol/sdk/dist/esm", module)).href);

const { Client } = await sdk("client/index.js");

function textOf(result) {
  return (result.content ?? [])
    .filter((block) => block.type === "text")
    .map((block) => block.text)
    .join("\n");
}

async function transport() {
  if (config.transport === "stdio") {
    const { StdioClientTransport } = await sdk("client/stdio.js");
    return new StdioClientTransport({ command: config.command, args: config.args, stderr: "inherit" });
  }
  const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");
  return new StreamableHTTPClientTransport(new URL(config.url), {
    requestInit: { headers: { Authorization: `Bearer ${config.token}` } },
  });
}

const client = new Client({ name: "ipybox-node-test", version: "1.0.0" });
const summary = { transport: config.transport };
const call = async (name, args) => {
  const result = await client.callTool({ name, arguments: args }, undefined, { timeout: 300_000 });
  return { isError: Boolean(result.isError), text: textOf(result) };
};

try {
  await client.connect(await transport());
  summary.server = client.getServerVersion();
  summary.instructions = client.getInstructions() ?? "";
  const { tools } = await client.listTools();
  summary.tools = tools.map((tool) => tool.name).sort();
  summary.executeSchema = tools.find((tool) => tool.name === "execute_ipython_cell")?.inputSchema ?? null;

  summary.register = await call("register_mcp_server", { server_name: "edge", server_params: config.edge });
  summary.echo = await call("execute_ipython_cell", {
    code: "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='hi')))",
  });
  // Not covered by a rule, so "ask"; this client offers no elicitation, so the call is denied.
  summary.ask = await call("execute_ipython_cell", {
    code:
      "from mcptools.edge import weather\ntry:\n    print(weather.run(weather.Params(city='Oslo')))\n" +
      "except Exception as e:\n    print(type(e).__name__)",
  });
  summary.error = await call("execute_ipython_cell", { code: "1 / 0" });
  summary.install = await call("install_package", { package_name: "ipybox-no-such-package-xyz" });
  await call("execute_ipython_cell", { code: "x = 41" });
  summary.before_reset = await call("execute_ipython_cell", { code: "print(x + 1)" });
  summary.reset = await call("reset", {});
  summary.after_reset = await call("execute_ipython_cell", { code: "print('x' in globals())" });
} catch (error) {
  console.error(`session failed: ${error?.stack ?? error}`);
  process.exitCode = 1;
} finally {
  await client.close().catch(() => {});
}
process.stdout.write(`${JSON.stringify(summary)}\n`);
