"""ipybox's MCP server (stdio) per protocol revision, through the mcp package's `mcp.Client` (ours only:
the published 0.9.2 speaks no 2026-07-28):

- `mcp.legacy.execute_x1` / `mcp.modern.execute_x1`: `execute_ipython_cell("x = 1")` round trip with
  `mode="legacy"` (the initialize handshake, a session kernel) and the default mode (2026-07-28: each
  call a request of its own, the kernel kept by the process), in blocks alternating between the two
  clients so both see the machine in the same state.
- `mcp.legacy.ask_cell` / `mcp.modern.ask_cell`: a cell whose one tool call (server-everything's `echo`)
  a rule answers with `ask`, accepted by the client's elicitation callback: mid-call on the handshake
  revision, an `InputRequiredResult` and a retry that resumes the paused cell on 2026-07-28.
- `mcp.allowed_cell`: the same cell with the call allowed by a rule (no ask): the difference to the two
  above is what asking costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _protocol import Stopwatch, emit, log, parse_args
from _servers import server_params

CALLS_PER_RUN = 10
SETTLE_S = 3.0

RULES = """
[approval]
default = "ask"

[[approval.rules]]
id = "echo-allowed"
server = "everything"
tool = "echo"
match = [{{ server = "everything", tool = "echo", args = {{ message = "allowed" }} }}]
decision = "allow"
"""


def _cell(message: str) -> str:
    return f"from mcptools.everything import echo\nprint(echo.run(echo.Params(message={message!r})))"


def _text(result: Any) -> str:
    return "".join(getattr(item, "text", "") for item in result.content)


async def _accept(context: Any, params: Any) -> Any:
    import mcp_types as types

    return types.ElicitResult(action="accept", content={"allow": True})


async def main() -> None:
    from mcp import Client, StdioServerParameters

    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1)
    ipybox = Path(sys.executable).parent / "ipybox"
    with tempfile.TemporaryDirectory(prefix="bench-mcp-revisions-") as tmp:
        workspace = Path(tmp)
        server = server_params("everything", workspace / "servers")
        (workspace / "ipybox.toml").write_text(
            f"[servers.everything]\ncommand = {json.dumps(server['command'])}\n"
            f"args = {json.dumps(server['args'])}\n" + RULES.format()
        )
        params = StdioServerParameters(command=str(ipybox), args=["mcp", "--workspace", str(workspace)])
        async with contextlib.AsyncExitStack() as stack:
            legacy = await stack.enter_async_context(
                Client(params, mode="legacy", elicitation_callback=_accept)
            )
            modern = await stack.enter_async_context(Client(params, elicitation_callback=_accept))
            log(f"revisions: legacy {legacy.protocol_version}, default {modern.protocol_version}")
            clients = {"legacy": legacy, "modern": modern}
            for client in clients.values():
                await client.call_tool("execute_ipython_cell", {"code": "x = 1"})
                first = await client.call_tool("execute_ipython_cell", {"code": _cell("allowed")})
                if first.is_error:
                    raise RuntimeError(f"the allowed cell failed: {_text(first)[:2000]}")
            await asyncio.sleep(SETTLE_S)

            watches = {
                f"{name}.{what}": Stopwatch() for name in clients for what in ("execute_x1", "ask_cell")
            }
            allowed = Stopwatch()
            statuses: set[str] = set()
            for block in range(args.warmup + args.runs):
                keep = block >= args.warmup
                for name, client in clients.items():
                    for _ in range(CALLS_PER_RUN):
                        with watches[f"{name}.execute_x1"].measure(keep=keep):
                            await client.call_tool("execute_ipython_cell", {"code": "x = 1"})
                    for _ in range(CALLS_PER_RUN // 2):
                        with watches[f"{name}.ask_cell"].measure(keep=keep):
                            result = await client.call_tool("execute_ipython_cell", {"code": _cell("asked")})
                        statuses.add("ok" if not result.is_error else f"failed: {_text(result)[:200]}")
                for _ in range(CALLS_PER_RUN // 2):
                    with allowed.measure(keep=keep):
                        await modern.call_tool("execute_ipython_cell", {"code": _cell("allowed")})
            status = "ok" if statuses == {"ok"} else "; ".join(sorted(statuses))
            for key, watch in watches.items():
                emit(f"mcp.{key}", watch.samples_ms, status=status)
            emit("mcp.allowed_cell", allowed.samples_ms)


if __name__ == "__main__":
    asyncio.run(main())
