"""`ipybox mcp`: the MCP server over stdio for one workspace (the published `ipybox --workspace DIR` form).

When `ipybox up` already runs the workspace, this process attaches to it; otherwise it runs the workspace
itself for as long as the MCP client keeps it. Nothing but MCP goes to stdout.

Nothing is written into the directory until it is used as a workspace. A client's health check (`claude
mcp list`: initialize, then `tools/list`) and anything else that only looks (`tools/list`, `ping`,
`resources/list`) writes no file: the instructions and tool descriptions come from the configuration the
workspace will run with, read without writing (`planned_config`). The directory is used when

- a tool is called (any `tools/call`: a cell, a registration, a search, a saved action): the workspace
  starts before the call runs (`ipybox.toml` created from the options when missing, `.ipybox/` with its own
  `.gitignore`, the gateway, the servers), and the call waits for it; or
- it is a workspace already (it has an `ipybox.toml`, e.g. from `ipybox init`): it starts at once, in the
  background, while the client initializes, so the first call finds it running.

When the workspace can't run as asked (`--sandbox` where the configuration turns the sandbox off, an
`ipybox.toml` that does not load, a `--sandbox-config` that does not load), the reason is the JSON-RPC
error of every request, `initialize` included: an MCP client shows it where it shows that the server
failed (`claude mcp list`: `✘ Failed to connect — -32603: <reason>`), which an exit with the reason on
stderr would not (Claude Code shows `Connection closed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import anyio
import tomlkit
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server

from ipybox.config import CONFIG_FILE, ConfigError, WorkspaceConfig, load_config
from ipybox.config.loading import load_config_text
from ipybox.errors import WorkspaceError
from ipybox.lifecycle import cancel_and_wait, task_scope
from ipybox.limits import unenforceable_defaults
from ipybox.mcp_server.wire import Wire, claim_wire, wire_streams
from ipybox.mcp_server.workspace_mcp import WorkspaceMCP, create_server
from ipybox.sandbox import SandboxPolicy
from ipybox.sandbox.container import unsandboxed_note
from ipybox.supervisor import NotRunningError, Supervisor, read_state
from ipybox.supervisor.sandbox_check import check_sandboxed
from ipybox.supervisor.supervisor import check_running_sandboxed

logger = logging.getLogger(__name__)

# The JSON-RPC error code of a request refused because the server can't serve (`InternalError`).
REFUSED = -32603


class ServeRefusedError(WorkspaceError, RuntimeError):
    """`ipybox mcp` could not serve the workspace and answered every request with why (already said on
    stderr too); raised once the client closed stdin, so that the process exits non-zero."""


def config_text(sandbox: bool, sandbox_config: Path | None) -> str:
    """The `ipybox.toml` that `ipybox mcp` creates for a workspace without one, from its sandbox options.

    Raises:
        ValueError: `sandbox_config` does not load (`SandboxPolicy.from_file`).
    """
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
    return tomlkit.dumps(document)


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
    text = config_text(sandbox, sandbox_config)
    with contextlib.suppress(FileExistsError), path.open("x") as file:  # never over one made meanwhile
        file.write(text)


def planned_config(workspace: Path, sandbox: bool, sandbox_config: Path | None) -> WorkspaceConfig:
    """The configuration the workspace will run with, read without writing anything: its `ipybox.toml`,
    or the one `ensure_config` would create, with `.env` and the environment over it.

    Raises:
        ConfigError: It does not load, or `--sandbox` (`sandbox`, `sandbox_config`) meets one that turns
            the sandbox off.
        ValueError: `sandbox_config` does not load.
    """
    path = workspace / CONFIG_FILE
    if path.exists():
        config = load_config(path)
    else:
        config = load_config_text(path, config_text(sandbox, sandbox_config))
    if sandbox or sandbox_config is not None:
        check_sandboxed(config)
    return config


class _LazyWorkspace:
    """The workspace this process runs, started by the first `start()` (see the module): a call waits for
    it; a start that failed is tried again by the next call (the user may have fixed what failed)."""

    def __init__(
        self, workspace: Path, sandbox: bool, sandbox_config: Path | None, tasks: asyncio.TaskGroup
    ) -> None:
        self.workspace = workspace
        self.sandbox = sandbox
        self.sandbox_config = sandbox_config
        self.supervisor: Supervisor | None = None
        # The start runs in the server's task group (it outlives this object's calls); its outcome is a
        # future the calls wait for, so that a failed start does not end the group.
        self._tasks = tasks
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None

    def start_soon(self) -> None:
        if self._starting is None:
            starting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._starting = starting
            self._task = self._tasks.create_task(self._run_start(starting), name="ipybox-mcp-workspace")

    async def _run_start(self, starting: asyncio.Future[None]) -> None:
        try:
            await self._start()
        except asyncio.CancelledError:
            starting.cancel()
            raise
        except Exception as e:
            # Said on stderr (the next tool call gets the reason and tries again), and marked retrieved so
            # that asyncio does not report it again when no call waits for it.
            logger.warning("the workspace could not start (the next tool call tries again): %s", e)
            starting.set_exception(e)
            starting.exception()
        else:
            starting.set_result(None)

    async def start(self) -> None:
        """Start the workspace unless it runs (or started); what failed is a `ToolError`."""
        self.start_soon()
        starting = self._starting
        assert starting is not None
        try:
            await asyncio.shield(starting)  # a cancelled call leaves the start to the next one
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if self._starting is starting:
                self._starting = None
            raise ToolError(f"the workspace {self.workspace} could not start: {e}") from None

    async def _start(self) -> None:
        try:
            state = read_state(self.workspace)
        except NotRunningError:
            pass
        else:  # `ipybox up` runs it (started meanwhile): attach
            if self.sandbox or self.sandbox_config is not None:
                await check_running_sandboxed(state)
            return
        await asyncio.to_thread(ensure_config, self.workspace, self.sandbox, self.sandbox_config)
        supervisor = self.supervisor
        if supervisor is None:
            require_sandbox = self.sandbox or self.sandbox_config is not None
            # Raises ConfigError, before anything starts, when --sandbox meets a configuration (file, .env
            # or environment) that turns the sandbox off.
            supervisor = self.supervisor = Supervisor(
                self.workspace, serve_mcp=False, require_sandbox=require_sandbox
            )
            # ipybox's container image runs kernels unsandboxed by default: said, never silent.
            if (note := unsandboxed_note(supervisor.config.sandbox.enabled)) is not None:
                print(note, file=sys.stderr)
        try:
            await supervisor.start()
        except BaseException:
            self.supervisor = None  # a service starts once: the next try makes a new one
            raise
        logger.info("ipybox mcp started the workspace %s", self.workspace)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self.supervisor is not None:
            await self.supervisor.stop()


async def serve_stdio(
    workspace: Path, sandbox: bool = False, sandbox_config: Path | None = None
) -> int | None:
    """Serve MCP on stdin/stdout until the client closes them, or a signal (SIGINT, SIGTERM, SIGHUP) asks
    this process to stop: then what it runs is stopped (later signals are ignored while it stops). The
    workspace starts when it is used (see the module); when it can't run as asked, every request is
    answered with the reason.

    Claude Code, for one, ends an MCP server with SIGINT, SIGTERM 100 ms later and SIGKILL 400 ms after that;
    killed by the SIGTERM, the process left its workspace's `state.json` and run directory behind until the
    workspace next started.

    Returns:
        The signal that stopped it, if one did (`None`: the client closed stdin).

    Raises:
        ServeRefusedError: The workspace could not run as asked (after the client closed stdin).
    """
    wire = claim_wire()  # before any child process starts, so none inherits the client's pipes
    serving = asyncio.current_task()
    assert serving is not None
    with _stopping_on_signals(serving) as signalled:
        async with task_scope() as tasks:
            return await _serve_workspace(workspace, sandbox, sandbox_config, wire, tasks, serving, signalled)


async def _serve_workspace(
    workspace: Path,
    sandbox: bool,
    sandbox_config: Path | None,
    wire: Wire | None,
    tasks: asyncio.TaskGroup,
    serving: asyncio.Task[Any],
    signalled: list[int],
) -> int | None:
    require_sandbox = sandbox or sandbox_config is not None
    lazy: _LazyWorkspace | None = None
    mcp: WorkspaceMCP | None = None
    try:
        try:
            state = read_state(workspace)
        except NotRunningError:
            state = None
        try:
            if state is not None:
                if require_sandbox:
                    await check_running_sandboxed(state)
                config = None  # the running workspace's file, loaded by the server
            else:
                config = planned_config(workspace, sandbox, sandbox_config)
        except (ConfigError, ValueError, NotRunningError) as e:
            await _refuse(str(e), wire)
            raise ServeRefusedError(str(e)) from None
        if state is None:
            lazy = _LazyWorkspace(workspace, sandbox, sandbox_config, tasks)
            if (workspace / CONFIG_FILE).exists():
                lazy.start_soon()  # a workspace already: no reason to make the first call wait
        mcp = create_server(workspace, config=config, before_call=lazy.start if lazy is not None else None)
        async with mcp:
            await _serve(mcp.server, wire)
    except asyncio.CancelledError:
        if not signalled:
            raise
        serving.uncancel()  # the signal's cancellation ends serving, not the stop that follows
    finally:
        if mcp is not None:
            await mcp.aclose()
        if lazy is not None:
            await lazy.stop()
    return signalled[0] if signalled else None


class _LineWriter(Protocol):
    async def write(self, text: str, /) -> Any: ...
    async def flush(self) -> Any: ...


async def _refuse(reason: str, wire: Wire | None) -> None:
    """Answer every request with the JSON-RPC error `reason` until the client closes stdin."""
    print(f"ipybox: {reason}", file=sys.stderr)
    async with _lines(wire) as (incoming, outgoing):
        async for line in incoming:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict) or "method" not in message or "id" not in message:
                continue  # a notification or a response: nothing to answer
            error = {"code": REFUSED, "message": f"ipybox: {reason}"}
            answer = {"jsonrpc": "2.0", "id": message["id"], "error": error}
            await outgoing.write(json.dumps(answer) + "\n")
            await outgoing.flush()


@contextlib.asynccontextmanager
async def _lines(wire: Wire | None) -> AsyncIterator[tuple[AsyncIterator[str], _LineWriter]]:
    if wire is not None:
        async with wire_streams(wire) as (incoming, outgoing):
            yield incoming, outgoing
        return
    stdin = anyio.wrap_file(sys.stdin)
    stdout = anyio.wrap_file(sys.stdout)
    yield cast("AsyncIterator[str]", stdin), cast("_LineWriter", stdout)


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
