"""`Supervisor`: what `ipybox up` runs for a workspace.

It runs the tool server (approving every call with the workspace's rules), the kernel gateway with
sandboxed kernels and a warm pool of them, the filtering proxy when the sandbox allows domains, the
reconciler that applies edits of `ipybox.toml`, the control endpoint through which the CLI, attached
applications and `ipybox approve` reach it, and the web console where a person answers `ask`s. It restarts a gateway or tool server that dies, and on SIGTERM, Ctrl-C
or `ipybox down` stops everything it started.

Composition: `start()` enters each part once into one `contextlib.AsyncExitStack` (the lock, the log,
the run directory, the tool server, the kernels, the control endpoint, the MCP endpoint, the watchers);
`stop()`, or a failure anywhere in `start()`, closes them in reverse order. The watchers (the reconciler
following edits, the gateway and tool server restarters, the MCP session sweeper) run in one
`asyncio.TaskGroup`: one that fails stops the workspace, and `wait()` raises it as one error. Who holds
which kernel, and who answers its `ask`s, is the `LeaseTable`'s.

Progress: `progress` (a `ProgressHub`) carries the events of long operations (`ipybox.progress`). While
`start(progress=...)` runs, its listener sees the parts come up: `tool server`, `gateway` (its pid),
`kernels` (the warm pool, `k of N` as kernels become ready; polled every 0.1 s while starting only),
`endpoints` (what is served) and each `server <name>` (the reconciler's steps). `apply_server(name,
progress=...)` passes on the events of that server alone. Nothing waits for a listener: `up` takes as long
with one as without (the warm pool is not waited for; its last event then says how many are ready).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import secrets
import signal
import tempfile
import time
import tomllib
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from ipybox.approval.ask_events import (
    AnswerMessage,
    AnswerResult,
    AnswerView,
    AskClosedMessage,
    AskOpenedMessage,
    AskQuestion,
    AskView,
    message_of,
)
from ipybox.approval.asks import AskAnswer, AskBoard, AskEvent, AskOpened, PendingAsk, Subscription
from ipybox.approval.channel import Answers, ApprovalChannel
from ipybox.approval.links import PathLink, path_links
from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.asgi_server import EmbeddedServer
from ipybox.codeact.actions import read_actions
from ipybox.codeact.analysis import analyse_action
from ipybox.codeact.layout import action_tool_name, gentools_dir
from ipybox.config import CONFIG_FILE, ConfigError, ConfigProblem, WorkspaceConfig, load_config
from ipybox.config.executables import LiveKernels, ServerCodeGuard
from ipybox.config.loading import MAX_NESTING, setting_source
from ipybox.config.positions import KeyPath, Position, key_positions, too_deep
from ipybox.config.rule_writer import write_answer_rule
from ipybox.config.sections import KernelSection
from ipybox.console.endpoint import ConsoleEndpoint
from ipybox.display_text import PrintableFormatter
from ipybox.executor.kernel_setup import start_kernel_gateway, workspace_kernel_setup
from ipybox.in_kernel.tool_runner import TOKEN_ENV
from ipybox.kernels.gateway import KernelGateway, describe_exit
from ipybox.kernels.kernel_client import KernelClient
from ipybox.kernels.kernel_connection import GatewayError, GatewayUnreachableError, log_tail
from ipybox.kernels.pool import KernelPool, PoolStoppedError
from ipybox.mcp_apigen.package import remove_stale_work_dirs
from ipybox.mcp_client.params import ServerParams
from ipybox.progress import PartTimer, Progress, ProgressEvent, ProgressHub, ProgressStep, server_part
from ipybox.reconcile.reconciler import Reconciler
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, Verdict
from ipybox.running.control_client import ControlClient
from ipybox.running.state import (
    StateLogHandler,
    StatePaths,
    SupervisorLock,
    SupervisorState,
    forget_run_dirs,
    record_run_dirs,
    remove_leftovers,
    write_state,
)
from ipybox.running.status import (
    ActionStatus,
    CallerId,
    CallerToken,
    GatewayStatus,
    KernelId,
    KernelLeased,
    LeaseId,
    PoolStatus,
    ReconcilerStatus,
    ServerOutcome,
    ToolServerStatus,
    WorkspaceStatus,
)
from ipybox.sandbox import DomainProxy, SandboxPolicy
from ipybox.supervisor.control_app import control_app
from ipybox.supervisor.kernel_health import KernelHealth
from ipybox.supervisor.leases import LeaseTable
from ipybox.supervisor.mcp_endpoint import MCPEndpoint
from ipybox.supervisor.outcome import server_outcome
from ipybox.supervisor.watchers import Watcher, Watchers
from ipybox.tool_server.tool_server import ToolServer

logger = logging.getLogger("ipybox.supervisor")

WORKSPACE_ENV = "IPYBOX_WORKSPACE"
# Claims a lease makes across gateway restarts before it gives up (each waits for one restart).
_LEASE_ATTEMPTS = 3
# Seconds code run by `run_in_fresh_kernel` (a check of agent-written modules) may run.
_CHECK_TIMEOUT = 60
# Why the asks of a kernel that checks agent-written code are refused (nobody is asked: a person would be
# asked about calls of code nobody chose to run, and the check would wait for the answer).
PARSER_CHECK_REFUSAL = "checking an output parser asks nobody: tool calls are refused while it is checked"
CHECK_REFUSAL = (
    "checking agent-written code (a code action being saved or described) asks nobody: tool calls are "
    "refused while it is checked"
)
# How often the warm pool is looked at while `start()` reports it (it has no events of its own).
_POOL_PROGRESS_INTERVAL = 0.1


class Supervisor:
    """Runs a workspace until stopped.

    Args:
        workspace: The workspace directory (with `ipybox.toml`).
        serve_mcp: Serve MCP over streamable HTTP as `[endpoints] mcp` says (off for `ipybox mcp`, which
            serves it over stdio).
        require_sandbox: The command line asked for the sandbox (`--sandbox`): the configuration this
            supervisor loads, and runs, must enable it (`ConfigError` here naming what turned it off: the
            file, `.env` or the environment), and an edit that turns it off while running is refused (the
            kernels keep running sandboxed; `ipybox status` shows the refusal).

    Example:
        ```python
        supervisor = Supervisor(Path("example-workspace"))  # raises ConfigError
        with supervisor.handle_signals():
            await supervisor.start()  # raises AlreadyRunningError, SandboxUnavailableError
            try:
                await supervisor.wait()  # until `ipybox down`, SIGTERM or Ctrl-C
            finally:
                await supervisor.stop()
        ```
    """

    def __init__(self, workspace: Path, *, serve_mcp: bool = True, require_sandbox: bool = False) -> None:
        self.workspace = workspace.resolve()
        self.serve_mcp = serve_mcp
        self.require_sandbox = require_sandbox
        # Loaded once: what is checked here is what runs (the reconciler applies this same object).
        self.config: WorkspaceConfig = load_config(self.workspace / CONFIG_FILE)
        if require_sandbox:
            check_sandboxed(self.config)
        self.paths = StatePaths(self.config.resolve(self.config.workspace.state_dir))
        self.started_at = datetime.now(UTC)
        self._lock = SupervisorLock(self.paths)
        self._run_dir: Path | None = None
        self._control_token = secrets.token_urlsafe(32)
        self._gateway_token = secrets.token_urlsafe(32)
        self._mcp: MCPEndpoint | None = None
        self._console: ConsoleEndpoint | None = None
        self._positions: tuple[tuple[int, int], dict[KeyPath, Position]] | None = None  # ipybox.toml's keys
        self.board = AskBoard()
        self._shutdown = asyncio.Event()
        self._parts: contextlib.AsyncExitStack | None = None  # what start() entered, closed by stop()
        self._watchers = Watchers(on_failure=self.request_shutdown)
        self._stopping = False
        self._ready = False
        self.tool_server: ToolServer | None = None
        self.gateway: KernelGateway | None = None
        self.pool: KernelPool | None = None
        self.proxy: DomainProxy | None = None
        self.reconciler: Reconciler | None = None
        self.approver: WorkspaceApprover | None = None
        self.leases = LeaseTable()
        self.health = KernelHealth(self)  # kernels' usage for the status; the idle kernel reaper
        self.restarts: dict[str, int] = {"gateway": 0, "tool_server": 0}
        self._kernels_lock = asyncio.Lock()
        self.kernel_generation = 0  # kernels recycled or restarted this many times
        # The sandbox policy each version of the gateway's kernel spec confines kernels by (`None`:
        # unsandboxed), newest last: it changes when what the host executes does (see `_protect_servers`).
        self._spec_policies: list[SandboxPolicy | None] = []
        self.guard = ServerCodeGuard(
            self.workspace,
            self._known_servers,
            self._live_kernels,
            environ={**os.environ, WORKSPACE_ENV: str(self.workspace)},
            dotenv_path=self.workspace / ".env",
        )
        self._gateway_failure: str | None = None  # why the gateway is down, while it is
        self.progress = ProgressHub()
        self._timer = PartTimer()

    @property
    def run_dir(self) -> Path:
        assert self._run_dir is not None
        return self._run_dir

    async def start(self, progress: Progress | None = None) -> None:
        """Start everything and write `state.json`. On any failure, what was started is stopped again
        (in reverse order) and the one error that stopped it is raised.

        Args:
            progress: Called with each part's steps while starting (see the module docstring).

        Raises:
            AlreadyRunningError: A supervisor already runs for this workspace.
            SandboxUnavailableError: The sandbox is enabled and this machine can't provide it.
        """
        unsubscribe = self.progress.subscribe(progress) if progress is not None else None
        parts = contextlib.AsyncExitStack()
        pool_progress: list[asyncio.Task[None]] = []
        try:
            await self._enter_parts(parts, pool_progress)
        except BaseException:
            self._stopping = True
            for task in pool_progress:
                task.cancel()
            with contextlib.suppress(Exception):  # the error that stopped the start is the one to see
                await parts.aclose()
            raise
        finally:
            await self._end_pool_progress(pool_progress)
            if unsubscribe is not None:
                unsubscribe()
        self._parts = parts
        logger.info("workspace %s is up (pid %d)", self.workspace, os.getpid())

    async def _enter_parts(
        self, parts: contextlib.AsyncExitStack, pool_progress: list[asyncio.Task[None]]
    ) -> None:
        self._lock.acquire()
        parts.callback(self._lock.release)
        parts.callback(_remove_state, self.paths)
        parts.enter_context(_logging_to(self.paths))
        parts.callback(lambda: logger.info("workspace %s is down", self.workspace))
        self._remove_leftovers()
        parts.callback(forget_run_dirs, self.paths)  # once the run directory is gone (callbacks unwind)
        run_dir = parts.enter_context(
            tempfile.TemporaryDirectory(prefix="ipybox-ws-", ignore_cleanup_errors=True)
        )
        self._run_dir = Path(run_dir)
        self._record_run_dirs()
        audit = AuditLog(self.paths.audit)
        audit.arm_reserve()  # before a kernel can fill the disk: decisions are recorded on a full one
        self.approver = WorkspaceApprover(
            self.config.approval,
            audit,
            self.leases.answerer,
            board=self.board,
            session_of=lambda caller: self.leases.lease_of(CallerId(caller)),
            write_rule=self._write_answer_rule,
            console=lambda: self.console_url,
            links=self._path_links,
            refusal_of=self.leases.refusal,
        )
        parts.push_async_callback(self._stop_tool_server)
        with self._reporting("tool server"):
            await self._start_tool_server()
        assert self.tool_server is not None
        self.reconciler = Reconciler(
            self.workspace,
            self.tool_server.servers,
            self,
            run_check=self.run_in_fresh_kernel,
            progress=self.progress.emit,
        )
        parts.push_async_callback(self._stop_kernels, end_leases=True)
        parts.push_async_callback(self.reconciler.close)  # its parser checks first: they use kernels
        with self._reporting("gateway") as gateway:
            await self._start_kernels()
            gateway.append(f"pid {self.gateway.pid if self.gateway is not None else '?'}")
        pool_progress.append(asyncio.create_task(self._report_pool(self.config.kernel.warm_pool)))
        with self._reporting("endpoints") as served:
            control = EmbeddedServer(control_app(self, self._control_token), "ipybox-control")
            parts.push_async_callback(control.stop)
            await control.start(unix_socket=self.run_dir / "control.sock")
            served.append("control")
            self._write_state()
            watchers: list[Watcher] = []
            endpoints = self.config.endpoints
            if endpoints.console:
                console = ConsoleEndpoint(
                    self, endpoints.host, endpoints.console_port, user=getpass.getuser()
                )
                self._console = await parts.enter_async_context(console)
                served.append(f"console {self.console_url}")
            if self.serve_mcp and self.config.endpoints.mcp:
                mcp = MCPEndpoint(self.workspace, self.config.endpoints, self.paths.outputs)
                self._mcp = await parts.enter_async_context(mcp)
                self._write_state()
                watchers.append(mcp.sweep)
                if self.mcp_url is not None:
                    served.append(f"mcp {self.mcp_url}")
        await self.reconciler.apply(self.config)
        watchers += [self.reconciler.watch, self._watch_gateway, self._watch_tool_server, self.health.reap]
        self._watchers.start(watchers)
        parts.push_async_callback(self._watchers.stop)
        self._ready = True
        self._write_state()

    def _emit(self, what: str, step: ProgressStep, detail: str | None = None) -> None:
        self.progress.emit(self._timer.event(what, step, detail))

    @contextlib.contextmanager
    def _reporting(self, what: str) -> Iterator[list[str]]:
        """Emits `what` `starting`, then `ready` with what the body appended (joined by commas), or
        `failed` with why the body raised."""
        self._emit(what, "starting")
        detail: list[str] = []
        try:
            yield detail
        except BaseException as e:
            reason = "interrupted" if isinstance(e, asyncio.CancelledError) else str(e) or type(e).__name__
            self._emit(what, "failed", reason)
            raise
        self._emit(what, "ready", ", ".join(detail) or None)

    async def _report_pool(self, size: int) -> None:
        """Emits the `kernels` part until the warm pool holds `size` ready kernels (`k of N`)."""
        shown = -1
        while True:
            idle = self.pool.idle if self.pool is not None else 0
            if idle >= size:
                self._emit("kernels", "ready", f"{size} of {size}" if size else "no warm pool")
                return
            if idle != shown:
                self._emit("kernels", "starting", f"{idle} of {size}")
                shown = idle
            await asyncio.sleep(_POOL_PROGRESS_INTERVAL)

    async def _end_pool_progress(self, tasks: list[asyncio.Task[None]]) -> None:
        """At the end of `start()`: the `kernels` part ends as it stands (the pool is not waited for)."""
        for task in tasks:
            if task.done():
                continue
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if self._stopping:  # the part that failed says why
                self._emit("kernels", "failed", "stopped: the workspace did not start")
                continue
            size, idle = self.config.kernel.warm_pool, self.pool.idle if self.pool is not None else 0
            if idle >= size:  # filled since it last looked
                self._emit("kernels", "ready", f"{size} of {size}")
                continue
            failures = self.pool.failures if self.pool is not None else 0
            failed = f", {failures} failed to start (see the log)" if failures else ""
            self._emit(
                "kernels", "ready", f"{idle} of {size} so far, the rest starting in the background{failed}"
            )

    async def wait(self) -> None:
        """Until `ipybox down` or `request_shutdown()` (which `handle_signals()` makes of SIGTERM, SIGINT
        and SIGHUP).

        Raises:
            RuntimeError: A watcher failed (a bug), which stopped the workspace; the cause is attached.
        """
        await self._shutdown.wait()
        failure = self._watchers.failure
        if failure is not None:
            raise RuntimeError(f"ipybox in {self.workspace} stopped: {failure!r}") from failure

    @contextlib.contextmanager
    def handle_signals(self) -> Iterator[None]:
        """While open, SIGTERM, SIGINT and SIGHUP request a shutdown (open it before `start()`, so a signal
        that arrives while starting stops the supervisor as soon as it is up)."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        for signum in signals:
            loop.add_signal_handler(signum, self.request_shutdown)
        try:
            yield
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def stop(self) -> None:
        """Stop everything started (in reverse order), remove `state.json`, release the lock. Never
        raises."""
        self._stopping = True
        parts, self._parts = self._parts, None
        if parts is not None:
            try:
                await parts.aclose()
            except Exception:  # every part was still closed: the exit stack runs them all
                logger.exception("stopping the workspace %s failed in part", self.workspace)

    # -- status, leases and servers (the control endpoint's target)

    def status(self) -> WorkspaceStatus:
        reconciler, gateway, pool = self.reconciler, self.gateway, self.pool
        return WorkspaceStatus(
            workspace=str(self.workspace),
            pid=os.getpid(),
            started_at=self.started_at.isoformat(),
            uptime_s=round((datetime.now(UTC) - self.started_at).total_seconds(), 1),
            sandbox=self.config.sandbox.enabled,
            gateway=GatewayStatus(
                running=gateway is not None and gateway.running,
                pid=gateway.pid if gateway is not None else None,
            ),
            tool_server=ToolServerStatus(running=self.tool_server is not None),
            pool=PoolStatus(
                size=self.config.kernel.warm_pool,
                idle=pool.idle if pool is not None else 0,
                leased=self.leases.leased_kernels,
            ),
            leases=len(self.leases),
            kernel_generation=self.kernel_generation,
            restarts=dict(self.restarts),
            config_error=str(reconciler.error) if reconciler is not None and reconciler.error else None,
            reconciler=self._with_stops(self._located(_reconciler_status(reconciler))),
            state_dir=str(self.paths.dir),
            mcp=self.mcp_url,
            console=self.console_url,
            pending_asks=len(self.board.pending),
            actions=_action_statuses(reconciler),
        )

    def _with_stops(self, status: ReconcilerStatus) -> ReconcilerStatus:
        """`status` with why each server that ended by itself is not running (e.g. its memory limit)."""
        if self.tool_server is None or not status.servers:
            return status
        stopped = {name: self.tool_server.servers.stopped(name) for name in status.servers}
        servers = {
            name: server.model_copy(update={"stopped": stopped[name]}) if stopped[name] else server
            for name, server in status.servers.items()
        }
        return status.model_copy(update={"servers": servers})

    async def status_with_kernels(self) -> WorkspaceStatus:
        """`status()` with each kernel's usage and the limits (`kernels`), asked of the gateway: at most
        `kernel_health.STATUS_TIMEOUT` later, also when the gateway does not answer."""
        kernels = await self.health.status()
        return self.status().model_copy(update={"kernels": kernels})

    def kernel_settings(self) -> KernelSection:
        """`[kernel]` as in effect now: the reconciler's last applied configuration (an edit of
        `max_idle` applies without recycling kernels), else the one started with."""
        config = self.reconciler.config if self.reconciler is not None else None
        return (config or self.config).kernel

    async def reclaim_kernel(self, lease: LeaseId, kernel: KernelId, why: str) -> bool:
        """Take `kernel` from `lease` and delete it (the idle kernel reaper's); the lease's next kernel
        comes with `why`. `False` when the lease no longer holds it (nothing was done)."""
        tokens = self.leases.take(lease, kernel, why)
        if tokens is None:
            return False
        self._revoke(tokens)
        if self.pool is not None:
            await self.pool.release(kernel)
        return True

    def _located(self, status: ReconcilerStatus) -> ReconcilerStatus:
        """`status` with each server's place in `ipybox.toml` (`ipybox.toml:LINE:COL` of its table)."""
        if not status.servers:
            return status
        try:
            info = self.config_path.stat()
            key = (info.st_mtime_ns, info.st_size)
            if self._positions is None or self._positions[0] != key:
                source = self.config_path.read_text(encoding="utf-8")
                # Positions of a file TOML accepts only: the scanner recurses on what it cannot read.
                loads = too_deep(source, MAX_NESTING) is None and _parses(source)
                self._positions = (key, key_positions(source) if loads else {})
            positions = self._positions[1]
        except (OSError, UnicodeDecodeError):
            return status
        servers = {}
        for name, server in status.servers.items():
            where = positions.get(("servers", name))
            location = f"{CONFIG_FILE}:{where[0]}:{where[1]}" if where is not None else None
            servers[name] = server.model_copy(update={"location": location})
        return status.model_copy(update={"servers": servers})

    async def apply_server(self, name: str, progress: Progress | None = None) -> ServerOutcome:
        """Apply the current `ipybox.toml` now (as the watcher would after an edit) and return server
        `name`'s outcome, once it has one. `progress` is called with that server's events meanwhile."""
        if self.reconciler is None:
            raise RuntimeError("the workspace is still starting")
        if progress is None:
            return await self._apply_server(name)
        part = server_part(name)

        def of_server(event: ProgressEvent) -> None:
            if event.what == part:
                progress(event)

        unsubscribe = self.progress.subscribe(of_server)
        try:
            return await self._apply_server(name)
        finally:
            unsubscribe()

    async def _apply_server(self, name: str) -> ServerOutcome:
        assert self.reconciler is not None
        reconciler = self.reconciler
        # A reload the watcher started meanwhile may still be starting the server: the next reload waits
        # for it (reloads take turns) and, the file being unchanged, only tries again what failed.
        for _ in range(3):
            await reconciler.reload()
            status = _reconciler_status(reconciler)
            server = status.servers.get(name)
            if reconciler.error is not None or server is None or server.state != "starting":
                break
        source = None
        with contextlib.suppress(OSError, UnicodeDecodeError):
            source = (self.workspace / CONFIG_FILE).read_text(encoding="utf-8")
        return server_outcome(name, status, reconciler.error, source)

    def new_lease(self, check: bool = False) -> LeaseId:
        """A new lease; with `check`, one whose kernel checks agent-written code: its asks are refused."""
        return self.leases.new_lease(CHECK_REFUSAL if check else None)

    async def lease_kernel(self, lease: LeaseId) -> KernelLeased:
        self.leases.kernels(lease)  # an unknown lease fails before a kernel is claimed for it
        pool, kernel_id = await self._claim_kernel()
        caller = pool.callers.get(kernel_id)
        try:
            bound = self.leases.bind(
                lease, KernelId(kernel_id), CallerId(caller) if caller is not None else None
            )
        except KeyError:  # released while the kernel was being claimed: it goes back
            await pool.release(kernel_id)
            raise
        # The kernel the lease held is done (its application replaced it): its token stops working now,
        # and it is deleted (a dead one, or one of a gateway since restarted, is already gone).
        self._revoke(bound.tokens)
        for replaced in bound.replaced:
            pool.discard(replaced)
        self.health.leased(KernelId(kernel_id))
        return KernelLeased(kernel_id=KernelId(kernel_id), lost=bound.lost)

    async def _claim_kernel(self) -> tuple[KernelPool, str]:
        for attempt in range(_LEASE_ATTEMPTS):
            async with self._kernels_lock:  # not while kernels are being recycled or restarted
                pool, gateway = self.pool, self.gateway
                if pool is None or gateway is None:
                    raise GatewayError(
                        f"the kernel gateway is not running: {self._gateway_failure or 'stopped'}"
                    )
                try:
                    return pool, await pool.claim()
                except (GatewayUnreachableError, PoolStoppedError) as e:
                    failure: Exception = e
            # Its gateway exited under the claim (or the pool was recycled): once `_watch_gateway` has
            # restarted it, claim again from the new pool. Any other failure is the caller's to see.
            if attempt == _LEASE_ATTEMPTS - 1 or not await self._gateway_replaced(gateway):
                raise failure
        raise AssertionError("unreachable")

    async def run_in_fresh_kernel(self, code: str) -> str:
        """Execute `code` in a fresh kernel of the warm pool (sandboxed as every kernel of the workspace)
        and return its output; the kernel is deleted afterwards. It is how agent-written modules (output
        parsers) are checked (`ipybox.codeact.checks.RunCheck`): the kernel runs under a lease of its own,
        whose `ask`s are refused without asking anyone, and nothing it imported outlives the check.

        Raises:
            CodeExecutionError: The code raised.
            GatewayError: No kernel could be had (the gateway is down or restarting).
        """
        lease = self.leases.new_lease(PARSER_CHECK_REFUSAL)
        try:
            gateway = self.gateway
            if gateway is None:
                raise GatewayError(f"the kernel gateway is not running: {self._gateway_failure or 'stopped'}")

            async def kernel_source() -> str:
                return (await self.lease_kernel(lease)).kernel_id

            client = KernelClient(gateway.endpoint, kernel_source=kernel_source, spare_kernel=False)
            await client.connect()
            try:
                result = await client.execute(code, timeout=_CHECK_TIMEOUT)
            finally:
                await client.disconnect()
            return result.text or ""
        finally:
            # Also when cancelled (a check that took too long): the lease's kernel is deleted.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.release_lease(lease))

    async def release_lease(self, lease: LeaseId) -> None:
        released = self.leases.release(lease)
        if self.approver is not None:
            self.approver.forget_session(lease)  # its answers "for this session" end with it
        if released.channel is not None:
            await released.channel.disconnect()  # its pending asks are not approved
        self._revoke(released.tokens)
        if self.pool is not None:
            for kernel_id in released.kernels:
                await self.pool.release(kernel_id)

    async def serve_approvals(self, lease: str, websocket: WebSocket) -> None:
        if lease not in self.leases:
            await websocket.close(code=4404, reason="unknown lease")
            return
        answers = websocket.query_params.get("answers", "application")
        if answers not in _ANSWERS:
            await websocket.close(code=4400, reason=f"answers must be one of {', '.join(_ANSWERS)}")
            return
        channel = self.leases.open_channel(
            LeaseId(lease),
            ApprovalChannel(True, self.config.approval.ask_timeout, answers=_ANSWERS[answers]),
        )
        try:
            await channel.connect(websocket)
        finally:
            if not channel.open:
                self.leases.close_channel(LeaseId(lease), channel)

    # -- people answering asks (the console's target, `ipybox approve`)

    @property
    def policy(self) -> ApprovalPolicy:
        return self.approver.policy if self.approver is not None else self.config.approval

    @property
    def audit(self) -> AuditLog:
        assert self.approver is not None
        return self.approver.audit

    @property
    def config_path(self) -> Path:
        return self.workspace / CONFIG_FILE

    def explain(self, call: ToolCall) -> list[tuple[ToolCall, Verdict]]:
        assert self.approver is not None
        return self.approver.explain(call)

    async def answer(self, ask_id: str, answer: AskAnswer) -> str | None:
        assert self.approver is not None
        return await self.approver.answer(ask_id, answer)

    @property
    def console_url(self) -> str | None:
        """The web console's address (`None` unless `[endpoints] console` and running)."""
        return self._console.url if self._console is not None else None

    def console_login(self) -> str:
        """A new one-time login link for the web console.

        Raises:
            RuntimeError: The console is off (`[endpoints] console = false`).
        """
        if self._console is None or self._console.url is None:
            raise RuntimeError("the web console is off in this workspace ([endpoints] console = false)")
        return self._console.login_url()

    async def serve_approver(self, websocket: WebSocket, who: str) -> None:
        """Serve `ipybox approve` on `websocket` (the protocol of `ipybox.approval.ask_events`) until it
        leaves; while it is connected, the terminal is a route that can answer."""
        await websocket.accept()
        by = f"terminal ({who})" if who else "terminal"
        sending = asyncio.Lock()

        async def send(text: str) -> None:
            async with sending:
                await websocket.send_text(text)

        async def receive() -> None:
            while True:
                frame = await websocket.receive_text()
                try:
                    message = AnswerMessage.model_validate_json(frame)
                except ValueError as e:
                    await send(AnswerResult(id="", ok=False, error=f"not an answer: {e}").to_json())
                    continue
                why = await self.answer(message.id, AskAnswer(message.accept, message.scope, "terminal", by))
                await send(AnswerResult(id=message.id, ok=why is None, error=why).to_json())

        with self.board.present("terminal"), self.board.subscribe() as subscription:
            reader = asyncio.create_task(receive())
            try:
                for ask in subscription.pending:
                    await send(message_of(AskOpened(ask)).to_json())
                while not reader.done():
                    event = await _next_event(subscription, reader)
                    if event is None:
                        if not reader.done():  # cut off for not reading: it may connect again
                            await websocket.close(code=4408, reason="the approver fell behind: connect again")
                        break
                    await send(message_of(event).to_json())
            except (WebSocketDisconnect, RuntimeError, OSError) as e:
                logger.debug("an approver left: %s", e)
            finally:
                reader.cancel()
                with contextlib.suppress(BaseException):
                    await reader
                with contextlib.suppress(Exception):
                    await websocket.close()

    async def serve_asker(self, websocket: WebSocket) -> None:
        """Serve a question from another process (`AskQuestion`: the MCP server, about a client's
        `register_mcp_server`) on `websocket`: route it, take the asker's elicitation answer if it was
        asked, and send the answer that won (`closed`). The asker leaving withdraws the question."""
        assert self.approver is not None
        approver = self.approver
        await websocket.accept()
        try:
            question = AskQuestion.model_validate_json(await websocket.receive_text())
        except (ValueError, WebSocketDisconnect) as e:
            with contextlib.suppress(Exception):
                await websocket.close(code=4400, reason=f"not a question: {e}"[:120])
            return
        call = ToolCall(question.server, question.tool, question.args, question.annotations)
        opened = approver.open_question(
            call, Verdict("ask", question.rule_id, question.reason), elicitation=question.elicitation
        )
        if isinstance(opened, str):  # nobody can answer
            with contextlib.suppress(Exception):
                await websocket.send_text(AskClosedMessage(id="", why=opened).to_json())
                await websocket.close()
            return
        ask = opened

        async def elicitation_answers() -> None:
            while True:
                message = AnswerMessage.model_validate_json(await websocket.receive_text())
                if message.id == ask.id and ask.asked_of == "elicitation":
                    answer = AskAnswer(message.accept, "once", "elicitation", "the MCP client")
                    self.board.answer(ask.id, answer)

        reader = asyncio.create_task(elicitation_answers())
        why = "the asker went away"
        try:
            await websocket.send_text(AskOpenedMessage(ask=AskView.of(ask)).to_json())
            waiting: list[asyncio.Future[Any]] = [ask.answered, reader]
            done, _ = await asyncio.wait(waiting, timeout=ask.timeout)
            if ask.answered in done and not ask.answered.cancelled():
                answer = AnswerView.of(ask.answered.result())
                await websocket.send_text(AskClosedMessage(id=ask.id, answer=answer).to_json())
            elif not done:
                why = f"no answer within {ask.timeout:g} s"
                await websocket.send_text(AskClosedMessage(id=ask.id, why=why).to_json())
        except (WebSocketDisconnect, RuntimeError, OSError) as e:
            logger.debug("an asker left: %s", e)
        finally:
            self.board.close(ask, why=why)
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            with contextlib.suppress(Exception):
                await websocket.close()

    def _path_links(self, call: ToolCall) -> dict[str, PathLink]:
        """Where `call`'s path arguments lead through links, resolved here on the host against the server's
        `cwd` (else the workspace), for the people and the application asked."""
        cwd = getattr(self.config.servers.get(call.server), "cwd", None)
        base = self.workspace / cwd if isinstance(cwd, str) else self.workspace
        return path_links(call.args, base=base, workspace=self.workspace)

    async def _write_answer_rule(self, ask: PendingAsk, accept: bool, by: str) -> None:
        """An `always` answer: the rule it makes goes into `ipybox.toml` (refused with the reason when it
        would not load), and the workspace loads it now, as it would any edit."""
        assert self.approver is not None and self.reconciler is not None
        written = await asyncio.to_thread(
            write_answer_rule,
            self.config_path,
            ask.call,
            accept=accept,
            asked_by=ask.rule_id,
            by=by,
            redact=self.approver.audit.redact,
        )
        logger.info("%s added rule %r to %s:%d", by, written.id, CONFIG_FILE, written.line)
        # The rule now; whatever else the file says is applied in the background (never waited for here).
        await self.reconciler.reload_rules()
        if self.reconciler.error is not None:  # checked before writing: only a concurrent edit gets here
            logger.warning(
                "%s does not load after rule %r was added: %s", CONFIG_FILE, written.id, self.reconciler.error
            )

    # -- reconciler hooks

    async def rules_changed(self, policy: ApprovalPolicy) -> None:
        self.config = self.config.model_copy(update={"approval": policy})
        if self.approver is not None:
            self.approver.policy = policy
        logger.info("approval rules reloaded (%d rules, default %s)", len(policy.rules), policy.default)

    async def kernels_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        if self.require_sandbox:
            check_sandboxed(config)  # refused before anything stops: the sandboxed kernels keep running
        logger.warning("%s: recycling kernels (running code in leased kernels is lost)", "; ".join(reasons))
        async with self._kernels_lock:
            self.config = config
            await self._stop_kernels(lost=f"ipybox restarted it to apply a change ({'; '.join(reasons)})")
            await self._start_kernels()
            self._write_state()
            self.kernel_generation += 1

    # -- components

    async def _start_tool_server(self) -> None:
        server = ToolServer(
            unix_socket=self.run_dir / "tools.sock",
            media_dir=self.config.resolve(self.config.workspace.images_dir),
            max_image_bytes=self.config.kernel.max_image_bytes,
            # Server parameters may say where the workspace is, e.g. a data file's absolute path.
            environ={**os.environ, WORKSPACE_ENV: str(self.workspace)},
            dotenv_path=self.workspace / ".env",
        )
        assert self.approver is not None  # made in start(), before the first tool server
        server.approver = self.approver
        server.servers.prepare = self._prepare_server
        if self.tool_server is not None:  # a restart: the servers the reconciler registered
            for name in self.config.enabled_servers():
                server.servers.register(name, self.config.server_params(name))
        await server.start()
        self.tool_server = server
        if self.reconciler is not None:  # it registers and generates on the servers of the running one
            self.reconciler.servers = server.servers

    async def _start_kernels(self) -> None:
        config = self.config
        assert self.tool_server is not None
        # The same builder as `CodeExecutor`'s embedded gateway; what differs is described by the setup.
        setup = workspace_kernel_setup(self._with_servers(config), self.workspace, self.paths.dir)
        kernels = await start_kernel_gateway(
            setup,
            self.tool_server.calls_address,
            # No call token for all: each pool kernel gets one of its own (`_pool_kernel_env`), so a token
            # only ever stands for one kernel's calls.
            request_env=[TOKEN_ENV],
            unix_socket=self.run_dir / "gateway.sock",
            # The same token and socket after a restart or recycle: attached applications reconnect.
            token=self._gateway_token,
            proxy_socket=self.run_dir / "proxy.sock",
        )
        self.gateway, self.proxy = kernels.gateway, kernels.proxy
        self.pool = KernelPool(
            self.gateway.endpoint,
            config.kernel.warm_pool,
            self._pool_kernel_env,
            gateway_log=self.gateway.log_path,
        )
        self._spec_policies.append(setup.sandbox)
        self.pool.version = len(self._spec_policies) - 1
        await self.pool.start()

    # -- what the host executes (see `ipybox.config.executables`)

    def _with_servers(self, config: WorkspaceConfig) -> WorkspaceConfig:
        """`config` (whose kernel settings the kernels run with) with the servers last applied, which may
        be newer: the reconciler starts servers before it replaces kernels for the same edit."""
        applied = self.reconciler.config if self.reconciler is not None else None
        if applied is None or applied.servers == config.servers:
            return config
        return config.model_copy(update={"servers": applied.servers})

    def _known_servers(self) -> dict[str, dict[str, Any]]:
        config = self._with_servers(self.config)
        return {name: config.server_params(name) for name in config.enabled_servers()}

    async def _prepare_server(self, name: str, params: ServerParams, secrets: bool) -> ServerParams:
        """Before a server starts: kernels get what it executes read-only, then the guard refuses it if
        a kernel can still write any of it (`ServerCodeWritableError`), or protects a sandboxed one."""
        await self._protect_servers()
        return self.guard.check(name, params, secrets=secrets)

    async def _protect_servers(self) -> None:
        """Make the gateway start kernels whose policy protects what the servers execute now, and replace
        the idle kernels, when that differs from what the gateway's spec protects. Leased kernels keep
        the policy they started with until their session resets (see `_live_kernels`)."""
        async with self._kernels_lock:
            gateway, pool, tool_server = self.gateway, self.pool, self.tool_server
            if gateway is None or pool is None or tool_server is None or not self._spec_policies:
                return
            setup = workspace_kernel_setup(self._with_servers(self.config), self.workspace, self.paths.dir)
            if setup.sandbox is None or setup.sandbox == self._spec_policies[-1]:
                return
            proxy_socket = self.run_dir / "proxy.sock" if setup.needs_proxy else None
            spec = setup.kernel_spec(tool_server.calls_address, proxy_socket)
            assert spec is not None  # sandboxed
            gateway.update_kernel_spec(spec)
            self._spec_policies.append(setup.sandbox)
            logger.info("what the MCP servers execute changed: kernels get it read-only, idle ones replaced")
            await pool.recycle(len(self._spec_policies) - 1)

    def _live_kernels(self) -> list[LiveKernels]:
        """The policies kernels live under: the gateway's current one, and an older one for each leased
        kernel started before what the servers execute changed."""
        if not self._spec_policies or self._spec_policies[-1] is None:
            return []  # unsandboxed kernels: on the host already
        live = [LiveKernels("a kernel of this workspace", self._spec_policies[-1])]
        pool, current = self.pool, len(self._spec_policies) - 1
        for lease in self.leases.leases if pool is not None else ():
            for kernel in self.leases.kernels(lease):
                version = pool.versions.get(kernel) if pool is not None else None
                policy = self._spec_policies[version] if version is not None else None
                if version is None or version == current or policy is None:
                    continue
                live.append(
                    LiveKernels(
                        f"the kernel of session {lease}, started before this server was added,",
                        policy,
                        f"reset that session (or end it), then save {CONFIG_FILE} again to start the server",
                    )
                )
        return live

    async def _stop_kernels(self, *, end_leases: bool = False, lost: str | None = None) -> None:
        # Leases outlive a recycle: their applications get fresh kernels under the same lease.
        if end_leases:
            for lease in self.leases.leases:
                with contextlib.suppress(Exception):
                    await self.release_lease(lease)
        if self.pool is not None:
            await self.pool.stop()
            self.pool = None
        self._revoke(self.leases.unbind_kernels(lost))
        gateway, self.gateway = self.gateway, None  # first: the watcher must not take this for a crash
        if gateway is not None:
            with contextlib.suppress(Exception):
                await gateway.stop()
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy = None

    def _pool_kernel_env(self, caller: str) -> dict[str, str]:
        assert self.tool_server is not None
        token = self.tool_server.add_caller(caller)
        self.leases.add_caller(CallerId(caller), CallerToken(token))
        return {TOKEN_ENV: token}

    def _revoke(self, tokens: Iterable[CallerToken]) -> None:
        if self.tool_server is not None:
            for token in tokens:
                self.tool_server.remove_caller(token)

    async def _gateway_replaced(self, gateway: KernelGateway) -> bool:
        """Whether `gateway` exited (or was replaced) and is being restarted; waits up to a second for a
        gateway that just refused connections to be seen exiting, and for `_watch_gateway` to take over."""
        if gateway.running and gateway is self.gateway:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_gateway_exit(gateway), 1.0)
            if gateway.running:
                return False
        # `_watch_gateway` (running from the end of `start()` on) notices the exit within its poll interval
        # and takes the kernels lock, which the next claim then waits for until the new gateway is up.
        for _ in range(50):
            if self.gateway is not gateway or self._kernels_lock.locked() or self._stopping:
                break
            await asyncio.sleep(0.02)
        return not self._stopping

    async def _watch_gateway(self) -> None:
        while not self._stopping:
            gateway = self.gateway
            if gateway is None:
                await asyncio.sleep(0.5)
                continue
            code = await _gateway_exit(gateway)
            if self._stopping or gateway is not self.gateway:
                continue
            how = describe_exit(code) if code is not None else "an unknown status"
            why = f"the kernel gateway exited with {how}"
            logger.error("%s: restarting it and the warm pool%s", why, log_tail(gateway.log_path))
            self._gateway_failure = why
            started = time.monotonic()
            # A claim holds the kernels lock while it waits for a kernel of the pool: stopping the dead
            # gateway's pool first fails such a claim at once (it claims again from the new pool), so the
            # restart never waits behind it.
            if self.pool is not None:
                await self.pool.stop()
            async with self._kernels_lock:
                await self._stop_kernels(lost=f"it exited with {how} and ipybox restarted it")
                try:
                    await self._start_kernels()
                except Exception as e:
                    self._gateway_failure = f"{why}, and restarting it failed: {e}"
                    logger.error("could not restart the kernel gateway: %s; retrying in 2 s", e)
                    await asyncio.sleep(2)
                    continue
                self._write_state()
                self.kernel_generation += 1
            self._gateway_failure = None
            self.restarts["gateway"] += 1
            logger.info("kernel gateway restarted in %.1f s", time.monotonic() - started)

    async def _watch_tool_server(self) -> None:
        while not self._stopping:
            server = self.tool_server
            assert server is not None
            await server.join()
            if self._stopping:
                return
            logger.error("the tool server stopped: restarting it")
            with contextlib.suppress(Exception):
                await server.stop()
            await self._start_tool_server()
            # Kernels know the old socket path and tokens: give them new ones.
            await self.kernels_changed(self.config, ["the tool server restarted"])
            self.restarts["tool_server"] += 1

    async def _stop_tool_server(self) -> None:
        if self.tool_server is not None:
            with contextlib.suppress(Exception):
                await self.tool_server.stop()

    @property
    def mcp_url(self) -> str | None:
        """The streamable HTTP MCP endpoint (`None` unless `[endpoints] mcp` and running)."""
        return self._mcp.url if self._mcp is not None else None

    def _write_state(self) -> None:
        assert self.gateway is not None and self.gateway.unix_socket is not None
        state = SupervisorState(
            pid=os.getpid(),
            workspace=str(self.workspace),
            started_at=self.started_at.isoformat(),
            control_socket=str(self.run_dir / "control.sock"),
            control_token=self._control_token,
            gateway_socket=str(self.gateway.unix_socket),
            gateway_token=self.gateway.token,
            log_file=str(self.paths.log),
            mcp_url=self.mcp_url,
            mcp_token=self._mcp.token if self._mcp is not None and self._mcp.url else None,
            ready=self._ready,
        )
        write_state(self.paths, state)
        self._record_run_dirs()  # a new gateway has a new runtime directory

    def _record_run_dirs(self) -> None:
        """Record the private directories this supervisor made outside the state directory (`run.json`):
        the next `up` removes them should this one be killed (SIGKILL) before it removes them."""
        gateway_dir = self.gateway.runtime_dir if self.gateway is not None else None
        record_run_dirs(self.paths, [self.run_dir, *([gateway_dir] if gateway_dir is not None else [])])

    def _remove_leftovers(self) -> None:
        """Remove what a killed supervisor of this workspace left behind: its private directories (as
        `run.json` names them), its `state.json`, and half-written tool packages. Run holding the lock,
        which proves that no other supervisor of this workspace is alive."""
        removed = remove_leftovers(self.paths)
        mcptools = self.config.resolve(self.config.workspace.mcptools_dir)
        try:
            removed += [str(mcptools / name) for name in remove_stale_work_dirs(mcptools)]
        except OSError as e:  # a symlink planted there: generating refuses it, with the same message
            logger.warning("not cleaning %s: %s", mcptools, e)
        if removed:
            logger.info("removed what a supervisor killed before it could stop left: %s", ", ".join(removed))


