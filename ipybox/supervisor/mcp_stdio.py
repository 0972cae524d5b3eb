"""`ipybox mcp`: the MCP server over stdio for one workspace (the published `ipybox --workspace DIR` form).

When `ipybox up` already runs the workspace, this process attaches to it; otherwise it runs the workspace
itself for as long as the MCP client keeps it. Nothing but MCP goes to stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import anyio
import tomlkit
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server

from ipybox.config import CONFIG_FILE
from ipybox.limits import unenforceable_defaults
from ipybox.mcp_server.wire import Wire, claim_wire, wire_streams
from ipybox.mcp_server.workspace_mcp import WorkspaceMCP, create_server
from ipybox.sandbox import SandboxPolicy
from ipybox.sandbox.container import unsandboxed_note
from ipybox.supervisor import NotRunningError, Supervisor, read_state
from ipybox.supervisor.supervisor import check_running_sandboxed


def ensure_config(workspace: Path, sandbox: bool, sandbox_config: Path | None) -> None:
    """Create `ipybox.toml` for a workspace that has none, from the command line's sandbox options.

    Whether an existing workspace sandboxes, as `--sandbox` asks, is not read from its file here: `.env`
    and the environment override the file, so the check is made on the configuration that runs
    (`Supervisor(require_sandbox=True)`, `check_running_sandboxed`).
    """
    path = workspace / CONFIG_FILE
    if path.exists():
        if sandbox or sandbox_config:
            print(f"ipybox: {path} exists: its [sandbox] table applies, not --sandbox", file=sys.stderr)
        return
    document = tomlkit.document()
    document.add(tomlkit.comment("Created by `ipybox mcp`; see ipybox.toml.example for every option."))
    table = tomlkit.table()
    table.add("enabled", sandbox)
    if sandbox_config is not None:
        policy = SandboxPolicy.from_file(sandbox_config)
        for key, value in json.loads(policy.model_dump_json(by_alias=True, exclude_defaults=True)).items():
            table.add(key, value)
    document.add("sandbox", table)
    lifted = unenforceable_defaults(sandboxed=sandbox or sandbox_config is not None)
    if lifted:
        # A default this machine can't enforce would stop the workspace: lifted here, in the file, with why.
        limits = tomlkit.table()
        for name, why in lifted.items():
            limits.add(tomlkit.comment(f"not enforceable here: {why}"))
            limits.add(name, "unlimited")
        kernel = tomlkit.table(is_super_table=True)
        kernel.add("limits", limits)
        document.add("kernel", kernel)
    path.write_text(tomlkit.dumps(document))


async def serve_stdio(
    workspace: Path, sandbox: bool = False, sandbox_config: Path | None = None
) -> int | None:
    """Serve MCP on stdin/stdout until the client closes them, or a signal (SIGINT, SIGTERM, SIGHUP) asks
    this process to stop: then what it runs is stopped (later signals are ignored while it stops).

    Claude Code, for one, ends an MCP server with SIGINT, SIGTERM 100 ms later and SIGKILL 400 ms after that;
    killed by the SIGTERM, the process left its workspace's `state.json` and run directory behind until the
    workspace next started.

    Returns:
        The signal that stopped it, if one did (`None`: the client closed stdin).
    """
    wire = claim_wire()  # before any child process starts, so none inherits the client's pipes
    ensure_config(workspace, sandbox, sandbox_config)
    require_sandbox = sandbox or sandbox_config is not None
    serving = asyncio.current_task()
    assert serving is not None
    with _stopping_on_signals(serving) as signalled:
        supervisor: Supervisor | None = None
        mcp: WorkspaceMCP | None = None
        try:
            try:
                state = read_state(workspace)
            except NotRunningError:
                # Raises ConfigError, before anything starts, when --sandbox meets a configuration (file,
                # .env or environment) that turns the sandbox off.
                supervisor = Supervisor(workspace, serve_mcp=False, require_sandbox=require_sandbox)
                # ipybox's container image runs kernels unsandboxed by default: said, never silent.
                if (note := unsandboxed_note(supervisor.config.sandbox.enabled)) is not None:
                    print(note, file=sys.stderr)
                await supervisor.start()
            else:
                if require_sandbox:
                    await check_running_sandboxed(state)
            mcp = create_server(workspace)
            async with mcp:
                await _serve(mcp.server, wire)
        except asyncio.CancelledError:
            if not signalled:
                raise
            serving.uncancel()  # the signal's cancellation ends serving, not the stop that follows
        finally:
            if mcp is not None:
                await mcp.aclose()
            if supervisor is not None:
                await supervisor.stop()
    return signalled[0] if signalled else None


@contextlib.contextmanager
def _stopping_on_signals(task: asyncio.Task[None]) -> Iterator[list[int]]:
    """While open, the first SIGINT, SIGTERM or SIGHUP cancels `task` and is added to the list yielded;
    later ones are ignored. Without signal handlers (not the main thread, no Unix), nothing changes."""
    loop = asyncio.get_running_loop()
    received: list[int] = []
    signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def on_signal(signum: int) -> None:
        if not received:
            received.append(signum)
            task.cancel()

    installed: list[int] = []
    try:
        for signum in signals:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
    except (ValueError, RuntimeError, NotImplementedError):
        pass  # not the main thread's loop: the caller's signal handling applies
    try:
        yield received
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def _serve(server: MCPServer, wire: Wire | None) -> None:
    if wire is None:
        await server.run_stdio_async()
        return
    # `run_stdio_async` with streams of our own: mcp takes them in `stdio_server` but has no public way to
    # hand them to an MCPServer, hence its low-level server. Ours are duck-typed (`async for`, write, flush).
    lowlevel = server._lowlevel_server
    async with (
        wire_streams(wire) as (stdin, stdout),
        stdio_server(cast("anyio.AsyncFile[str]", stdin), cast("anyio.AsyncFile[str]", stdout)) as (
            read,
            write,
        ),
    ):
        await lowlevel.run(read, write, lowlevel.create_initialization_options())
