"""ipybox's MCP server (stdio), measured through the mcp package's client (`stdio_client` + `ClientSession`):

- `mcp.spawn_to_initialized`: server process start until `initialize()` returns, fresh workspace each sample.
- `mcp.execute_x1`: `execute_ipython_cell(code="x = 1")` round trip, many samples in one session, taken
  after the first call has settled (SETTLE_S), so a spare kernel starting in the background is not timed.
- `mcp.reset`: `reset()` round trip, same session.
- `mcp.register`: `register_mcp_server` of server-everything under a fresh name each sample (last, so the
  servers it adds cannot slow the other metrics).

The server is `<this venv>/bin/ipybox [SUBCOMMAND] --workspace DIR`: ours needs `--subcommand mcp`, the
peer's (0.9.2) MCP server is the bare `ipybox --workspace DIR`. Works with mcp 1.x and 2.x clients.
With `--with-floor` (ours only), also our SDK's `CodeExecutor.execute("x = 1")` (`mcp.floor.execute_x1`),
in blocks alternating with the MCP ones, so that both see the machine in the same state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _protocol import Stopwatch, emit, log, parse_args, summarize_statuses
from _servers import server_params

EXECUTES_PER_RUN = 10  # execute_x1 samples per --runs unit
SETTLE_S = 3.0  # after the first call, before the execute_x1 samples (both sides)


def _params(subcommand: str | None, workspace: Path) -> Any:
    from mcp import StdioServerParameters

    ipybox = Path(sys.executable).parent / "ipybox"
    args = [subcommand] if subcommand else []
    return StdioServerParameters(command=str(ipybox), args=[*args, "--workspace", str(workspace)])


def _text(result: Any) -> str:
    return "".join(getattr(item, "text", "") for item in result.content)


async def _call(session: Any, name: str, arguments: dict[str, Any]) -> str:
    result = await session.call_tool(name, arguments)
    is_error = getattr(result, "is_error", None)
    if is_error is None:
        is_error = getattr(result, "isError", False)
    if is_error:
        raise RuntimeError(f"{name} failed: {_text(result)[:2000]}")
    return _text(result)


async def spawn_to_initialized(subcommand: str | None, runs: int, warmup: int, errlog: Any) -> list[float]:
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    watch = Stopwatch()
    for i in range(warmup + runs):
        with tempfile.TemporaryDirectory(prefix="bench-mcp-spawn-") as tmp:
            params = _params(subcommand, Path(tmp))
            start = time.perf_counter()
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                if i >= warmup:
                    watch.samples_ms.append((time.perf_counter() - start) * 1000.0)
    return watch.samples_ms


REGISTER_RULE = """[[approval.rules]]
id = "bench-registers-servers"
server = "ipybox"
tool = "register_mcp_server"
decision = "allow"
"""


async def one_session(
    subcommand: str | None, runs: int, warmup: int, errlog: Any, with_floor: bool = False
) -> None:
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    from ipybox import CodeExecutor

    with tempfile.TemporaryDirectory(prefix="bench-mcp-session-") as tmp:
        workspace = Path(tmp)
        if subcommand is not None:
            # Ours decides registrations by the workspace's rules (default: ask, which this client can't
            # answer); the published ipybox registers without asking.
            (workspace / "ipybox.toml").write_text(REGISTER_RULE)
        async with contextlib.AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(
                stdio_client(_params(subcommand, workspace), errlog=errlog)
            )
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            tools = sorted(tool.name for tool in (await session.list_tools()).tools)
            log(f"tools: {tools}")
            executor = None
            if with_floor:  # unsandboxed, like the MCP server's kernels by default
                floor_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-mcp-floor-"))
                executor = await stack.enter_async_context(CodeExecutor(working_dir=floor_dir, sandbox=False))

            # The first call may start the session's kernel; it is reported, not a sample.
            started = time.perf_counter()
            await _call(session, "execute_ipython_cell", {"code": "x = 1"})
            first_ms = (time.perf_counter() - started) * 1000.0
            if executor is not None:
                await executor.execute("x = 1")
            # Steady state: a server that keeps spare kernels starts a replacement now, in the background;
            # samples taken during that start would measure two cores shared with it, not the round trip.
            await asyncio.sleep(SETTLE_S)

            execute, floor = Stopwatch(), Stopwatch()
            for block in range(warmup + runs):
                keep = block >= warmup
                for _ in range(EXECUTES_PER_RUN):
                    with execute.measure(keep=keep):
                        await _call(session, "execute_ipython_cell", {"code": "x = 1"})
                if executor is not None:
                    for _ in range(EXECUTES_PER_RUN):
                        with floor.measure(keep=keep):
                            await executor.execute("x = 1")
            check = await _call(session, "execute_ipython_cell", {"code": "print(x)"})
            status = "ok" if check.strip() == "1" else f"unexpected output {check.strip()[:80]!r}"
            emit(
                "mcp.execute_x1",
                execute.samples_ms,
                status=status,
                info={"first_call_ms": round(first_ms, 1)},
            )
            if executor is not None:
                emit("mcp.floor.execute_x1", floor.samples_ms)

            reset = Stopwatch()
            statuses: list[str] = []
            for i in range(warmup + runs):
                with reset.measure(keep=i >= warmup):
                    await _call(session, "reset", {})
                after = await _call(session, "execute_ipython_cell", {"code": "print('x' in dir())"})
                statuses.append(
                    "cleared" if after.strip() == "False" else f"not cleared: {after.strip()[:80]!r}"
                )
                await _call(session, "execute_ipython_cell", {"code": "x = 1"})
            emit("mcp.reset", reset.samples_ms, status=summarize_statuses(statuses[warmup:]))

            register = Stopwatch()
            tool_counts: list[int] = []
            for i in range(warmup + runs):
                name = f"everything{i}"
                params = server_params("everything", workspace / "servers")
                with register.measure(keep=i >= warmup):
                    text = await _call(
                        session, "register_mcp_server", {"server_name": name, "server_params": params}
                    )
                modules = [p for p in (workspace / "mcptools" / name).glob("*.py") if p.stem != "__init__"]
                tool_counts.append(len(modules))
                if not modules:
                    raise RuntimeError(f"register_mcp_server({name}) generated nothing: {text[:500]}")
            emit("mcp.register", register.samples_ms, info={"generated_modules": tool_counts[-1]})


async def main() -> None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument(
        "--subcommand", default=None, help="ipybox subcommand serving MCP over stdio (ours: mcp)"
    )
    extra.add_argument(
        "--with-floor", action="store_true", help="also our SDK's execute, alternating with the MCP calls"
    )
    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1, extra=extra)
    # The servers' own logs (the peer's are verbose) go to a file in the scratch dir, not our stderr.
    with open(Path.cwd() / "mcp_server.servers.log", "w") as errlog:
        spawn = await spawn_to_initialized(args.subcommand, args.runs, args.warmup, errlog)
        emit("mcp.spawn_to_initialized", spawn)
        await one_session(args.subcommand, args.runs, args.warmup, errlog, args.with_floor)


if __name__ == "__main__":
    asyncio.run(main())
