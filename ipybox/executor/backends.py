"""What runs a `CodeExecutor`'s kernel: one backend per mode, each made from its options.

- [EmbeddedBackend][ipybox.executor.backends.EmbeddedBackend] (`EmbeddedOptions`): a tool server, a kernel
  gateway (unless `ExternalGateway` names one) and a kernel of its own, all stopped with it. Its kernels
  are made by the same builder as a workspace's (`ipybox.executor.kernel_setup`): the environment is taken
  literally (no `${VAR}` placeholders, no `KERNEL_ENV_*` from `.env` or the host), so a kernel gets
  nothing of the host that the caller did not name.
- [WorkspaceBackend][ipybox.executor.backends.WorkspaceBackend] (`WorkspaceOptions`): a lease on the
  workspace `ipybox up` runs (`WorkspaceSession`): its kernels, sandbox, environment, MCP servers and rules.

Both follow [Backend][ipybox.executor.backends.Backend]: `start(hooks)` gets the executor's
[ExecutorHooks][ipybox.executor.backends.ExecutorHooks] (where approvals go, the execution clock, the
executor's lock), stops what it started when it fails, and `stop()` leaves no process behind and may be
called again. Constructing a backend starts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ipybox.approval.approver import ApproveAll
from ipybox.approval.channel import Answers, ApprovalChannel
from ipybox.approval.request import ApprovalRequest
from ipybox.config.executables import LiveKernels, ServerCodeGuard, protect
from ipybox.errors import IpyboxError
from ipybox.executor.external_kernels import ExternalKernels, request_env
from ipybox.executor.kernel_setup import StartedKernels, embedded_kernel_setup, start_kernel_gateway
from ipybox.executor.options import EmbeddedOptions, ExternalGateway, WorkspaceOptions
from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.kernel_client import KernelClient
from ipybox.mcp_client.params import ServerParams
from ipybox.mcp_client.pool import MCPServers
from ipybox.mcp_client.registry import ServerRegistry
from ipybox.rules.calls import ToolCall
from ipybox.safefs import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_OUTPUT_FILE_BYTES
from ipybox.tool_server.tool_server import ToolServer

if TYPE_CHECKING:
    from ipybox.running.attach import WorkspaceSession
    from ipybox.sandbox import DomainProxy, SandboxPolicy

__all__ = ["Backend", "EmbeddedBackend", "ExecutorHooks", "WorkspaceBackend"]

logger = logging.getLogger("ipybox")

# A check's report is one line of JSON (schemas included): never shortened to head and tail.
CHECK_OUTPUT_CHARS = 4_000_000


@dataclass(frozen=True)
class ExecutorHooks:
    """What a backend calls its executor back for.

    Attributes:
        on_approval: Gets each tool call (or shell command) to decide, as an `ApprovalRequest`.
        pause_timer: Pauses the running execution's clock while a person decides; returns the resume.
        declines: Why the running execution answers no workspace `ask` (`None`: it does).
        lock: Held by the executor while an execution runs (a check in a fresh kernel waits for it).
    """

    on_approval: Callable[[ApprovalRequest], Awaitable[None]]
    pause_timer: Callable[[], Callable[[], None]]
    declines: Callable[[ToolCall], str | None]
    lock: asyncio.Lock


class Backend(Protocol):
    """What runs an executor's kernel (see the module)."""

    client: KernelClient | None
    """The running kernel's client; `None` while stopped."""
    tool_server: ToolServer | None
    """The tool server of its own, while running (`None` for a workspace's)."""
    gateway: KernelGateway | None
    """The embedded gateway, while running."""
    proxy: DomainProxy | None
    """The sandbox's way out to allowed domains, while running."""

    @property
    def working_dir(self) -> Path:
        """The kernels' working directory (absolute)."""
        ...

    async def start(self, hooks: ExecutorHooks) -> None:
        """Start (or attach); on failure, stop again and raise."""
        ...

    async def stop(self) -> None:
        """Stop what it started; never leaves a process behind. Idempotent."""
        ...

    async def reset(self) -> None:
        """A fresh kernel; stop the MCP servers of its own."""
        ...

    async def run_in_fresh_kernel(self, code: str, timeout: float | None) -> str:
        """Run `code` in a new kernel like its own, deleted afterwards; its output text."""
        ...

    async def mcptools_dir(self) -> Path:
        """Where the generated tool packages are (absolute)."""
        ...


