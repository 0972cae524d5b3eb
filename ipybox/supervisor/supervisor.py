"""`Supervisor`: what `ipybox up` runs for a workspace, the composition root of its services.

It runs the tool server, the kernel gateway with (sandboxed) kernels and a warm pool, the reconciler that
applies edits of `ipybox.toml`, the control endpoint (the CLI, attached applications, `ipybox approve`),
the web console and the MCP endpoint; it restarts a gateway or tool server that dies, and on SIGTERM,
Ctrl-C or `ipybox down` stops everything it started.

Composition (a `Service`, `ipybox.lifecycle`): `AsksService` (`asks`: approver, ask board, answering
websockets, `always` rules), `ToolsService` (`tools`: the tool server, restarted) and `KernelsService`
(`kernels`: gateway, pool, leases, reaper, restarts), each with its state, one `aclose()` and a task group
for its background work. `start()` enters the parts once into one `AsyncExitStack` (lock, log, run
directory, asks, tools, kernels, reconciler, endpoints); `stop()`, or a failure in `start()`, cancels the
supervisor's own task group (the reconciler's watcher, the MCP session sweeper), then closes the parts in
reverse order. A failed background task of any part stops the workspace; `wait()` raises it. The
supervisor holds no state of the parts: it wires them and delegates its callers' requests (control
endpoint, console, reconciler hooks); `workspace_status()` assembles the status. The diagram:
`docs/design.md`, "Services".

Progress: `progress` (a `ProgressHub`, `ipybox.progress`) carries the events of long operations: while
`start(progress=...)` runs, its listener sees the parts come up (`ipybox.supervisor.startup` lists them);
`apply_server(name, progress=...)` passes on the events of that server alone.

Secrets: `[secrets]` are resolved on the host when the supervisor is made (a `SecretError` stops
`ipybox up` before anything starts, as a bad `ipybox.toml` does); their values go to the kernels' proxy
(`KernelsService`) and to the audit log, which redacts them, never to a kernel. An edit of `[secrets]`, or
of the `.env` a `${VAR}` value comes from, resolves them again (`kernels_changed`) and replaces the kernels
(new placeholders, a proxy with the new routes, the CA made again only if the hosts changed); one that
does not resolve is refused as an edit that does not load is (`ipybox status` shows it, placed at the
secret's table), and the kernels keep the secrets they have. A command's new output is not watched: it is
read again at such an edit or the next `ipybox up`.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import secrets
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from starlette.websockets import WebSocket

from ipybox.approval.asks import AskAnswer, AskBoard
from ipybox.asgi_server import EmbeddedServer
from ipybox.config import CONFIG_FILE, ConfigError, ConfigProblem, WorkspaceConfig, load_config
from ipybox.config.loading import setting_source
from ipybox.config.policy_lint import lint_error
from ipybox.config.secrets import (
    ResolvedSecret,
    SecretError,
    resolve_secrets,
    secret_values,
    secrets_digest,
)
from ipybox.config.sections import KernelSection
from ipybox.console.endpoint import ConsoleEndpoint
from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.pool import KernelPool
from ipybox.kernels.remote_gateway import RemoteGateway
from ipybox.lifecycle import Service, handling_signals
from ipybox.mcp_client.params import ServerParams
from ipybox.progress import Progress, ProgressHub
from ipybox.reconcile.pins import ToolPins
from ipybox.reconcile.reconciler import Reconciler
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, Verdict
from ipybox.rules.provenance import ProvenanceSettings
from ipybox.running import mcp_token
from ipybox.running.state import StatePaths, SupervisorLock, forget_run_dirs
from ipybox.running.status import KernelLeased, LeaseId, ServerOutcome, TokenRotated, WorkspaceStatus
from ipybox.supervisor.asks import AsksService
from ipybox.supervisor.control_app import control_app
from ipybox.supervisor.kernel_health import KernelHealth
from ipybox.supervisor.kernels import CHECK_REFUSAL, KernelsService
from ipybox.supervisor.leases import LeaseTable
from ipybox.supervisor.log_file import logging_to as _logging_to
from ipybox.supervisor.mcp_endpoint import MCPEndpoint
from ipybox.supervisor.run_files import RunFiles
from ipybox.supervisor.sandbox_check import check_running_sandboxed, check_sandboxed
from ipybox.supervisor.startup import StartupReport
from ipybox.supervisor.tools import ToolsService
from ipybox.supervisor.workspace_status import (
    ConfigPositions,
    StatusSources,
    applied_outcome,
    with_servers,
    workspace_status,
)  # fmt: skip
from ipybox.tool_server.tool_server import ToolServer

# `check_running_sandboxed` was published here before the supervisor was split into services: it stays.
__all__ = ["Supervisor", "check_running_sandboxed", "check_sandboxed"]

logger = logging.getLogger("ipybox.supervisor")


class Supervisor(Service):
    """Runs a workspace until stopped.

    Args:
        workspace: The workspace directory (with `ipybox.toml`).
        serve_mcp: Serve MCP over streamable HTTP as `[endpoints] mcp` says (off for `ipybox mcp`, which
            serves it over stdio).
        require_sandbox: `--sandbox`: the configuration must enable the sandbox (`ConfigError` here naming
            what turned it off), and an edit that turns it off while running is refused (`ipybox status`).

    Example:
        ```python
        supervisor = Supervisor(Path("example-workspace"))  # raises ConfigError, SecretError
        with supervisor.handle_signals():
            await supervisor.start()  # raises AlreadyRunningError, SandboxUnavailableError
            try:
                await supervisor.wait()  # until `ipybox down`, SIGTERM or Ctrl-C
            finally:
                await supervisor.stop()
        ```
    """

    def __init__(self, workspace: Path, *, serve_mcp: bool = True, require_sandbox: bool = False) -> None:
        super().__init__("workspace", on_failure=self._failed)
        self.workspace = workspace.resolve()
        self.serve_mcp = serve_mcp
        self.require_sandbox = require_sandbox
        # Loaded once: what is checked here is what runs (the reconciler applies this same object).
        self.config: WorkspaceConfig = load_config(self.workspace / CONFIG_FILE)
        if require_sandbox:
            check_sandboxed(self.config)
        # On the host: kernels get placeholders, the proxy and the audit log the values.
        self._secrets_digest = self._secrets_source(self.config)
        self.resolved_secrets = self._resolve(self.config)
        self.paths = StatePaths(self.config.resolve(self.config.workspace.state_dir))
        self.started_at = datetime.now(UTC)
        self.progress = ProgressHub()
        # The private run directory (sockets), made by `start()`: a random name, created exclusively, 0700.
        self.run_dir = Path(tempfile.gettempdir()) / f"ipybox-ws-{secrets.token_urlsafe(6)}"
        self.leases = LeaseTable()
        # The tools each server serves, against their pins in ipybox.lock (read now, written by the host).
        self.pins = ToolPins(
            self.workspace, lambda: with_servers(self.config, self.reconciler).enabled_servers()
        )
        self.asks = AsksService(
            self.workspace, self.paths.audit, leases=self.leases, config=lambda: self.config,
            reload_rules=self._reload_rules, console_url=lambda: self.console_url, pins=self.pins,
            secrets=secret_values(self.resolved_secrets),
        )  # fmt: skip
        self.tools = ToolsService(
            self.workspace, self.run_dir / "tools.sock", config=lambda: self.config, approver=self.asks.approver,
            prepare=self._prepare_server, on_restart=self._tools_restarted, on_failure=self._failed,
            pins=self.pins,
        )  # fmt: skip
        self.kernels = KernelsService(
            self.workspace, self.paths.dir, self.run_dir, gateway_token=secrets.token_urlsafe(32),
            leases=self.leases, tools=self.tools, config=lambda: with_servers(self.config, self.reconciler),
            settings=self.kernel_settings, forget_session=self.asks.forget_session,
            on_new_gateway=self._write_state, on_failure=self._failed, secrets=self.resolved_secrets,
            ask_host=self.asks.approver.ask_host,
        )  # fmt: skip
        self.reconciler: Reconciler | None = None  # made by `start()`, on the tool server's servers
        self._lock = SupervisorLock(self.paths)
        self._parts = contextlib.AsyncExitStack()  # what `_startup()` entered, closed by `_shutdown()`
        self._files = RunFiles(self.paths, self.workspace, self.started_at, secrets.token_urlsafe(32))
        self._mcp: MCPEndpoint | None = None
        self._console: ConsoleEndpoint | None = None
        self._positions = ConfigPositions(self.config_path)
        self._report = StartupReport(self.progress)
        self._shutdown_requested = asyncio.Event()
        self._ready = False
        # Set once the servers of the start-up are applied: a client attached while the workspace starts
        # (`state.json` is written as soon as the control socket listens) gets its first kernel only then,
        # so that `mcptools` already holds the servers' packages its code imports.
        self._started = asyncio.Event()

    async def start(self, progress: Progress | None = None) -> None:
        """Start everything and write `state.json`, calling `progress` with each part's steps. On any
        failure, what was started is stopped again (in reverse order) and the one error is raised.

        Raises:
            AlreadyRunningError: A supervisor already runs for this workspace.
            SandboxUnavailableError: The sandbox is enabled and this machine can't provide it.
        """
        unsubscribe = self.progress.subscribe(progress) if progress is not None else None
        try:
            await super().start()
        finally:
            if unsubscribe is not None:
                unsubscribe()
        logger.info("workspace %s is up (pid %d)", self.workspace, os.getpid())

    async def _startup(self) -> None:
        parts, files = self._parts, self._files
        self._lock.acquire()
        parts.callback(self._lock.release)
        parts.callback(files.remove_state)
        parts.enter_context(_logging_to(self.paths))
        parts.callback(lambda: logger.info("workspace %s is down", self.workspace))
        files.remove_leftovers(self.config.resolve(self.config.workspace.mcptools_dir))
        parts.callback(forget_run_dirs, self.paths)  # once the run directory is gone (callbacks unwind)
        self.run_dir.mkdir(mode=0o700)
        parts.callback(shutil.rmtree, self.run_dir, ignore_errors=True)
        files.run_dir = self.run_dir
        files.record_dirs(None)
        await parts.enter_async_context(self.asks)
        with self._report.part("tool server"):
            await parts.enter_async_context(self.tools)
        self.reconciler = Reconciler(
            self.workspace, self.tools.running_server().servers, self,
            run_check=self.kernels.run_in_fresh_kernel, progress=self.progress.emit,
        )  # fmt: skip
        with self._report.part("gateway") as gateway:
            await parts.enter_async_context(self.kernels)
            if isinstance(self.gateway, RemoteGateway):
                gateway.append(f"at {self.gateway.url}")
            else:
                gateway.append(f"pid {self.gateway.pid if self.gateway is not None else '?'}")
        await parts.enter_async_context(self.reconciler)  # closed before the kernels (its checks use them)
        async with self._report.pool_while(self.spawn, lambda: self.pool, self.config.kernel.warm_pool):
            await self._start_endpoints(parts)
            await self.reconciler.apply(self.config)
        if self.config.approval.lint == "error" and (findings := self.reconciler.lint()):
            # As a bad file would: there is no last good policy to keep running at start-up.
            raise lint_error(self.config, findings)
        self.spawn(self.reconciler.watch(), name="ipybox-reconciler-watch")
        self._ready = True
        self._started.set()
        self._write_state()

    async def _start_endpoints(self, parts: contextlib.AsyncExitStack) -> None:
        with self._report.part("endpoints") as served:
            control = EmbeddedServer(control_app(self, self._files.control_token), "ipybox-control")
            parts.push_async_callback(control.stop)
            await control.start(unix_socket=self.run_dir / "control.sock")
            served.append("control")
            self._write_state()
            endpoints = self.config.endpoints
            if endpoints.console:
                console = ConsoleEndpoint(
                    self, endpoints.host, endpoints.console_port, user=getpass.getuser()
                )
                self._console = await parts.enter_async_context(console)
                served.append(f"console {self.console_url}")
            if self.serve_mcp and endpoints.mcp:
                # The persisted token: a client configured once keeps working after a restart.
                token = mcp_token.load_or_create(self.paths)
                self._mcp = mcp = await parts.enter_async_context(
                    MCPEndpoint(self.workspace, endpoints, self.paths.outputs, token=token)
                )
                self._write_state()
                self.spawn(mcp.sweep(), name="ipybox-mcp-sweep")
                if self.mcp_url is not None:
                    served.append(f"mcp {self.mcp_url}")

    async def _shutdown(self) -> None:
        try:
            await self._parts.aclose()
        except Exception:  # every part was still closed: the exit stack runs them all
            logger.exception("stopping the workspace %s failed in part", self.workspace)

    async def stop(self) -> None:
        """Stop everything started (in reverse order), remove `state.json`, release the lock; never raises."""
        await self.aclose()

    async def wait(self) -> None:
        """Until `ipybox down` or `request_shutdown()` (which `handle_signals()` makes of SIGTERM, SIGINT
        and SIGHUP).

        Raises:
            RuntimeError: A background task failed (a bug), which stopped the workspace; the cause is attached.
        """
        await self._shutdown_requested.wait()
        if (failure := self.failure) is not None:
            raise RuntimeError(f"ipybox in {self.workspace} stopped: {failure!r}") from failure

    def handle_signals(self) -> contextlib.AbstractContextManager[None]:
        """While open, SIGTERM, SIGINT and SIGHUP request a shutdown (open it before `start()`, so a signal
        that arrives while starting stops the supervisor as soon as it is up)."""
        return handling_signals(self.request_shutdown)

    def request_shutdown(self) -> None:
        self._shutdown_requested.set()

    def _failed(self, error: BaseException) -> None:  # of a task of any part's group: the first is kept
        self.failure = self.failure or error
        self.request_shutdown()

    # -- the parts, as the status, the tests and the CLI read them

    @property
    def gateway(self) -> KernelGateway | RemoteGateway | None:
        return self.kernels.gateway

    @property
    def pool(self) -> KernelPool | None:
        return self.kernels.pool

    @property
    def tool_server(self) -> ToolServer | None:
        return self.tools.server

    @property
    def health(self) -> KernelHealth:
        return self.kernels.health

    @property
    def kernel_generation(self) -> int:
        return self.kernels.generation

    @property
    def restarts(self) -> dict[str, int]:
        return {"gateway": self.kernels.restarts, "tool_server": self.tools.restarts}

    @property
    def mcp_url(self) -> str | None:
        """The streamable HTTP MCP endpoint (`None` unless `[endpoints] mcp` and running)."""
        return self._mcp.url if self._mcp is not None else None

    @property
    def console_url(self) -> str | None:
        """The web console's address (`None` unless `[endpoints] console` and running)."""
        return self._console.url if self._console is not None else None

    @property
    def config_path(self) -> Path:
        return self.workspace / CONFIG_FILE

    # -- the control endpoint's target (`control_app.Controlled`)

    def status(self) -> WorkspaceStatus:
        sources = StatusSources(
            self.workspace, self.started_at, self.config, self.paths.dir, self.leases, self.board,
            self.kernels, self.tools, self.reconciler, self.mcp_url, self.console_url, self.pins,
        )  # fmt: skip
        return workspace_status(sources, self._positions)

    async def status_with_kernels(self) -> WorkspaceStatus:
        """`status()` with each kernel's usage and the limits (`kernels`): within `STATUS_TIMEOUT`."""
        return self.status().model_copy(update={"kernels": await self.kernels.health.status()})

    def kernel_settings(self) -> KernelSection:
        """`[kernel]` as in effect now: the reconciler's last applied configuration (an edit of
        `max_idle` applies without recycling kernels), else the one started with."""
        config = self.reconciler.config if self.reconciler is not None else None
        return (config or self.config).kernel

    async def apply_server(self, name: str, progress: Progress | None = None) -> ServerOutcome:
        """Apply the current `ipybox.toml` now (as the watcher would after an edit) and return server
        `name`'s outcome, once it has one. `progress` is called with that server's events meanwhile. The
        apply runs in the supervisor's task group: a caller that goes away (cancelled) does not stop it."""
        if self.reconciler is None:
            raise RuntimeError("the workspace is still starting")
        applying = applied_outcome(self.reconciler, self.config_path, name, self.progress, progress)
        outcome = await asyncio.shield(self.spawn(applying, name=f"ipybox-apply-{name}"))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def new_lease(self, check: bool = False) -> LeaseId:
        """A new lease; with `check`, one whose kernel checks agent-written code: its asks are refused."""
        return self.leases.new_lease(CHECK_REFUSAL if check else None)

    async def lease_kernel(self, lease: LeaseId) -> KernelLeased:
        await self._started.wait()
        return await self.kernels.lease_kernel(lease)

    async def release_lease(self, lease: LeaseId) -> None:
        await self.kernels.release_lease(lease)

    async def run_in_fresh_kernel(self, code: str) -> str:
        """`KernelsService.run_in_fresh_kernel`: how the reconciler checks agent-written output parsers."""
        return await self.kernels.run_in_fresh_kernel(code)

    async def serve_approvals(self, lease: LeaseId, websocket: WebSocket) -> None:
        await self.asks.serve_approvals(lease, websocket)

    async def serve_approver(self, websocket: WebSocket, who: str) -> None:
        await self.asks.serve_approver(websocket, who)

    async def serve_asker(self, websocket: WebSocket) -> None:
        await self.asks.serve_asker(websocket)

    def console_login(self) -> str:
        """A new one-time login link for the web console.

        Raises:
            RuntimeError: The console is off (`[endpoints] console = false`).
        """
        if self._console is None or self._console.url is None:
            raise RuntimeError("the web console is off in this workspace ([endpoints] console = false)")
        return self._console.login_url()

    def rotate_mcp_token(self) -> TokenRotated:
        """Replace the MCP endpoint's persisted bearer token with a new one; the endpoint, if it serves,
        refuses the old one from now on, and `state.json` holds the new one."""
        token = mcp_token.rotate(self.paths)
        if self._mcp is None:
            return TokenRotated(live=False)
        self._mcp.set_token(token)
        self._write_state()
        logger.info("the MCP endpoint's bearer token was rotated")
        return TokenRotated(live=True, mcp_url=self.mcp_url)

    # -- the console's target (`ipybox.console.target.ConsoleTarget`)

    @property
    def board(self) -> AskBoard:
        return self.asks.board

    @property
    def policy(self) -> ApprovalPolicy:
        return self.asks.policy

    @property
    def audit(self) -> AuditLog:
        return self.asks.audit

    def explain(self, call: ToolCall) -> list[tuple[ToolCall, Verdict]]:
        return self.asks.explain(call)

    async def accept_pins(self, server: str | None) -> list[str]:
        """Pin in `ipybox.lock` what `server` (or every server that differs) serves now: its changed and
        new tools are decided by the rules again.

        Raises:
            KeyError: `server` has not listed its tools in this run (nothing is known to pin).
        """
        try:
            return await asyncio.to_thread(self.pins.accept, server)
        except KeyError:
            raise KeyError(
                f"server {server!r} has not started in this run, so there is nothing to accept: call one of "
                "its tools (or `ipybox server apply`) first"
            ) from None

    async def answer(self, ask_id: str, answer: AskAnswer) -> str | None:
        return await self.asks.answer(ask_id, answer)

    # -- the reconciler's hooks (`ipybox.reconcile.reconciler.ReconcileHooks`) and the wiring of the parts

    async def rules_changed(self, policy: ApprovalPolicy) -> None:
        self.config = self.config.model_copy(update={"approval": policy})
        self.asks.set_policy(policy)
        logger.info("approval rules reloaded (%d rules, default %s)", len(policy.rules), policy.default)

    async def provenance_changed(self, settings: ProvenanceSettings) -> None:
        self.config = self.config.model_copy(update={"provenance": settings})
        self.tools.provenance.configure(settings)
        logger.info("provenance settings reloaded (%d sources)", len(settings.sources))

    async def kernels_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        if self.require_sandbox:
            check_sandboxed(config)  # refused before anything stops: the sandboxed kernels keep running
        # Resolved before anything stops too: a secret that does not resolve keeps the kernels running.
        digest = self._secrets_source(config)
        resolved = None
        if digest != self._secrets_digest:
            try:
                resolved = await asyncio.to_thread(self._resolve, config)
            except SecretError as e:
                raise _secret_config_error(config, e) from None  # no context: it may hold what was read
            self.asks.audit.redact_also(secret_values(resolved))
        logger.warning("%s: recycling kernels (running code in leased kernels is lost)", "; ".join(reasons))
        self.config = config
        if resolved is not None:
            self.resolved_secrets, self._secrets_digest = resolved, digest
        if self.kernels.running:  # else they start from it
            await self.kernels.recycle("; ".join(reasons), secrets=resolved)
        elif resolved is not None:
            self.kernels.secrets = resolved

    def _secrets_source(self, config: WorkspaceConfig) -> str:
        """What the secrets resolved from `config` depend on (`secrets_digest`); empty without any."""
        if not config.sandbox.enabled:
            return ""
        return secrets_digest(config.secrets, environ=os.environ, dotenv_path=self.workspace / ".env")

    def _resolve(self, config: WorkspaceConfig) -> dict[str, ResolvedSecret]:
        """`[secrets]` of `config` resolved on the host (none unless the sandbox is on: loading refuses
        them without it). Raises `SecretError`."""
        if not (config.secrets and config.sandbox.enabled):
            return {}
        return resolve_secrets(
            config.secrets,
            environ=os.environ,
            dotenv_path=self.workspace / ".env",
            cwd=self.workspace,
            kernel_writable=config.sandbox.policy().allow_write_paths(self.workspace, Path.home()),
        )

    async def network_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        """Apply a new network policy to the running kernels' proxy (their next connections); replace
        the kernels when it can't be (no proxy runs, or it refused the policy: `KernelsService.update_network`)."""
        why_not = await self.kernels.update_network(config) if self.kernels.running else None
        if why_not is not None:
            await self.kernels_changed(config, [*reasons, f"not applied to running kernels: {why_not}"])
            return
        self.config = config
        logger.info("network policy updated for running kernels: %s", "; ".join(reasons))

    async def _reload_rules(self) -> Exception | None:
        if (reconciler := self.reconciler) is not None:
            await reconciler.reload_rules()
        return reconciler.error if reconciler is not None else None

    async def _tools_restarted(self, server: ToolServer) -> None:
        if self.reconciler is not None:  # it registers and generates on the servers of the running one
            self.reconciler.servers = server.servers
        if self.kernels.running:  # kernels know the old socket path and tokens: give them new ones
            await self.kernels_changed(self.config, ["the tool server restarted"])

    async def _prepare_server(self, name: str, params: ServerParams, secrets: bool) -> ServerParams:
        return await self.kernels.prepare_server(name, params, secrets)

    def _write_state(self) -> None:
        self._files.write_state(self.gateway, self._mcp, ready=self._ready)


def _secret_config_error(config: WorkspaceConfig, error: SecretError) -> ConfigError:
    """`error` as an edit's problem, placed at its secret's table (`[secrets.<name>]`)."""
    path = config.path if config.path is not None else config.root / CONFIG_FILE
    if error.secret is None:
        return ConfigError(path, [ConfigProblem(str(path), None, None, str(error))])
    source, line, column = setting_source(config, ("secrets", error.secret))
    return ConfigError(path, [ConfigProblem(source, line, column, str(error))])
