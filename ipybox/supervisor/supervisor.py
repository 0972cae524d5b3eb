"""`Supervisor`: what `ipybox up` runs for a workspace.

It runs the tool server (approving every call with the workspace's rules), the kernel gateway with
sandboxed kernels and a warm pool of them, the filtering proxy when the sandbox allows domains, the
reconciler that applies edits of `ipybox.toml`, and the control endpoint through which the CLI and
attached applications reach it. It restarts a gateway or tool server that dies, and on SIGTERM, Ctrl-C
or `ipybox down` stops everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from mcp.server.transport_security import TransportSecuritySettings
from starlette.websockets import WebSocket

from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.asgi_server import BearerAuth, EmbeddedServer
from ipybox.config import CONFIG_FILE, WorkspaceConfig, load_config
from ipybox.in_kernel.mcptools_refresh import MCPTOOLS_DIR_ENV
from ipybox.in_kernel.tool_runner import SERVER_ENV, TOKEN_ENV
from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.kernel_connection import GatewayError, GatewayUnreachableError, log_tail
from ipybox.kernels.kernelspec import KernelSpec
from ipybox.kernels.pool import KernelPool, PoolStoppedError
from ipybox.mcp_client.params import resolve_placeholders
from ipybox.mcp_server import WorkspaceMCP, create_server
from ipybox.reconcile.reconciler import Reconciler
from ipybox.rules import ApprovalPolicy, AuditLog
from ipybox.running.state import StateLogHandler, StatePaths, SupervisorLock, SupervisorState, write_state
from ipybox.sandbox import DomainProxy, SandboxPolicy, sandboxed_kernel_spec
from ipybox.supervisor.control_app import control_app
from ipybox.tool_server.tool_server import ToolServer

logger = logging.getLogger("ipybox.supervisor")

WORKSPACE_ENV = "IPYBOX_WORKSPACE"
MCP_SESSION_IDLE = 1800.0  # seconds, as the MCP SDK's own session idle timeout
# Claims a lease makes across gateway restarts before it gives up (each waits for one restart).
_LEASE_ATTEMPTS = 3


class Supervisor:
    """Runs a workspace until stopped.

    Args:
        workspace: The workspace directory (with `ipybox.toml`).
        serve_mcp: Serve MCP over streamable HTTP as `[endpoints] mcp` says (off for `ipybox mcp`, which
            serves it over stdio).

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

    def __init__(self, workspace: Path, *, serve_mcp: bool = True) -> None:
        self.workspace = workspace.resolve()
        self.serve_mcp = serve_mcp
        self.config: WorkspaceConfig = load_config(self.workspace / CONFIG_FILE)
        self.paths = StatePaths(self.config.resolve(self.config.workspace.state_dir))
        self.started_at = datetime.now(UTC)
        self._lock = SupervisorLock(self.paths)
        self._run_dir: Path | None = None
        self._control_token = secrets.token_urlsafe(32)
        self._gateway_token = secrets.token_urlsafe(32)
        self._control: EmbeddedServer | None = None
        self._mcp: WorkspaceMCP | None = None
        self._mcp_http: EmbeddedServer | None = None
        self._mcp_token = secrets.token_urlsafe(32)
        self._shutdown = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._ready = False
        self.tool_server: ToolServer | None = None
        self.gateway: KernelGateway | None = None
        self.pool: KernelPool | None = None
        self.proxy: DomainProxy | None = None
        self.reconciler: Reconciler | None = None
        self.approver: WorkspaceApprover | None = None
        self.restarts: dict[str, int] = {"gateway": 0, "tool_server": 0}
        self._leases: dict[str, set[str]] = {}  # lease -> kernel ids
        self._lease_of_caller: dict[str, str] = {}
        self._caller_tokens: dict[str, str] = {}
        self._log_handler: logging.Handler | None = None
        self._kernels_lock = asyncio.Lock()
        self.kernel_generation = 0  # kernels recycled or restarted this many times
        self._gateway_failure: str | None = None  # why the gateway is down, while it is

    @property
    def run_dir(self) -> Path:
        assert self._run_dir is not None
        return self._run_dir

    async def start(self) -> None:
        """Start everything and write `state.json`.

        Raises:
            AlreadyRunningError: A supervisor already runs for this workspace.
            SandboxUnavailableError: The sandbox is enabled and this machine can't provide it.
        """
        self._lock.acquire()
        try:
            self._start_logging()
            self._run_dir = Path(tempfile.mkdtemp(prefix="ipybox-ws-"))
            self.approver = WorkspaceApprover(
                self.config.approval, AuditLog(self.paths.audit), self._lease_of_caller
            )
            await self._start_tool_server()
            assert self.tool_server is not None
            self.reconciler = Reconciler(self.workspace, self.tool_server.servers, self)
            await self._start_kernels()
            self._control = EmbeddedServer(control_app(self, self._control_token), "ipybox-control")
            await self._control.start(unix_socket=self.run_dir / "control.sock")
            self._write_state()
            if self.serve_mcp and self.config.endpoints.mcp:
                await self._start_mcp_endpoint()
                self._write_state()
                self._tasks.append(asyncio.create_task(self._sweep_mcp_sessions(), name="ipybox-mcp-sweep"))
            await self.reconciler.apply(self.config)
            self._tasks += [
                asyncio.create_task(self.reconciler.watch(), name="ipybox-reconciler"),
                asyncio.create_task(self._watch_gateway(), name="ipybox-gateway-watch"),
                asyncio.create_task(self._watch_tool_server(), name="ipybox-tool-server-watch"),
            ]
            self._ready = True
            self._write_state()
            logger.info("workspace %s is up (pid %d)", self.workspace, os.getpid())
        except BaseException:
            await self.stop()
            raise

    async def wait(self) -> None:
        """Until `ipybox down` or `request_shutdown()` (which `handle_signals()` makes of SIGTERM, SIGINT
        and SIGHUP)."""
        await self._shutdown.wait()

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
        """Stop everything started, remove `state.json`, release the lock. Never raises."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._mcp_http is not None:
            await self._mcp_http.stop()
        if self._mcp is not None:
            await self._mcp.close_sessions(0)
        if self._control is not None:
            await self._control.stop()
        await self._stop_kernels(end_leases=True)
        if self.tool_server is not None:
            with contextlib.suppress(Exception):
                await self.tool_server.stop()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.paths.state.unlink(missing_ok=True)
        if self._log_handler is not None:
            logger.info("workspace %s is down", self.workspace)
        self._lock.release()
        self._stop_logging()

    # -- status and leases (the control endpoint's target)

    def status(self) -> dict[str, Any]:
        reconciler = self.reconciler.status() if self.reconciler is not None else {}
        return {
            "workspace": str(self.workspace),
            "pid": os.getpid(),
            "started_at": self.started_at.isoformat(),
            "uptime_s": round((datetime.now(UTC) - self.started_at).total_seconds(), 1),
            "sandbox": self.config.sandbox.enabled,
            "gateway": {
                "running": self.gateway is not None and self.gateway.running,
                "pid": self.gateway.pid if self.gateway is not None else None,
            },
            "tool_server": {"running": self.tool_server is not None},
            "pool": {
                "size": self.config.kernel.warm_pool,
                "idle": self.pool.idle if self.pool is not None else 0,
                "leased": sum(len(kernels) for kernels in self._leases.values()),
            },
            "leases": len(self._leases),
            "kernel_generation": self.kernel_generation,
            "restarts": dict(self.restarts),
            "config_error": str(self.reconciler.error) if self.reconciler and self.reconciler.error else None,
            "reconciler": reconciler,
            "state_dir": str(self.paths.dir),
            "mcp": self.mcp_url,
        }

    def new_lease(self) -> str:
        lease = uuid.uuid4().hex
        self._leases[lease] = set()
        return lease

    async def lease_kernel(self, lease: str) -> str:
        kernels = self._leases[lease]
        pool, kernel_id = await self._claim_kernel()
        kernels.add(kernel_id)
        caller = pool.callers.get(kernel_id)
        if caller is not None:
            self._lease_of_caller[caller] = lease
        return kernel_id

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

    async def release_lease(self, lease: str) -> None:
        kernels = self._leases.pop(lease)
        if self.approver is not None:
            await self.approver.drop(lease)
        if self.pool is not None:
            for kernel_id in kernels:
                caller = self.pool.callers.get(kernel_id)
                if caller is not None:
                    self._revoke(caller)
                await self.pool.release(kernel_id)

    async def serve_approvals(self, lease: str, websocket: WebSocket) -> None:
        if lease not in self._leases or self.approver is None:
            await websocket.close(code=4404, reason="unknown lease")
            return
        await self.approver.serve(lease, websocket)

    # -- reconciler hooks

    async def rules_changed(self, policy: ApprovalPolicy) -> None:
        self.config = self.config.model_copy(update={"approval": policy})
        if self.approver is not None:
            self.approver.policy = policy
        logger.info("approval rules reloaded (%d rules, default %s)", len(policy.rules), policy.default)

    async def kernels_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        logger.warning("%s: recycling kernels (running code in leased kernels is lost)", "; ".join(reasons))
        async with self._kernels_lock:
            self.config = config
            await self._stop_kernels()
            await self._start_kernels()
            self._write_state()
            self.kernel_generation += 1

    # -- components

    async def _start_tool_server(self) -> None:
        server = ToolServer(
            unix_socket=self.run_dir / "tools.sock",
            media_dir=self.config.resolve(self.config.workspace.images_dir),
            # Server parameters may say where the workspace is, e.g. a data file's absolute path.
            environ={**os.environ, WORKSPACE_ENV: str(self.workspace)},
            dotenv_path=self.workspace / ".env",
        )
        server.approver = self.approver
        if self.tool_server is not None:  # a restart: the servers the reconciler registered
            for name in self.config.enabled_servers():
                server.servers.register(name, self.config.server_params(name))
        await server.start()
        self.tool_server = server
        if self.reconciler is not None:  # it registers and generates on the servers of the running one
            self.reconciler.servers = server.servers

    async def _start_kernels(self) -> None:
        config = self.config
        spec: KernelSpec | None = None
        if config.sandbox.enabled:
            # A sandbox shows the workspace's top level as it was when its kernel started: the package
            # directory is made before any kernel, so packages generated later are importable.
            config.resolve(config.workspace.mcptools_dir).mkdir(parents=True, exist_ok=True)
            policy = self._kernel_policy()
            if policy.network.allowed_domains:
                self.proxy = DomainProxy(policy.network.allowed_domains, policy.network.denied_domains)
                await self.proxy.start(self.run_dir / "proxy.sock")
            assert self.tool_server is not None and self.tool_server.unix_socket is not None
            spec = sandboxed_kernel_spec(
                policy,
                self.workspace,
                tool_socket=Path(self.tool_server.calls_address.removeprefix("unix:")),
                proxy_socket=self.proxy.unix_socket if self.proxy is not None else None,
            )
        assert self.tool_server is not None
        base_env = {**_prefixed_kernel_env(self.workspace / ".env")}
        base_env.update(resolve_placeholders(config.kernel.env, dotenv_path=self.workspace / ".env"))
        base_env[MCPTOOLS_DIR_ENV] = str(config.resolve(config.workspace.mcptools_dir))
        self.gateway = KernelGateway(
            unix_socket=self.run_dir / "gateway.sock",
            # No call token for all: each pool kernel gets one of its own (`_pool_kernel_env`), so a token
            # only ever stands for one kernel's calls.
            env={**base_env, SERVER_ENV: self.tool_server.calls_address},
            working_dir=self.workspace,
            kernel_spec=spec,
            request_env=[TOKEN_ENV],
            # The same token and socket after a restart or recycle: attached applications reconnect.
            token=self._gateway_token,
        )
        await self.gateway.start()
        self.pool = KernelPool(
            self.gateway.endpoint,
            config.kernel.warm_pool,
            self._pool_kernel_env,
            gateway_log=self.gateway.log_path,
        )
        await self.pool.start()

    async def _stop_kernels(self, *, end_leases: bool = False) -> None:
        # Leases outlive a recycle: their applications get fresh kernels under the same lease.
        for lease in list(self._leases):
            if end_leases:
                with contextlib.suppress(Exception):
                    await self.release_lease(lease)
            else:
                self._leases[lease].clear()
        if self.pool is not None:
            await self.pool.stop()
            self.pool = None
        for caller in list(self._caller_tokens):
            self._revoke(caller)
        gateway, self.gateway = self.gateway, None  # first: the watcher must not take this for a crash
        if gateway is not None:
            with contextlib.suppress(Exception):
                await gateway.stop()
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy = None

    def _kernel_policy(self) -> SandboxPolicy:
        # Kernels never need ipybox's own state (tokens, logs, the audit log): hide it, not just protect it.
        policy = self.config.sandbox.policy()
        state_dir = str(self.paths.dir)
        files = policy.filesystem.model_copy(
            update={
                "deny_read": [*policy.filesystem.deny_read, state_dir],
                "deny_write": [*policy.filesystem.deny_write, state_dir],
            }
        )
        return policy.model_copy(update={"filesystem": files})

    def _pool_kernel_env(self, caller: str) -> dict[str, str]:
        assert self.tool_server is not None
        token = self.tool_server.add_caller(caller)
        self._caller_tokens[caller] = token
        return {TOKEN_ENV: token}

    def _revoke(self, caller: str) -> None:
        token = self._caller_tokens.pop(caller, None)
        self._lease_of_caller.pop(caller, None)
        if token is not None and self.tool_server is not None:
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
            why = f"the kernel gateway exited (code {code})"
            logger.error("%s: restarting it and the warm pool%s", why, log_tail(gateway.log_path))
            self._gateway_failure = why
            started = time.monotonic()
            async with self._kernels_lock:
                await self._stop_kernels()
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

    @property
    def mcp_url(self) -> str | None:
        """The streamable HTTP MCP endpoint (`None` unless `[endpoints] mcp` and running)."""
        if self._mcp_http is None or self._mcp_http.port is None:
            return None
        host = self.config.endpoints.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self._mcp_http.port}/mcp"

    async def _sweep_mcp_sessions(self, every: float = 60, idle_for: float = MCP_SESSION_IDLE) -> None:
        # HTTP clients may vanish without closing their session: their kernels go back after a while.
        while True:
            await asyncio.sleep(every)
            if self._mcp is not None:
                await self._mcp.close_sessions(idle_for)

    async def _start_mcp_endpoint(self) -> None:

        endpoints = self.config.endpoints
        self._mcp = create_server(self.workspace, output_dir=self.paths.outputs)
        local = [endpoints.host, "127.0.0.1", "localhost", "[::1]"]
        # Browsers may only reach it from a page on the same machine; other hosts are refused.
        security = TransportSecuritySettings(
            allowed_hosts=[f"{host}:*" for host in local],
            allowed_origins=[f"http://{host}:*" for host in local],
        )
        app = self._mcp.server.streamable_http_app(transport_security=security, host=endpoints.host)
        self._mcp_http = EmbeddedServer(BearerAuth(app, self._mcp_token), "ipybox-mcp", lifespan=True)
        await self._mcp_http.start(host=endpoints.host, port=endpoints.port)
        logger.info("MCP endpoint at %s", self.mcp_url)

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
            mcp_token=self._mcp_token if self.mcp_url else None,
            ready=self._ready,
        )
        write_state(self.paths, state)

    def _start_logging(self) -> None:
        handler = StateLogHandler(self.paths)  # never through a symlink a kernel planted
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger("ipybox")
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        self._log_handler = handler

    def _stop_logging(self) -> None:
        if self._log_handler is not None:
            logging.getLogger("ipybox").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None


KERNEL_ENV_PREFIX = "KERNEL_ENV_"


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


def _prefixed_kernel_env(dotenv: Path) -> dict[str, str]:
    """`KERNEL_ENV_X` from the workspace's `.env` and the environment, as `X` (as in ipybox 0.9): the only
    variables of the host that reach kernels besides `[kernel] env`."""
    values = {k: v for k, v in dotenv_values(dotenv).items() if v is not None} if dotenv.is_file() else {}
    values.update(os.environ)
    return {
        k[len(KERNEL_ENV_PREFIX) :]: v for k, v in values.items() if k.startswith(KERNEL_ENV_PREFIX) and v
    }