class EmbeddedBackend:
    """A tool server, a gateway (unless external) and a kernel of the executor's own (see the module)."""

    def __init__(self, options: EmbeddedOptions) -> None:
        self.options = options
        self.client: KernelClient | None = None
        self.tool_server: ToolServer | None = None
        self.gateway: KernelGateway | None = None
        self.proxy: DomainProxy | None = None
        self._kernels: StartedKernels | None = None
        self._hooks: ExecutorHooks | None = None
        self._working_dir = options.working_dir
        self._mcptools_dir = options.tools.mcptools_dir or self._working_dir / "mcptools"
        # Kernels of a gateway given by URL: set up over the tool server's TLS listener before use.
        self._external: ExternalKernels | None = None

    @property
    def working_dir(self) -> Path:
        return self._working_dir

    async def start(self, hooks: ExecutorHooks) -> None:
        o = self.options
        self._hooks = hooks
        try:
            policy = None
            if o.kernel.sandbox is not None:
                from ipybox.sandbox import SandboxPolicy

                config = o.kernel.sandbox.config
                policy = SandboxPolicy.from_file(config) if config else SandboxPolicy()
            if isinstance(o.gateway, ExternalGateway):
                self._external = ExternalKernels(o.gateway, self._mcptools_dir.absolute())
                await self._external.check()  # before anything starts: one clear error
            policy, prepare = self._guard_servers(policy)
            self.tool_server = self._create_tool_server(hooks, prepare)
            await self.tool_server.start()
            setup = embedded_kernel_setup(
                self._working_dir,
                o.kernel.env,
                sandbox=policy,
                mcptools_dir=self._mcptools_dir,
                approve_shell=o.approval.shell_cmds,
                require_shell_escape=o.approval.require_shell_escape,
                # As in ipybox 0.9.2: only a working_dir the caller names is restored before each cell.
                reset_cwd=o.kernel.working_dir is not None,
                limits=o.kernel.limits,
            )
            address, token = self.tool_server.calls_address, self.tool_server.call_token
            kernel_env: dict[str, str] | None = None
            if isinstance(o.gateway, ExternalGateway):
                assert self._external is not None  # made above
                endpoint = self._external.endpoint
                # A gateway of someone else's, whose kernels may share no file with this machine: they
                # get the environment, the call token and where to call with their set-up; the start
                # request carries only what the gateway's kernel templates read.
                self._external.bind(self.tool_server, setup)
                kernel_env = request_env(o.kernel.env) or None
            else:
                self._kernels = await start_kernel_gateway(
                    setup,
                    address,
                    tool_token=token,
                    host=o.gateway.host,
                    port=o.gateway.port,
                    log_level=o.log_level,
                )
                self.gateway, self.proxy = self._kernels.gateway, self._kernels.proxy
                endpoint = self.gateway.endpoint
            out = o.output
            self.client = KernelClient(
                endpoint,
                images_dir=out.images_dir,
                output_dir=out.output_dir,
                max_output_chars=out.max_output_chars,
                max_output_file_bytes=out.max_output_file_bytes or DEFAULT_MAX_OUTPUT_FILE_BYTES,
                max_image_bytes=out.max_image_bytes or DEFAULT_MAX_IMAGE_BYTES,
                kernel_env=kernel_env,
                spare_kernel=o.kernel.spare_kernel,
                ready_timeout=o.kernel.init_timeout,
                # A kernel that dies while starting is reported with the end of the gateway's log.
                gateway_log=self.gateway.log_path if self.gateway is not None else None,
                # A cell whose gateway died says how it died (an external gateway's is not known).
                gateway_loss=self._gateway_loss if self.gateway is not None else None,
                # The spare imports what a tool call needs before it is taken: ipybox's own kernels, and
                # an external gateway's once set up (which needs ipybox in them).
                warm_up=True,
                kernel_name=o.gateway.kernelspec if isinstance(o.gateway, ExternalGateway) else None,
                set_up=self._external.set_up if self._external is not None else None,
            )
            await self.client.connect()
        except BaseException:
            await self.stop()
            raise

    def _guard_servers(
        self, policy: SandboxPolicy | None
    ) -> tuple[SandboxPolicy | None, Callable[[str, ServerParams, bool], Awaitable[ServerParams]]]:
        """Kernels get what the servers known now execute read-only (`policy` extended), and a server
        whose code they can still write is refused when it starts (`ServerCodeWritableError`, by the
        `prepare` returned); a sandboxed server gets the same paths read-only (`ipybox.config.executables`)."""
        live: list[LiveKernels] = []
        guard = ServerCodeGuard(
            self._working_dir, self._known_servers, lambda: live, dotenv_path=self._working_dir / ".env"
        )
        if policy is not None:
            policy = protect(policy, guard.derive())
            live.append(LiveKernels("a kernel of this executor", policy))

        async def prepare(name: str, params: ServerParams, secrets: bool) -> ServerParams:
            return guard.check(name, params, secrets=secrets)

        return policy, prepare

    def _known_servers(self) -> dict[str, Mapping[str, Any]]:
        """`mcp_servers` and the servers generated into the package roots, as far as the registry says."""
        tools, found = self.options.tools, {}
        registry = ServerRegistry()
        for root in [self._mcptools_dir, *tools.package_roots]:
            with contextlib.suppress(IpyboxError, OSError):  # unreadable: checked when it starts
                found.update({f"{name} ({root})": params for name, params in registry.servers(root).items()})
        return {**found, **tools.mcp_servers}

    async def _gateway_loss(self) -> str | None:
        how = await self.gateway.exited(timeout=1.0) if self.gateway is not None else None
        return f"it exited with {how}" if how is not None else None

    def _create_tool_server(
        self, hooks: ExecutorHooks, prepare: Callable[[str, ServerParams, bool], Awaitable[ServerParams]]
    ) -> ToolServer:
        o, mcptools_dir = self.options, self._mcptools_dir
        registry = ServerRegistry()
        servers = MCPServers(
            # A name resolves to `mcp_servers`, else to the server generated into the package root the
            # calling module sits in, else to the registry under `mcptools_dir` (found on first use, so
            # sources generated after the executor started work too); see `MCPServers.resolve_key`.
            o.tools.mcp_servers,
            connect_timeout=o.tools.connect_timeout,
            dotenv_path=self._working_dir / ".env",
            lookup=lambda name: registry.servers(mcptools_dir).get(name),
            # Annotations recorded at generation decide a server's calls before it first starts here
            # (only for the parameters they were listed with).
            annotations_lookup=lambda name, params: registry.recorded_annotations(mcptools_dir, name, params),
            package_lookup=registry.package_server,
            # The roots a kernel's call may name are the host's choice: another project's directory, named
            # by code in the kernel, starts nothing (`ForeignPackageRootError`).
            package_roots=[mcptools_dir, *o.tools.package_roots],
            prepare=prepare,
        )
        approval = ApprovalChannel(
            True, o.approval.timeout, handler=hooks.on_approval, pause=hooks.pause_timer
        )
        external = self._external
        return ToolServer(
            # Kernels of an external gateway call over TLS and import the generated packages from here.
            remote=external.remote_calls() if external is not None else None,
            module_roots=external.tool_server_roots() if external is not None else None,
            host=o.tools.server_host,
            port=o.tools.server_port,
            log_level=o.log_level,
            servers=servers,
            media_dir=o.output.images_dir or Path("images"),
            max_image_bytes=o.output.max_image_bytes or DEFAULT_MAX_IMAGE_BYTES,
            approval=approval,
            # Shell commands always go to `approval`, whether tool calls are asked about or not.
            approver=approval if o.approval.tool_calls else ApproveAll(),
            shell_approver=approval,
        )

    async def stop(self) -> None:
        client, self.client = self.client, None
        kernels, self._kernels = self._kernels, None
        tool_server, self.tool_server = self.tool_server, None
        external, self._external = self._external, None
        self.gateway = self.proxy = None
        try:
            if client is not None:
                # An embedded gateway ends all its kernels when it stops.
                await client.disconnect(shutdown_kernels=kernels is None)
        finally:
            try:
                if kernels is not None:
                    await kernels.stop()
            finally:
                try:
                    if tool_server is not None:
                        await tool_server.stop()
                finally:
                    if external is not None:
                        external.close()  # the certificate directory it made

    async def reset(self) -> None:
        client, tool_server = self._running()
        await asyncio.gather(client.reset(), tool_server.reset())

    def _running(self) -> tuple[KernelClient, ToolServer]:
        if self.client is None or self.tool_server is None:
            raise RuntimeError("the code executor is not running: use 'async with CodeExecutor()' or start()")
        return self.client, self.tool_server

    async def run_in_fresh_kernel(self, code: str, timeout: float | None) -> str:
        own, _ = self._running()
        assert self._hooks is not None  # set by start()
        out = self.options.output
        # Another kernel of the same gateway, with the same kernelspec and environment (sandboxed when
        # the executor is); deleted afterwards.
        client = KernelClient(
            own.endpoint,
            images_dir=out.images_dir,
            output_dir=out.output_dir,
            max_output_chars=CHECK_OUTPUT_CHARS,
            max_output_file_bytes=own.max_output_file_bytes,
            max_image_bytes=own.max_image_bytes,
            kernel_name=own.kernel_name,
            kernel_env=own.kernel_env,
            set_up=own.set_up,  # an external gateway's kernel is set up as the executor's own are
            spare_kernel=False,
            ready_timeout=self.options.kernel.init_timeout,
            gateway_log=own.gateway_log,
        )
        # Under the executor's lock, no execution runs: a tool call the checked code makes is rejected
        # (the executor's `on_approval`), never shown as one of an execution's approvals.
        async with self._hooks.lock:
            await client.connect()  # disconnects itself when it fails
            try:
                return (await client.execute(code, timeout)).text or ""
            finally:
                await client.disconnect()

    async def mcptools_dir(self) -> Path:
        return self._mcptools_dir.absolute()