def check_sandboxed(config: WorkspaceConfig) -> None:
    """Check that `config`, the effective configuration (`ipybox.toml` with `.env` and the environment
    over it), runs kernels sandboxed, as `--sandbox` asks.

    Raises:
        ConfigError: It doesn't; placed at what turned the sandbox off, and saying how to change it.
    """
    if config.sandbox.enabled:
        return
    source, line, column = setting_source(config, ("sandbox", "enabled"))
    if source.startswith("environment variable"):
        reason = "this variable turns the sandbox off (over ipybox.toml): unset it"
    elif source == str(config.root / ".env"):
        reason = "this line turns the sandbox off (over ipybox.toml): remove it"
    else:
        reason = (
            "this file does not enable the sandbox: set `enabled = true` under [sandbox] (its policy applies)"
        )
    reason = f"--sandbox was given, but {reason}, or leave out --sandbox"
    path = config.path if config.path is not None else config.root / CONFIG_FILE
    raise ConfigError(path, [ConfigProblem(source, line, column, reason)])


async def check_running_sandboxed(state: SupervisorState) -> None:
    """Check that the workspace running with `state` (an `ipybox up` of its own, with its own environment)
    runs kernels sandboxed, as `--sandbox` asks of a command that attaches to it.

    Raises:
        ConfigError: It runs them unsandboxed.
        NotRunningError: It stopped meanwhile.
    """
    async with ControlClient(state) as control:
        if (await control.status()).sandbox:
            return
    path = Path(state.workspace) / CONFIG_FILE
    reason = (
        f"--sandbox was given, but the workspace running in {state.workspace} runs kernels unsandboxed (its "
        "[sandbox] enabled is false, from ipybox.toml, .env or the environment of the `ipybox up` that runs "
        "it): stop it with `ipybox down`, enable the sandbox, or leave out --sandbox"
    )
    raise ConfigError(path, [ConfigProblem(str(path), None, None, reason)])


