"""`KernelsService`: a workspace's kernels: the kernel gateway (sandboxed kernels, the filtering proxy), the
warm pool, the leases that hold its kernels, their health (the idle reaper) and restarts.

Contract:

- `start()` starts the gateway (with the proxy, when the sandbox allows domains) and fills the warm pool in
  the background; then it watches the gateway and runs the reaper (`KernelHealth.reap`), both in the
  service's task group. `aclose()` stops them first, then releases every lease (their approval channels
  are disconnected, so pending asks are not approved), stops the pool, the gateway and the proxy.
- Every pool kernel gets a tool token of its own (`tools.add_caller`), so a token only ever stands for one
  kernel's calls; a kernel that leaves (released, replaced, reaped, its gateway gone) has its token revoked.
- A gateway that exits while the service runs is restarted with a new pool (`restarts` + 1, the same
  socket and token: attached applications reconnect); leases stay, and each gets its next kernel with why
  the previous one went (`KernelLeased.lost`). `recycle()` does the same on purpose (an edit of the
  kernels' settings, a new tool server). Both hold `lock`, which a claim of a kernel waits for, and call
  `on_new_gateway()` (the supervisor rewrites `state.json`); `generation` counts them.
- A claim whose gateway exits under it waits for the restart and claims again (`_LEASE_ATTEMPTS` times).
- What the MCP servers execute is protected from kernels (`prepare_server()`, the tool server's hook
  before a server starts): the gateway's kernel spec gets a policy that mounts it read-only and the idle
  kernels are replaced; leased kernels keep the policy they started with (`live_kernels()`), and the
  guard (`ServerCodeGuard`) refuses a server a kernel could still write to.

The diagram of the services and the data path: `docs/design.md`, "Services" and "Data path".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ipybox.codeact.layout import module_roots
from ipybox.config import CONFIG_FILE, WorkspaceConfig
from ipybox.config.executables import LiveKernels, ServerCodeGuard
from ipybox.config.secrets import ResolvedSecret
from ipybox.config.sections import KernelSection
from ipybox.executor.kernel_setup import KernelSetup, start_kernel_gateway, workspace_kernel_setup
from ipybox.executor.remote_kernels import remote_gateway_of, remote_start_env
from ipybox.in_kernel.call_protocol import SERVER_ENV
from ipybox.in_kernel.mcptools_refresh import MCPTOOLS_DIR_ENV
from ipybox.in_kernel.tool_runner import TOKEN_ENV
from ipybox.in_kernel.working_dir import CWD_RESET_ENV
from ipybox.kernels.gateway import KernelGateway, describe_exit
from ipybox.kernels.kernel_client import KernelClient
from ipybox.kernels.kernel_connection import (
    GatewayError,
    GatewayUnreachableError,
    KernelConnection,
    log_tail,
)
from ipybox.kernels.pool import KernelPool, PoolStoppedError
from ipybox.kernels.remote_gateway import RemoteGateway
from ipybox.kernels.remote_setup import RemoteKernelSetup
from ipybox.kernels.remote_setup import set_up as set_up_remote_kernel
from ipybox.lifecycle import Service, ServiceState, task_scope
from ipybox.mcp_client.params import ServerParams
from ipybox.running.status import CallerId, CallerToken, KernelId, KernelLeased, LeaseId
from ipybox.sandbox import DomainProxy, SandboxPolicy
from ipybox.sandbox.host_asks import HostAsker
from ipybox.supervisor.kernel_health import KernelHealth
from ipybox.supervisor.leases import LeaseTable
from ipybox.supervisor.tools import WORKSPACE_ENV, ToolsService

logger = logging.getLogger("ipybox.supervisor")

# Claims a lease makes across gateway restarts before it gives up (each waits for one restart).
_LEASE_ATTEMPTS = 3
REMOTE_CHECK_INTERVAL = 2.0
"""Seconds between two checks that a remote gateway (`[kernel.gateway]`) still answers."""
TRUST_DIR = "trust"
"""In the run directory: the trust bundle of the proxy's interception CA, which sandboxed kernels read."""
# Seconds code run by `run_in_fresh_kernel` (a check of agent-written modules) may run.
_CHECK_TIMEOUT = 60
# Why the asks of a kernel that checks agent-written code are refused (nobody is asked: a person would be
# asked about calls of code nobody chose to run, and the check would wait for the answer).
PARSER_CHECK_REFUSAL = "checking an output parser asks nobody: tool calls are refused while it is checked"
CHECK_REFUSAL = (
    "checking agent-written code (a code action being saved or described) asks nobody: tool calls are "
    "refused while it is checked"
)


