"""ipybox's MCP server driven by real MCP clients nobody here wrote, over stdio and streamable HTTP: the
MCP Inspector CLI (`@modelcontextprotocol/inspector --cli`) and the TypeScript SDK's `Client`
(`node/session.mjs`). Both are npm packages that `bash scripts/setup` installs into `.cache/npm-clients`;
without node or them these tests fail (never skip)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ipybox.supervisor import Supervisor, read_state
from tests.cli.test_main import IPYBOX
from tests.mcp_server.sessions import BUILT_IN_TOOLS
from tests.servers.params import CACHE, EDGE_SERVER
from tests.supervisor.workspaces import RULES

pytestmark = pytest.mark.integration

NODE_MODULES = CACHE / "npm-clients" / "node_modules"
SESSION_SCRIPT = Path(__file__).resolve().parent / "node" / "session.mjs"
TOOLS = sorted(BUILT_IN_TOOLS)


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.fail(f"{what} is not installed ({path} is missing): run `bash scripts/setup`", pytrace=False)
    return path


def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail(
            "node is not on PATH: install Node.js >= 18, then run `bash scripts/setup`", pytrace=False
        )
    return path


def inspector() -> list[str]:
    """The command line of the Inspector CLI (its `mcp-inspector` bin, run by node)."""
    package = _require(
        NODE_MODULES / "@modelcontextprotocol" / "inspector" / "package.json",
        "npm package @modelcontextprotocol/inspector",
    )
    entry = _require(package.parent / json.loads(package.read_text())["bin"]["mcp-inspector"], "its CLI")
    return [node(), str(entry), "--cli"]


def sdk_modules() -> Path:
    _require(
        NODE_MODULES / "@modelcontextprotocol" / "sdk" / "dist" / "esm" / "client" / "index.js",
        "npm package @modelcontextprotocol/sdk",
    )
    return NODE_MODULES


def write_workspace(directory: Path) -> Path:
    """A workspace without servers whose rules allow `edge.echo(text="hi")` and ask about the rest. No rule
    covers registrations: with unsandboxed kernels, a registration no rule decides is allowed (as in
    ipybox 0.9.2), which the node client's `register_mcp_server` relies on."""
    (directory / "ipybox.toml").write_text("[sandbox]\nenabled = false\n" + RULES.format(ask_timeout=10))
    return directory


async def run(*command: str, env: dict[str, str] | None = None, timeout: float = 240) -> tuple[int, str, str]:
    """Run `command` without blocking the event loop (the HTTP endpoint is served in this process)."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"{command[:3]} did not finish within {timeout:g} s", pytrace=False)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


@pytest.fixture(scope="module")
def stdio_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Served by `ipybox mcp` itself, which each stdio client starts (no supervisor runs for it before)."""
    return write_workspace(tmp_path_factory.mktemp("node-stdio"))


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(write_workspace(tmp_path_factory.mktemp("node-http")))
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(request: pytest.FixtureRequest, transport: str, stdio_workspace: Path) -> dict[str, Any]:
    """Where a client connects: `{"transport", "command", "args"}` or `{"transport", "url", "token"}`."""
    if transport == "stdio":
        return {
            "transport": "stdio",
            "command": str(IPYBOX),
            "args": ["mcp", "--workspace", str(stdio_workspace)],
        }
    supervisor: Supervisor = request.getfixturevalue("supervisor")
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    return {"transport": "http", "url": state.mcp_url, "token": state.mcp_token}


async def run_inspector(target: dict[str, Any], tmp_path: Path, *args: str) -> tuple[int, str, str]:
    if target["transport"] == "stdio":
        where = [target["command"], *target["args"]]
    else:
        header = f"Authorization: Bearer {target['token']}"
        where = ["--transport", "http", "--server-url", target["url"], "--header", header]
    # Its catalog of servers goes to tmp_path, not ~/.mcp-inspector.
    env = {"MCP_CATALOG_PATH": str(tmp_path / "mcp-inspector.json")}
    return await run(*inspector(), *where, *args, env=env)