_ANSWERS: dict[str, Answers] = {"application": "application", "elicitation": "elicitation", "none": "none"}


async def _next_event(subscription: Subscription, reader: asyncio.Task[None]) -> AskEvent | None:
    """The subscription's next event; `None` when it was cut off or `reader` ended (the approver left)."""
    getting = asyncio.ensure_future(subscription.events.get())
    done, _ = await asyncio.wait({getting, reader}, return_when=asyncio.FIRST_COMPLETED)
    if getting not in done:
        getting.cancel()
        return None
    return getting.result()


def _parses(source: str) -> bool:
    try:
        tomllib.loads(source)
    except tomllib.TOMLDecodeError:
        return False
    return True


def _remove_state(paths: StatePaths) -> None:
    with contextlib.suppress(OSError):
        paths.state.unlink(missing_ok=True)


def _reconciler_status(reconciler: Reconciler | None) -> ReconcilerStatus:
    return (
        ReconcilerStatus.model_validate(reconciler.status()) if reconciler is not None else ReconcilerStatus()
    )


def _action_statuses(reconciler: Reconciler | None) -> list[ActionStatus]:
    """The saved code actions and what each may call: manifests and `ast` only (cheap; their code is
    agent-written and never imported here)."""
    mcptools = reconciler.mcptools_dir if reconciler is not None else None
    if mcptools is None:
        return []
    gentools = gentools_dir(mcptools)
    try:
        listing = read_actions(gentools)
        statuses = [
            ActionStatus(name=f"{a.category}.{a.name}", tool=a.tool_name, calls=a.calls.summary())
            for a in listing.actions
        ]
        for category, name in listing.stale:
            calls = analyse_action(gentools, category, name).summary()
            tool = action_tool_name(category, name)
            statuses.append(ActionStatus(name=f"{category}.{name}", tool=tool, calls=calls, stale=True))
    except Exception as e:  # status reports what runs: a broken gentools/ is logged, never fatal
        logger.warning("saved code actions could not be listed: %s", e)
        return []
    return sorted(statuses, key=lambda status: status.name)