class KernelsService(Service):
    """The gateway, the warm pool, leases, health and restarts; see the module docstring.

    Args:
        workspace: The workspace directory.
        state_dir: Its state directory.
        run_dir: The supervisor's private run directory (the gateway's and the proxy's sockets).
        gateway_token: The gateway's token, the same across restarts.
        leases: Who holds which kernel (shared with the asks: who answers a kernel's calls).
        tools: The tool server the kernels call.
        config: The configuration the kernels start with, the servers last applied included.
        settings: `[kernel]` in effect now (the reaper's `max_idle`, `recycle_rss`).
        forget_session: Called with a lease being released: its answers "for this session" end.
        on_new_gateway: Called after a restart or a recycle started a new gateway.
        on_failure: Called when a watcher of the service fails (a bug).
        secrets: `[secrets]` resolved on the host: the proxy puts them in requests to their hosts, kernels
            get placeholders (`workspace_kernel_setup`); the trust bundle kernels use is written to
            `run_dir`'s `trust` directory (which sandboxed kernels may read, not write).
        ask_host: Who the proxy asks about a host no entry allows, with `[sandbox.network] unknown = "ask"`
            (`WorkspaceApprover.ask_host`: the connecting kernel's application and MCP client, and the
            people, or only the people when the connection can't be attributed to a leased kernel).
    """

    def __init__(
        self,
        workspace: Path,
        state_dir: Path,
        run_dir: Path,
        *,
        gateway_token: str,
        leases: LeaseTable,
        tools: ToolsService,
        config: Callable[[], WorkspaceConfig],
        settings: Callable[[], KernelSection],
        forget_session: Callable[[LeaseId], None],
        on_new_gateway: Callable[[], None],
        on_failure: Callable[[BaseException], None] | None = None,
        secrets: Mapping[str, ResolvedSecret] | None = None,
        ask_host: HostAsker | None = None,
    ) -> None:
        super().__init__("kernels", on_failure=on_failure)
        self.ask_host = ask_host
        self.secrets: Mapping[str, ResolvedSecret] = dict(secrets or {})
        self.workspace, self.state_dir, self.run_dir = workspace, state_dir, run_dir
        self.gateway_token = gateway_token
        self.leases = leases
        self.tools = tools
        self.config = config
        self.settings = settings
        self.forget_session = forget_session
        self.on_new_gateway = on_new_gateway
        self.gateway: KernelGateway | RemoteGateway | None = None
        self.pool: KernelPool | None = None
        self.proxy: DomainProxy | None = None
        self.health = KernelHealth(self)  # kernels' usage for the status; the idle kernel reaper
        self.lock = asyncio.Lock()  # held while kernels are recycled or restarted
        self.generation = 0  # kernels recycled or restarted this many times
        self.restarts = 0  # gateway restarts
        self.failure_reason: str | None = None  # why the gateway is down, while it is
        # The sandbox policy each version of the gateway's kernel spec confines kernels by (`None`:
        # unsandboxed), newest last: it changes when what the host executes does (`protect_servers`).
        self._spec_policies: list[SandboxPolicy | None] = []
        # Kernels of a remote gateway: what each is told when it is set up.
        self._remote_setup: RemoteKernelSetup | None = None
        self.guard = ServerCodeGuard(
            workspace,
            self._known_servers,
            self.live_kernels,
            environ={**os.environ, WORKSPACE_ENV: str(workspace)},
            dotenv_path=workspace / ".env",
        )

    def _setup(self, config: WorkspaceConfig | None = None) -> KernelSetup:
        """What local kernels start with: the workspace's setup, with the secrets and the trust bundle."""
        return workspace_kernel_setup(
            config or self.config(),
            self.workspace,
            self.state_dir,
            secrets=self.secrets,
            trust_dir=self.run_dir / TRUST_DIR,
        )

    @property
    def _stopping(self) -> bool:
        return self.state in (ServiceState.CLOSING, ServiceState.CLOSED)

    async def _startup(self) -> None:
        await self._start()
        self.spawn(self._watch_gateway(), name="ipybox-gateway-watch")
        self.spawn(self.health.reap(), name="ipybox-kernel-reaper")

    async def _shutdown(self) -> None:
        await self._stop(end_leases=True)

    # -- starting, stopping, recycling

    async def _start(self) -> None:
        if self.config().kernel.gateway is not None:
            await self._start_remote()
            return
        # The same builder as `CodeExecutor`'s embedded gateway; what differs is described by the setup.
        setup = self._setup()
        kernels = await start_kernel_gateway(
            setup,
            self.tools.calls_address,
            # No call token for all: each pool kernel gets one of its own (`_kernel_env`), so a token only
            # ever stands for one kernel's calls.
            request_env=[TOKEN_ENV],
            unix_socket=self.run_dir / "gateway.sock",
            # The same token and socket after a restart or recycle: attached applications reconnect.
            token=self.gateway_token,
            proxy_socket=self.run_dir / "proxy.sock",
            ask_host=self.ask_host,
        )
        self.gateway, self.proxy = kernels.gateway, kernels.proxy
        self.pool = KernelPool(
            self.gateway.endpoint,
            self.config().kernel.warm_pool,
            self._kernel_env,
            gateway_log=self.gateway.log_path,
            # What the first tool call in a kernel needs is imported before the kernel is handed out.
            warm_up=True,
        )
        self._spec_policies.append(setup.sandbox)
        self.pool.version = len(self._spec_policies) - 1
        await self.pool.start()

    async def _start_remote(self) -> None:
        """Kernels of `[kernel.gateway]`: no gateway process here; each kernel is set up over the call
        channel's TLS listener before it is pooled (`ipybox.kernels.remote_setup`)."""
        config = self.config()
        remote = remote_gateway_of(config)
        await remote.start()
        setup = workspace_kernel_setup(config, self.workspace, self.state_dir)
        address = self.tools.remote_address()
        env = setup.kernel_env(address)
        # Host paths mean nothing there: generated packages come over the channel, cells start where the
        # kernel does.
        for name in (MCPTOOLS_DIR_ENV, CWD_RESET_ENV, SERVER_ENV):
            env.pop(name, None)
        self._remote_setup = RemoteKernelSetup(
            calls_address=address,
            certificate_pem=self.tools.remote_certificate_pem(),
            module_roots={
                name: str(path)
                for name, path in module_roots(config.resolve(config.workspace.mcptools_dir)).items()
            },
            env=env,
            shell_approval=config.kernel.approve_shell,
        )
        self.gateway = remote
        self.pool = KernelPool(
            remote.endpoint,
            config.kernel.warm_pool,
            self._remote_kernel_env,
            ready_timeout=config.kernel.gateway.start_timeout if config.kernel.gateway else None,
            warm_up=True,
            kernel_name=remote.kernel_name,
            set_up=self._set_up_remote,
        )
        self._spec_policies.append(None)  # the cluster isolates them, not a policy of ours
        self.pool.version = len(self._spec_policies) - 1
        await self.pool.start()

    def _remote_kernel_env(self, caller: str) -> dict[str, str]:
        # What the gateway's templates read; the call token goes to the kernel in its set-up, never in the
        # start request (which the gateway may log or write into a pod spec).
        return remote_start_env(self.config().kernel.limits)

    async def _set_up_remote(self, kernel: KernelConnection, caller: str) -> None:
        assert self._remote_setup is not None  # set before the pool starts
        # The token is made for a kernel that answered, and revoked when its set-up fails (the pool
        # deletes that kernel): no start leaves a working token behind.
        token = self._kernel_env(caller)[TOKEN_ENV]
        try:
            await set_up_remote_kernel(kernel, self._remote_setup, token)
        except BaseException:
            self._revoke([CallerToken(token)])
            raise

    async def _stop(self, *, end_leases: bool = False, lost: str | None = None) -> None:
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

    async def recycle(self, why: str, *, secrets: Mapping[str, ResolvedSecret] | None = None) -> None:
        """Replace every kernel (and the gateway) by ones started from `config()` now; a leased kernel's
        application is told `why` with its next kernel. With `secrets` (resolved again), the new kernels
        and their proxy use those instead."""
        async with self.lock:
            if secrets is not None:  # under the lock: no kernel starts with them before the new proxy
                self.secrets = dict(secrets)
            await self._stop(lost=f"ipybox restarted it to apply a change ({why})")
            await self._start()
            self.on_new_gateway()
            self.generation += 1

    async def update_network(self, config: WorkspaceConfig) -> str | None:
        """Make the running kernels' proxy filter by `config`'s network policy (`[sandbox.network]`
        `allowedDomains`, `deniedDomains`, `readOnly`, `unknown`) from their next connection on, without replacing
        them (`DomainProxy.update`; connections open now keep the policy they were opened under).

        Returns:
            `None` when it applies (or there is nothing to apply: kernels not sandboxed, or not running),
            else why it can't, for the caller to replace the kernels instead: no proxy runs (a remote
            gateway, a sandbox that allowed no domain), or the proxy refused the policy (an entry
            becomes restricted that its interception CA was not made for).
        """
        async with self.lock:  # not while a recycle or restart replaces the proxy
            if not config.sandbox.enabled or self.gateway is None:
                return None
            proxy = self.proxy
            if proxy is None:
                return "the kernels have no filtering proxy to update"
            network = config.sandbox.policy().network
            try:
                proxy.update(
                    network.allowed_domains,
                    network.denied_domains,
                    read_only=network.read_only,
                    unknown=network.unknown,
                )
            except ValueError as e:
                return str(e)
            if self._spec_policies and (last := self._spec_policies[-1]) is not None:
                # The gateway's spec is unchanged (the proxy's socket is all a sandbox knows of the policy):
                # record the policy it now confines kernels by, so `protect_servers` compares like with like.
                self._spec_policies[-1] = last.model_copy(update={"network": network})
            return None

    async def _watch_gateway(self) -> None:
        while True:
            gateway = self.gateway
            if gateway is None:
                await asyncio.sleep(0.5)
                continue
            if isinstance(gateway, RemoteGateway):
                await self._watch_remote(gateway)
                continue
            code = await gateway_exit(gateway)
            if gateway is not self.gateway:  # replaced on purpose (a recycle)
                continue
            how = describe_exit(code) if code is not None else "an unknown status"
            why = f"the kernel gateway exited with {how}"
            logger.error("%s: restarting it and the warm pool%s", why, log_tail(gateway.log_path))
            self.failure_reason = why
            started = time.monotonic()
            # A claim holds the lock while it waits for a kernel of the pool: stopping the dead gateway's
            # pool first fails such a claim at once (it claims again from the new pool), so the restart
            # never waits behind it.
            if self.pool is not None:
                await self.pool.stop()
            async with self.lock:
                await self._stop(lost=f"it exited with {how} and ipybox restarted it")
                try:
                    await self._start()
                except Exception as e:
                    self.failure_reason = f"{why}, and restarting it failed: {e}"
                    logger.error("could not restart the kernel gateway: %s; retrying in 2 s", e)
                    await asyncio.sleep(2)
                    continue
                self.on_new_gateway()
                self.generation += 1
            self.failure_reason = None
            self.restarts += 1
            logger.info("kernel gateway restarted in %.1f s", time.monotonic() - started)

    # -- leases

    def _kernel_env(self, caller: str) -> dict[str, str]:
        token = self.tools.add_caller(caller)
        self.leases.add_caller(CallerId(caller), CallerToken(token))
        return {TOKEN_ENV: token}

    def _revoke(self, tokens: Iterable[CallerToken]) -> None:
        for token in tokens:
            self.tools.remove_caller(token)

    async def lease_kernel(self, lease: LeaseId) -> KernelLeased:
        """A ready kernel of the pool for `lease`, in place of the one it held.

        Raises:
            UnknownLeaseError: No such lease (also: released while the kernel was claimed).
            GatewayError: No kernel could be had (the gateway is down or restarting).
        """
        self.leases.kernels(lease)  # an unknown lease fails before a kernel is claimed for it
        pool, kernel_id = await self._claim()
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

    async def _claim(self) -> tuple[KernelPool, str]:
        for attempt in range(_LEASE_ATTEMPTS):
            async with self.lock:  # not while kernels are being recycled or restarted
                pool, gateway = self.pool, self.gateway
                if pool is None or gateway is None:
                    raise GatewayError(
                        f"the kernel gateway is not running: {self.failure_reason or 'stopped'}"
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

    async def _watch_remote(self, remote: RemoteGateway) -> None:
        """Until `remote` stops answering and then answers again, when its kernels are gone (a restarted
        gateway ends its kernels): then, as for a local gateway that exited, a new pool, and the leases'
        next kernels come with why the previous ones went."""
        pool = self.pool
        trouble = pool.gateway_trouble if pool is not None else 0
        while (problem := await remote.check()) is None:
            if pool is not None and pool.gateway_trouble > trouble:
                # Answering, but the pool lost a kernel's connection or found the gateway unreachable
                # meanwhile: a restart quicker than the checks.
                problem = f"the gateway at {remote.url} dropped its kernels' connections (restarted?)"
                break
            await asyncio.sleep(REMOTE_CHECK_INTERVAL)
            if remote is not self.gateway:
                return
        self.failure_reason = problem
        logger.error(
            "the gateway at %s: %s: waiting for it to answer (its kernels are lost)", remote.url, problem
        )
        started = time.monotonic()
        await remote.wait_until_answering(REMOTE_CHECK_INTERVAL)
        if remote is not self.gateway:
            return
        async with self.lock:
            await self._stop(lost=problem)
            try:
                await self._start()
            except Exception as e:
                self.failure_reason = f"{problem}, and starting kernels there again failed: {e}"
                logger.error("could not start kernels on the gateway at %s again: %s", remote.url, e)
                await asyncio.sleep(REMOTE_CHECK_INTERVAL)
                return
            self.on_new_gateway()
            self.generation += 1
        self.failure_reason = None
        self.restarts += 1
        logger.info(
            "the gateway at %s answers again after %.1f s: new pool", remote.url, time.monotonic() - started
        )

    async def _gateway_replaced(self, gateway: KernelGateway | RemoteGateway) -> bool:
        """Whether `gateway` exited (or was replaced) and is being restarted; waits up to a second for a
        gateway that just refused connections to be seen exiting, and for `_watch_gateway` to take over."""
        if isinstance(gateway, RemoteGateway):
            # Not this machine's to restart: a claim fails now, with what the watcher saw, rather than
            # waiting for it to come back.
            return gateway is not self.gateway and not self._stopping
        if gateway.running and gateway is self.gateway:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gateway_exit(gateway), 1.0)
            if gateway.running:
                return False
        # `_watch_gateway` notices the exit within its poll interval and takes the lock, which the next
        # claim then waits for until the new gateway is up.
        for _ in range(50):
            if self.gateway is not gateway or self.lock.locked() or self._stopping:
                break
            await asyncio.sleep(0.02)
        return not self._stopping

    async def release_lease(self, lease: LeaseId) -> None:
        """Give back `lease`: its kernels are deleted, their tokens revoked, its approval channel closed.

        Raises:
            UnknownLeaseError: No such lease.
        """
        released = self.leases.release(lease)
        self.forget_session(lease)  # its answers "for this session" end with it
        if released.channel is not None:
            await released.channel.disconnect()  # its pending asks are not approved
        self._revoke(released.tokens)
        if self.pool is not None:
            for kernel_id in released.kernels:
                await self.pool.release(kernel_id)

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

    def kernel_settings(self) -> KernelSection:
        return self.settings()

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

            async def kernel_source() -> str:
                return (await self.lease_kernel(lease)).kernel_id

            # The client talks to the gateway read here, and its kernel is claimed from the pool after (the
            # claim waits while kernels are being replaced): when an edit replaced the gateway meanwhile,
            # the kernel is on the new one and the old one is gone. Then it is tried once more, on the new
            # gateway (a second replacement within one check is an error like any other).
            for attempt in range(2):
                gateway = self.gateway
                if gateway is None:
                    raise GatewayError(
                        f"the kernel gateway is not running: {self.failure_reason or 'stopped'}"
                    )
                client = KernelClient(gateway.endpoint, kernel_source=kernel_source, spare_kernel=False)
                try:
                    await client.connect()
                except GatewayError:
                    if attempt == 0 and self.gateway is not gateway:
                        logger.info(
                            "the kernel gateway was replaced while a check started: starting it again"
                        )
                        continue
                    raise
                break
            try:
                result = await client.execute(code, timeout=_CHECK_TIMEOUT)
            finally:
                await client.disconnect()
            return result.text or ""
        finally:
            # Also when cancelled (a check that took too long): the lease's kernel is deleted, by a task of
            # the service's group that the cancellation does not reach.
            try:
                release = self.spawn(self._release_quietly(lease), name="ipybox-check-release")
            except RuntimeError:  # closing (which releases every lease), or the group failed
                await self._release_quietly(lease)
            else:
                await asyncio.shield(release)

    async def _release_quietly(self, lease: LeaseId) -> None:
        with contextlib.suppress(Exception):  # released already (e.g. by closing)
            await self.release_lease(lease)

    # -- what the host executes (see `ipybox.config.executables`)

    async def prepare_server(self, name: str, params: ServerParams, secrets: bool) -> ServerParams:
        """Before a server starts: kernels get what it executes read-only, then the guard refuses it if
        a kernel can still write any of it (`ServerCodeWritableError`), or protects a sandboxed one."""
        await self.protect_servers()
        return self.guard.check(name, params, secrets=secrets)

    def _known_servers(self) -> dict[str, dict[str, Any]]:
        config = self.config()
        return {name: config.server_params(name) for name in config.enabled_servers()}

    async def protect_servers(self) -> None:
        """Make the gateway start kernels whose policy protects what the servers execute now, and replace
        the idle kernels, when that differs from what the gateway's spec protects. Leased kernels keep
        the policy they started with until their session resets (see `live_kernels`)."""
        async with self.lock:
            gateway, pool = self.gateway, self.pool
            if gateway is None or pool is None or self.tools.server is None or not self._spec_policies:
                return
            if isinstance(gateway, RemoteGateway):
                return  # its kernels see nothing of this machine's (they import over the channel)
            setup = self._setup()
            if setup.sandbox is None or setup.sandbox == self._spec_policies[-1]:
                return
            proxy_socket = self.run_dir / "proxy.sock" if setup.needs_proxy else None
            spec = setup.kernel_spec(self.tools.calls_address, proxy_socket)
            assert spec is not None  # sandboxed
            gateway.update_kernel_spec(spec)
            self._spec_policies.append(setup.sandbox)
            logger.info("what the MCP servers execute changed: kernels get it read-only, idle ones replaced")
            await pool.recycle(len(self._spec_policies) - 1)

    def live_kernels(self) -> list[LiveKernels]:
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


async def gateway_exit(gateway: KernelGateway) -> int | None:
    """Wait for the gateway process to exit and return its exit code.

    Sooner than `gateway.join()`, which returns once the gateway's stdout is closed, and its kernels keep
    it open until they notice that the gateway is gone (a second or more later).
    """
    async with task_scope() as group:
        join = group.create_task(gateway.join())
        while gateway.running and not join.done():
            await asyncio.wait([join], timeout=0.2)
        join.cancel()
    process = gateway._process
    return process.returncode if process is not None else None