class WorkspaceBackend:
    """A lease on a running workspace: its kernels, MCP servers and rules (see the module)."""

    tool_server: ToolServer | None = None  # the workspace's supervisor runs it
    gateway: KernelGateway | None = None
    proxy: DomainProxy | None = None

    def __init__(self, options: WorkspaceOptions) -> None:
        self.options = options
        self.answers: Answers = options.answers
        self.client_name: str | None = options.client
        self.client: KernelClient | None = None
        self._session: WorkspaceSession | None = None

    @property
    def working_dir(self) -> Path:
        return self.options.workspace

    async def start(self, hooks: ExecutorHooks) -> None:
        from ipybox.running.attach import WorkspaceSession

        o = self.options
        file_bytes, image_bytes = self._file_caps()
        session = WorkspaceSession(
            o.workspace,
            hooks.on_approval,
            hooks.pause_timer,
            images_dir=o.output.images_dir,
            output_dir=o.output.output_dir,
            max_output_chars=o.output.max_output_chars,
            max_output_file_bytes=file_bytes,
            max_image_bytes=image_bytes,
            kernel_init_timeout=o.kernel_init_timeout,
            answers=self.answers,
            declines=hooks.declines,
            client=self.client_name,
        )
        await session.open()  # closes itself when it fails
        self._session, self.client = session, session.kernel_client

    def _file_caps(self) -> tuple[int, int]:
        """`max_output_file_bytes` and `max_image_bytes`: as given, else as the workspace's ipybox.toml
        says (`[kernel]`), else the defaults (an ipybox.toml that does not load now, mid-edit)."""
        file_bytes, image_bytes = (
            self.options.output.max_output_file_bytes,
            self.options.output.max_image_bytes,
        )
        if file_bytes is None or image_bytes is None:
            from ipybox.config import ConfigError, load_config

            try:
                kernel = load_config(self.options.workspace).kernel
                file_bytes = file_bytes or kernel.max_output_file_bytes
                image_bytes = image_bytes or kernel.max_image_bytes
            except (ConfigError, OSError) as e:
                logger.warning("%s; the output file limits are the defaults", e)
        return file_bytes or DEFAULT_MAX_OUTPUT_FILE_BYTES, image_bytes or DEFAULT_MAX_IMAGE_BYTES

    async def stop(self) -> None:
        session, self._session, self.client = self._session, None, None
        if session is not None:
            await session.close()

    async def reset(self) -> None:
        # The workspace's MCP servers are shared with other sessions: they keep running.
        await self._running().reset()

    def _running(self) -> KernelClient:
        if self.client is None:
            raise RuntimeError("the code executor is not running: use 'async with CodeExecutor()' or start()")
        return self.client

    async def run_in_fresh_kernel(self, code: str, timeout: float | None) -> str:
        from ipybox.running.attach import WorkspaceSession

        own, o = self._running(), self.options

        async def reject(request: ApprovalRequest) -> None:
            await request.reject()  # not reached: the workspace refuses a check lease's asks itself

        # A second, short lease: a fresh kernel from the workspace's pool (its sandbox, environment and
        # rules), given back (deleted) afterwards; the session's own kernel keeps its state.
        session = WorkspaceSession(
            o.workspace,
            reject,
            lambda: lambda: None,
            images_dir=o.output.images_dir,
            output_dir=o.output.output_dir,
            max_output_chars=CHECK_OUTPUT_CHARS,
            max_output_file_bytes=own.max_output_file_bytes,
            max_image_bytes=own.max_image_bytes,
            kernel_init_timeout=o.kernel_init_timeout,
            check=True,  # the workspace refuses its kernel's asks: nobody is asked
        )
        await session.open()  # closes itself when it fails
        try:
            return (await session.kernel_client.execute(code, timeout)).text or ""
        finally:
            await session.close()

    async def mcptools_dir(self) -> Path:
        # The running workspace's own (fixed by the first configuration it applied), else ipybox.toml's.
        if self._session is None:
            raise RuntimeError("the code executor is not running: use 'async with CodeExecutor()' or start()")
        known = (await self._session.control.status()).reconciler.mcptools_dir
        if known is not None:
            return Path(known)
        from ipybox.config import load_config

        config = load_config(self.options.workspace)
        return config.resolve(config.workspace.mcptools_dir)