@contextlib.contextmanager
def _logging_to(paths: StatePaths) -> Iterator[None]:
    """While open, ipybox's log from INFO up goes to the state directory's `logs/supervisor.log`, escaped
    (`PrintableFormatter`: a server's stderr quoted in a record can't reach a terminal that shows the file).

    The handler filters at INFO. The `ipybox` logger must let INFO through to reach it: while any
    supervisor of this process logs, it is at INFO or below (lowered if it was above, and the level it had
    before the first put back after the last, as their lifetimes may overlap). Nothing else in ipybox sets
    its level: a library call that did (`CodeExecutor.start()`) silenced the log after an MCP session.
    """
    handler = StateLogHandler(paths)  # never through a symlink a kernel planted
    handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger("ipybox")
    root.addHandler(handler)
    if _SupervisorLogs.open == 0:
        _SupervisorLogs.level_before = root.level
        if root.getEffectiveLevel() > logging.INFO:
            root.setLevel(logging.INFO)
    _SupervisorLogs.open += 1
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        _SupervisorLogs.open -= 1
        if _SupervisorLogs.open == 0:
            root.setLevel(_SupervisorLogs.level_before)


class _SupervisorLogs:
    """How many supervisors of this process log, and the `ipybox` logger's level before the first did."""

    open = 0
    level_before = logging.NOTSET


async def _gateway_exit(gateway: KernelGateway) -> int | None:
    """Wait for the gateway process to exit and return its exit code.

    Sooner than `gateway.join()`, which returns once the gateway's stdout is closed, and its kernels keep
    it open until they notice that the gateway is gone (a second or more later).
    """
    join = asyncio.ensure_future(gateway.join())
    try:
        while gateway.running and not join.done():
            await asyncio.wait([join], timeout=0.2)
    finally:
        join.cancel()
    process = gateway._process
    return process.returncode if process is not None else None