def inspector_json(done: tuple[int, str, str]) -> dict[str, Any]:
    returncode, stdout, stderr = done
    assert returncode == 0, f"inspector exited with {returncode}\nstdout: {stdout}\nstderr: {stderr[-3000:]}"
    result: dict[str, Any] = json.loads(stdout)
    return result


async def test_inspector_lists_the_tools(target: dict[str, Any], tmp_path: Path) -> None:
    result = inspector_json(await run_inspector(target, tmp_path, "--method", "tools/list"))
    tools = {tool["name"]: tool for tool in result["tools"]}
    assert sorted(tools) == TOOLS
    schema = tools["execute_ipython_cell"]["inputSchema"]
    assert schema["required"] == ["code"]
    assert set(schema["properties"]) == {"code", "timeout", "max_output_chars", "kernel"}
    assert tools["register_mcp_server"]["inputSchema"]["properties"]["server_params"]["type"] == "object"


async def test_inspector_executes_a_cell(target: dict[str, Any], tmp_path: Path) -> None:
    args = ["--method", "tools/call", "--tool-name", "execute_ipython_cell"]
    result = inspector_json(await run_inspector(target, tmp_path, *args, "--tool-arg", "code=print(1+1)"))
    assert result["isError"] is False
    assert result["content"] == [{"type": "text", "text": "2"}]

    done = await run_inspector(target, tmp_path, *args, "--tool-arg", "code=1/0")
    result = json.loads(done[1])
    assert result["isError"] is True and "ZeroDivisionError" in result["content"][0]["text"]


async def test_inspector_with_a_wrong_token_is_refused(supervisor: Supervisor, tmp_path: Path) -> None:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None
    target = {"transport": "http", "url": state.mcp_url, "token": "wrong"}
    returncode, stdout, stderr = await run_inspector(target, tmp_path, "--method", "tools/list")
    assert returncode != 0
    assert "register_mcp_server" not in stdout
    # A 401 makes the Inspector turn to OAuth, which it cannot do without a terminal.
    assert '"auth_required"' in stdout + stderr or "401" in stdout + stderr, stdout + stderr


async def test_typescript_sdk_session(target: dict[str, Any]) -> None:
    config = {
        **target,
        "nodeModules": str(sdk_modules()),
        "edge": {"command": sys.executable, "args": [str(EDGE_SERVER)]},
    }
    returncode, stdout, stderr = await run(node(), str(SESSION_SCRIPT), json.dumps(config))
    assert returncode == 0, (
        f"session.mjs exited with {returncode}\nstdout: {stdout}\nstderr: {stderr[-3000:]}"
    )
    summary = json.loads(stdout)

    assert summary["transport"] == target["transport"]
    assert summary["server"]["name"] == "ipybox"
    assert "register_mcp_server" in summary["instructions"]
    assert summary["tools"] == TOOLS
    assert summary["executeSchema"]["required"] == ["code"]

    register = summary["register"]
    assert not register["isError"], register["text"]
    assert register["text"].startswith("mcptools.edge: ") and "echo" in register["text"].split(": ", 1)[1]

    assert summary["echo"] == {"isError": False, "text": "hi"}  # allowed by the workspace's rule
    ask = summary["ask"]  # no rule, and this client cannot answer an elicitation: denied, and said so
    assert ask["text"].startswith("ApprovalRejectedError"), ask["text"]
    assert "Add an allow rule" in ask["text"] and "edge.weather" in ask["text"]

    assert summary["error"]["isError"] and "ZeroDivisionError" in summary["error"]["text"]
    install = summary["install"]
    assert install["isError"] and "pip could not install 'ipybox-no-such-package-xyz'" in install["text"]

    assert summary["before_reset"] == {"isError": False, "text": "42"}
    assert summary["reset"] == {"isError": False, "text": "the kernel was reset"}
    assert summary["after_reset"] == {"isError": False, "text": "False"}
