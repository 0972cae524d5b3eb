"""`CodeExecutor`: the main entry point of the SDK.

One class, two backends, chosen in `__init__` by `workspace=`:

- embedded (no `workspace`): a tool server, a kernel gateway (unless `kernel_gateway_url` names one) and a
  kernel of its own, all stopped with the executor. Its kernels are made by the same builder as a
  workspace's (`ipybox.executor.kernel_setup`), from `embedded_kernel_setup`: `kernel_env` is taken
  literally (no `${VAR}` placeholders, no `KERNEL_ENV_*` from `.env` or the host), so the kernel gets
  nothing of the host that the caller did not name.
- workspace (`workspace=DIR`): a lease on the workspace `ipybox up` runs in DIR (`WorkspaceSession`): its
  kernels, sandbox, environment, MCP servers and approval rules.

Arguments that do not apply to the chosen backend raise `ValueError` (see `ipybox.executor.arguments` for
which apply where); arguments kept from ipybox 0.9 that do nothing warn with `DeprecationWarning`.
Constructing an executor starts nothing: `start()` (or `async with`) does.

`cancel()` stops the running `stream()`/`execute()` the same way on both backends: the kernel client
interrupts the code (`KernelClient.stream`'s `cancellation`), which also ends a tool call waiting in the
kernel (its connection to the tool server closes, and the server drops the call); approvals asked for
meanwhile are rejected at once, and those still undecided once the code stopped are rejected then (a
workspace forgets them). The stream then ends with a `CodeExecutionResult` holding the output so far and
`cancelled=True`, never with the error the stopped code raised (KeyboardInterrupt, `ApprovalRejectedError`,
or a timeout that fired meanwhile); a `KernelDiedError` is still raised, since the kernel's state is gone.
ipybox 0.9.2 ends the stream without a result instead (its `execute()` returns `text=None`): here the
output is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from ipybox.approval.approver import ApproveAll
from ipybox.approval.channel import Answers
from ipybox.approval.request import ApprovalRequest
from ipybox.config.executables import LiveKernels, ServerCodeGuard, protect
from ipybox.errors import IpyboxError
from ipybox.executor.arguments import UNSET, Unset, check_arguments
from ipybox.executor.kernel_setup import StartedKernels, embedded_kernel_setup, start_kernel_gateway
from ipybox.kernels.gateway import GatewayEndpoint, KernelGateway
from ipybox.kernels.kernel_client import DEFAULT_MAX_OUTPUT_CHARS, ExecutionTimeoutError, KernelClient
from ipybox.kernels.result import CodeExecutionChunk, CodeExecutionError, CodeExecutionResult, KernelDiedError
from ipybox.kernels.timer import Cancellation
from ipybox.limits import ResourceLimits
from ipybox.mcp_client.params import ServerParams
from ipybox.mcp_client.registry import ServerRegistry
from ipybox.rules.calls import ToolCall
from ipybox.safefs import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_OUTPUT_FILE_BYTES
from ipybox.tool_server.tool_server import ToolServer

if TYPE_CHECKING:
    from ipybox.codeact.actions import SavedAction
    from ipybox.running.attach import WorkspaceSession
    from ipybox.sandbox import DomainProxy, SandboxPolicy

logger = logging.getLogger("ipybox")

StreamItem = ApprovalRequest | CodeExecutionChunk | CodeExecutionResult
OnApproval = Callable[[ApprovalRequest], Awaitable[None]]
PauseTimer = Callable[[], Callable[[], None]]


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = object()

_EXECUTE_DECLINES = (
    "execute() answers no asks; stream() yields them, and CodeExecutor(execute_accepts_asks=True) has "
    "execute() accept them"
)


class _Execution:
    """The running `stream()`: where its items go, the approvals it yielded that are still undecided, and
    its cancellation. `declines`: why it answers no workspace `ask` (`execute()` attached), if it doesn't."""

    def __init__(self, auto_approve: bool, declines: str | None = None) -> None:
        self.queue: asyncio.Queue[StreamItem | _Failed | object] = asyncio.Queue()
        self.auto_approve = auto_approve
        self.declines = declines
        self.cancellation = Cancellation()
        self.pending: set[ApprovalRequest] = set()
        self.withdrawals: set[asyncio.Task[None]] = set()

    def ask(self, request: ApprovalRequest) -> None:
        self.pending.add(request)
        request.add_done_callback(lambda accepted: self.pending.discard(request))
        self.queue.put_nowait(request)

    def withdraw(self) -> None:
        """Reject the approvals still undecided (a cancelled execution's, once its code stopped)."""
        for request in list(self.pending):
            if request.decision is None:
                task = asyncio.create_task(request.reject(), name="ipybox-withdraw-approval")
                self.withdrawals.add(task)
                task.add_done_callback(self.withdrawals.discard)

    def cancelled_result(self, error: BaseException) -> CodeExecutionResult | None:
        """The result to end a cancelled execution with instead of `error` (`None`: raise `error`)."""
        if not self.cancellation.cancelled or isinstance(error, KernelDiedError):
            return None
        if isinstance(error, CodeExecutionError | ExecutionTimeoutError) and error.result is not None:
            if isinstance(error, ExecutionTimeoutError) and error.kernel_restarted:
                logger.warning("the cancelled code timed out meanwhile: its kernel was replaced")
            return replace(error.result, cancelled=True)
        return None


def _given(value: Any, default: Any) -> Any:
    return default if value is UNSET else value


class _Backend(Protocol):
    """What runs the kernel: `_Embedded` or `_Attached`."""

    client: KernelClient | None
    tool_server: ToolServer | None
    gateway: KernelGateway | None
    proxy: DomainProxy | None

    async def start(self) -> None: ...  # on failure: stopped again, then raises

    async def stop(self) -> None: ...  # never leaves a process behind

    async def reset(self) -> None: ...

    async def run_in_fresh_kernel(self, code: str, timeout: float | None) -> str: ...

    async def mcptools_dir(self) -> Path: ...


# A check's report is one line of JSON (schemas included): never shortened to head and tail.
_CHECK_OUTPUT_CHARS = 4_000_000


class _Embedded:
    """A tool server, a gateway (unless external) and a kernel of the executor's own."""

    def __init__(self, executor: CodeExecutor) -> None:
        self.x = executor
        self.client: KernelClient | None = None
        self.tool_server: ToolServer | None = None
        self.gateway: KernelGateway | None = None
        self.proxy: DomainProxy | None = None
        self._kernels: StartedKernels | None = None

    async def start(self) -> None:
        x = self.x
        try:
            self.tool_server = self._create_tool_server()
            await self.tool_server.start()
            policy = None
            if x.sandbox:
                from ipybox.sandbox import SandboxPolicy

                policy = SandboxPolicy.from_file(x.sandbox_config) if x.sandbox_config else SandboxPolicy()
            policy = self._guard_servers(policy)
            setup = embedded_kernel_setup(
                x.working_dir,
                x.kernel_env,
                sandbox=policy,
                mcptools_dir=x.mcptools_dir,
                approve_shell=x.approve_shell_cmds,
                require_shell_escape=x.require_shell_escape,
                reset_cwd=x.reset_cwd,
                limits=x.limits,
            )
            address, token = self.tool_server.calls_address, self.tool_server.call_token
            kernel_env: dict[str, str] | None = None
            if x.kernel_gateway_url is not None:
                endpoint = GatewayEndpoint(x.kernel_gateway_url.rstrip("/"), x.kernel_gateway_token)
                # A gateway of someone else's: each kernel's environment goes with its start request.
                kernel_env = setup.kernel_env(address, token)
            else:
                self._kernels = await start_kernel_gateway(
                    setup,
                    address,
                    tool_token=token,
                    host=x.kernel_gateway_host,
                    port=x.kernel_gateway_port,
                    log_level=x.log_level,
                )
                self.gateway, self.proxy = self._kernels.gateway, self._kernels.proxy
                endpoint = self.gateway.endpoint
            self.client = KernelClient(
                endpoint,
                images_dir=x.images_dir,
                output_dir=x.output_dir,
                max_output_chars=x.max_output_chars,
                max_output_file_bytes=x.max_output_file_bytes or DEFAULT_MAX_OUTPUT_FILE_BYTES,
                max_image_bytes=x.max_image_bytes or DEFAULT_MAX_IMAGE_BYTES,
                kernel_env=kernel_env,
                spare_kernel=x.spare_kernel,
                ready_timeout=x.kernel_init_timeout,
                # A kernel that dies while starting is reported with the end of the gateway's log.
                gateway_log=self.gateway.log_path if self.gateway is not None else None,
                # A cell whose gateway died says how it died (an external gateway's is not known).
                gateway_loss=self._gateway_loss if self.gateway is not None else None,
            )
            await self.client.connect()
        except BaseException:
            await self.stop()
            raise

    def _guard_servers(self, policy: SandboxPolicy | None) -> SandboxPolicy | None:
        """Kernels get what the servers known now execute read-only (`policy` extended), and a server
        whose code they can still write is refused when it starts (`ServerCodeWritableError`); a sandboxed
        server gets the same paths read-only (`ipybox.config.executables`)."""
        x, tool_server = self.x, self.tool_server
        assert tool_server is not None
        dotenv = x.working_dir / ".env"
        guard = ServerCodeGuard(
            x.working_dir,
            self._known_servers,
            lambda: [LiveKernels("a kernel of this executor", policy)] if policy is not None else [],
            dotenv_path=dotenv,
        )
        if policy is not None:
            policy = protect(policy, guard.derive())

        async def prepare(name: str, params: ServerParams, secrets: bool) -> ServerParams:
            return guard.check(name, params, secrets=secrets)

        tool_server.servers.prepare = prepare
        return policy

    def _known_servers(self) -> dict[str, Mapping[str, Any]]:
        """`mcp_servers` and the servers generated into the package roots, as far as the registry says."""
        x, found = self.x, {}
        registry = ServerRegistry()
        for root in [x.mcptools_dir, *x.package_roots]:
            with contextlib.suppress(IpyboxError, OSError):  # unreadable: checked when it starts
                found.update({f"{name} ({root})": params for name, params in registry.servers(root).items()})
        return {**found, **x.mcp_servers}

    async def _gateway_loss(self) -> str | None:
        how = await self.gateway.exited(timeout=1.0) if self.gateway is not None else None
        return f"it exited with {how}" if how is not None else None

    def _create_tool_server(self) -> ToolServer:
        x = self.x
        registry = ServerRegistry()
        server = ToolServer(
            host=x.tool_server_host,
            port=x.tool_server_port,
            approval_required=True,
            approval_timeout=x.approval_timeout,
            connect_timeout=x.connect_timeout,
            log_level=x.log_level,
            # A name resolves to `mcp_servers`, else to the server generated into the package root the
            # calling module sits in, else to the registry under `mcptools_dir` (found on first use, so
            # sources generated after the executor started work too); see `MCPServers.resolve_key`.
            servers=x.mcp_servers,
            media_dir=x.images_dir or Path("images"),
            max_image_bytes=x.max_image_bytes or DEFAULT_MAX_IMAGE_BYTES,
            dotenv_path=x.working_dir / ".env",
            lookup=lambda name: registry.servers(x.mcptools_dir).get(name),
            # Annotations recorded at generation decide a server's calls before it first starts here
            # (only for the parameters they were listed with).
            annotations_lookup=lambda name, params: registry.recorded_annotations(
                x.mcptools_dir, name, params
            ),
        )
        server.servers.package_lookup = registry.package_server
        # The roots a kernel's call may name are the host's choice: another project's directory, named by
        # code in the kernel, starts nothing (`ForeignPackageRootError`).
        server.servers.package_roots = [x.mcptools_dir, *x.package_roots]
        server.approval.handler = x._on_approval
        server.approval.pause = x._pause_timer
        if not x.approve_tool_calls:
            server.approver = ApproveAll()  # shell commands still go to `approval` (shell_approver)
        server.shell_approver = server.approval
        return server

    async def stop(self) -> None:
        client, self.client = self.client, None
        kernels, self._kernels = self._kernels, None
        tool_server, self.tool_server = self.tool_server, None
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
                if tool_server is not None:
                    await tool_server.stop()

    async def reset(self) -> None:
        assert self.client is not None and self.tool_server is not None
        await asyncio.gather(self.client.reset(), self.tool_server.reset())

    async def run_in_fresh_kernel(self, code: str, timeout: float | None) -> str:
        assert self.client is not None
        x, own = self.x, self.client
        # Another kernel of the same gateway, with the same kernelspec and environment (sandboxed when
        # the executor is); deleted afterwards.
        client = KernelClient(
            own.endpoint,
            images_dir=x.images_dir,
            output_dir=x.output_dir,
            max_output_chars=_CHECK_OUTPUT_CHARS,
            max_output_file_bytes=own.max_output_file_bytes,
            max_image_bytes=own.max_image_bytes,
            kernel_name=own.kernel_name,
            kernel_env=own.kernel_env,
            spare_kernel=False,
            ready_timeout=x.kernel_init_timeout,
            gateway_log=own.gateway_log,
        )
        # Under the executor's lock, no execution runs: a tool call the checked code makes is rejected
        # (`_on_approval`), never shown as one of an execution's approvals.
        async with x._lock:
            await client.connect()  # disconnects itself when it fails
            try:
                return (await client.execute(code, timeout)).text or ""
            finally:
                await client.disconnect()

    async def mcptools_dir(self) -> Path:
        return self.x.mcptools_dir.absolute()


class _Attached:
    """A lease on a running workspace: its kernels, MCP servers and rules (`WorkspaceSession`)."""

    tool_server: ToolServer | None = None  # the workspace's supervisor runs it
    gateway: KernelGateway | None = None
    proxy: DomainProxy | None = None

    def __init__(self, executor: CodeExecutor, workspace: Path) -> None:
        self.x = executor
        self.workspace = workspace
        self.client: KernelClient | None = None
        self._session: WorkspaceSession | None = None

    async def start(self) -> None:
        from ipybox.running.attach import WorkspaceSession

        x = self.x
        file_bytes, image_bytes = self._file_caps()
        session = WorkspaceSession(
            self.workspace,
            x._on_approval,
            x._pause_timer,
            images_dir=x.images_dir,
            output_dir=x.output_dir,
            max_output_chars=x.max_output_chars,
            max_output_file_bytes=file_bytes,
            max_image_bytes=image_bytes,
            kernel_init_timeout=x.kernel_init_timeout,
            answers=x._ask_answers,
            declines=x._declines,
        )
        await session.open()  # closes itself when it fails
        self._session, self.client = session, session.kernel_client

    def _file_caps(self) -> tuple[int, int]:
        """`max_output_file_bytes` and `max_image_bytes`: as passed, else as the workspace's ipybox.toml
        says (`[kernel]`), else the defaults (an ipybox.toml that does not load now, mid-edit)."""
        x = self.x
        file_bytes, image_bytes = x.max_output_file_bytes, x.max_image_bytes
        if file_bytes is None or image_bytes is None:
            from ipybox.config import ConfigError, load_config

            try:
                kernel = load_config(self.workspace).kernel
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
        assert self.client is not None
        await self.client.reset()

    async def run_in_fresh_kernel(self, code: str, timeout: float | None) -> str:
        from ipybox.running.attach import WorkspaceSession

        x, own = self.x, self.client
        assert own is not None

        async def reject(request: ApprovalRequest) -> None:
            await request.reject()  # not reached: the workspace refuses a check lease's asks itself

        # A second, short lease: a fresh kernel from the workspace's pool (its sandbox, environment and
        # rules), given back (deleted) afterwards; the session's own kernel keeps its state.
        session = WorkspaceSession(
            self.workspace,
            reject,
            lambda: lambda: None,
            images_dir=x.images_dir,
            output_dir=x.output_dir,
            max_output_chars=_CHECK_OUTPUT_CHARS,
            max_output_file_bytes=own.max_output_file_bytes,
            max_image_bytes=own.max_image_bytes,
            kernel_init_timeout=x.kernel_init_timeout,
            check=True,  # the workspace refuses its kernel's asks: nobody is asked
        )
        await session.open()  # closes itself when it fails
        try:
            return (await session.kernel_client.execute(code, timeout)).text or ""
        finally:
            await session.close()

    async def mcptools_dir(self) -> Path:
        # The running workspace's own (fixed by the first configuration it applied), else ipybox.toml's.
        assert self._session is not None
        known = (await self._session.control.status()).reconciler.mcptools_dir
        if known is not None:
            return Path(known)
        from ipybox.config import load_config

        config = load_config(self.workspace)
        return config.resolve(config.workspace.mcptools_dir)


class CodeExecutor:
    """Executes Python code in a stateful IPython kernel, with programmatic MCP tool calling.

    `CodeExecutor` starts an embedded kernel gateway (or uses one you run: `kernel_gateway_url`) and a
    kernel on it, or attaches to a running workspace (`workspace`). Variables, imports and definitions
    persist across executions until `reset()`.

    Which arguments apply where (see `ipybox.executor.arguments`): with `workspace`, only `images_dir`,
    `output_dir`, `max_output_chars`, `max_output_file_bytes`, `max_image_bytes` and `log_level`; the others are the workspace's `ipybox.toml`'s to
    decide, and passing one raises `ValueError` naming it and the setting to use instead.

    Args:
        tool_server_host: Loopback host of the tool server when `tool_server_port` is given (ipybox 0.9
            compatibility; without a port it does nothing and warns: the tool server listens on a Unix
            socket).
        tool_server_port: Serve the tool server on this loopback TCP port instead of a Unix socket.
        kernel_gateway_host: Host of the embedded gateway (loopback only).
        kernel_gateway_port: Port of the embedded gateway; `None` picks a free one.
        kernel_env: Environment variables for the kernel, taken literally. The kernel does not inherit the
            host's environment: it gets PATH, HOME, LANG and little else, plus these.
        images_dir: Where images displayed by code (plots) are saved; default `images` in the working dir.
        approval_timeout: Seconds an MCP tool call (or shell command) waits for `accept()`/`reject()`
            before it fails; `None` waits as long as it takes.
        connect_timeout: Seconds an MCP server gets to start.
        sandbox: Run kernels (and all they start) in a bubblewrap sandbox: no network, writes only to the
            working dir and a private /tmp, `.env` files and credentials unreadable (see
            `ipybox.sandbox.SandboxPolicy`). Fails with `SandboxUnavailableError` when the machine can't
            sandbox; never runs unsandboxed instead.
        sandbox_config: Sandbox policy file (JSON, sandbox-runtime format) extending the default policy
            (with `sandbox=True` only).
        log_level: Log level of what the executor starts: its gateway process and embedded tool server
            (DEBUG, INFO, WARNING, ERROR, CRITICAL). The `ipybox` logger's level is the application's to
            set (`logging.getLogger("ipybox").setLevel(...)`): a library call never changes it.
        working_dir: The kernel's working directory (default: the current directory).
        kernel_gateway_url: Use this running gateway (e.g. Jupyter Enterprise Gateway) instead of an
            embedded one. Kernel env variables must then be named `KERNEL_*` or whitelisted by that gateway.
        kernel_gateway_token: Auth token of the gateway at `kernel_gateway_url`.
        max_output_chars: Output kept in memory per execution; a larger output is shortened to its head and
            tail, with the complete text saved in a file under `output_dir` (see `CodeExecutionResult`).
        output_dir: Where complete outputs too large for `max_output_chars` are saved.
        max_output_file_bytes: Bytes of one execution's complete output saved under `output_dir` (default
            256 MiB), and of the images it displays together: past it nothing more is written, and the
            output says so. With `workspace`, default: the workspace's ipybox.toml (`[kernel]`).
        max_image_bytes: The largest image saved (a displayed one, or one a tool returns; default 32 MiB);
            a larger one is not, and the output says so. With `workspace`, default: its ipybox.toml.
        spare_kernel: Keep a started kernel in reserve, so `reset()` is a swap (about 1 ms) instead of a
            kernel start (about 0.5 s), at the cost of one idle kernel's memory.
        mcp_servers: MCP servers the generated tool API may call, by name, in addition to those
            `generate_mcp_sources` recorded; a name here comes first.
        mcptools_dir: Where the generated tool packages are (default: `mcptools` in the working dir).
            Its servers serve calls that name no directory (packages of earlier versions) or a package
            root with no server of that name.
        package_roots: More directories `generate_mcp_sources` generated tool packages into, whose
            servers the kernel may call (relative paths: to the current directory). Each call names the
            directory its package sits in, and the server recorded there under that name runs (a
            same-named server of another directory is another process). A call from a package in any
            other directory is refused, unasked, and starts nothing: the kernel can't reach the servers
            (and secrets) of another project of the same user by naming its directory.
        kernel_init_timeout: Seconds a new kernel gets to become ready (default 60; `None`: no limit).
        approve_tool_calls: Ask (an `ApprovalRequest` in `stream()`) before each MCP tool call runs; with
            `False` tool calls run without asking.
        approve_shell_cmds: Ask before each shell command of the code runs: `!cmd`, `!!cmd`, `x = !cmd` and
            the `%%bash`/`%%sh` cell magics (`ApprovalRequest(server_name="ipybox", tool_name="shell"` or
            `"shell_magic", tool_args={"cmd": ...})`, with `{var}`/`$var` already expanded). A rejected
            command raises `ApprovalRejectedError` in the cell and never runs. A guard inside the kernel,
            not a security boundary: the sandbox is.
        require_shell_escape: With `approve_shell_cmds`: `subprocess`, `os.system`, `os.exec*`,
            `os.spawn*`, `os.posix_spawn*` and `pty.spawn` called from cell code raise `RuntimeError`
            naming the `!` form, so commands go through approval.
        limits: What the kernel, with everything it starts, may use (`ResourceLimits(memory="2GiB",
            processes=128, ...)`; default: nothing limited, as in ipybox 0.9). Enforced by the operating
            system (a control group, else `setrlimit`); a limit this machine can't enforce fails `start()`
            with `LimitUnavailableError`. Code that goes over the memory limit ends with `ResourceLimitError`.
            Not with `kernel_gateway_url` (that gateway starts kernels its own way).
        workspace: A directory where `ipybox up` runs: attach to it instead of starting a gateway and a tool
            server of its own. The kernel comes from the workspace's warm pool (ready in milliseconds), runs
            in the workspace directory under the workspace's sandbox and environment, and its tool calls
            follow the workspace's approval rules; calls a rule answers with `ask` reach `stream()` as
            `ApprovalRequest`s. `execute()` answers none of them: each goes to the people `[approval] ask`
            lists (the web console, `ipybox approve`), or is denied when none is there.
        execute_accepts_asks: With `workspace`: `execute()` accepts every call a rule answers with `ask`,
            as an embedded executor's `execute()` accepts every tool call (the audit log records the
            application as the one who allowed it). Off by default: code that runs unattended must not
            answer a rule that asks for a decision. `stream()` is not affected.

    Raises:
        ValueError: An argument does not apply to the chosen backend or to the other arguments.

    Example:
        ```python
        async with CodeExecutor() as executor:
            await executor.execute("x = 42")
            result = await executor.execute("print(x)")
            assert result.text == "42"
        ```
    """

    def __init__(
        self,
        tool_server_host: str | Unset = UNSET,
        tool_server_port: int | Unset | None = UNSET,
        kernel_gateway_host: str | Unset = UNSET,
        kernel_gateway_port: int | Unset | None = UNSET,
        kernel_env: Mapping[str, str] | Unset | None = UNSET,
        images_dir: str | Path | Unset | None = UNSET,
        approval_timeout: float | Unset | None = UNSET,
        connect_timeout: float | Unset = UNSET,
        sandbox: bool | Unset = UNSET,
        sandbox_config: str | Path | Unset | None = UNSET,
        log_level: str | Unset = UNSET,
        *,
        working_dir: str | Path | Unset | None = UNSET,
        kernel_gateway_url: str | Unset | None = UNSET,
        kernel_gateway_token: str | Unset = UNSET,
        max_output_chars: int | Unset = UNSET,
        output_dir: str | Path | Unset | None = UNSET,
        max_output_file_bytes: int | Unset = UNSET,
        max_image_bytes: int | Unset = UNSET,
        spare_kernel: bool | Unset = UNSET,
        mcp_servers: Mapping[str, Mapping[str, Any]] | Unset | None = UNSET,
        mcptools_dir: str | Path | Unset | None = UNSET,
        package_roots: Sequence[str | Path] | Unset | None = UNSET,
        kernel_init_timeout: float | Unset | None = UNSET,
        approve_tool_calls: bool | Unset = UNSET,
        approve_shell_cmds: bool | Unset = UNSET,
        require_shell_escape: bool | Unset = UNSET,
        limits: ResourceLimits | Unset | None = UNSET,
        workspace: str | Path | None = None,
        execute_accepts_asks: bool | Unset = UNSET,
    ) -> None:
        arguments = {
            "tool_server_host": tool_server_host,
            "tool_server_port": tool_server_port,
            "kernel_gateway_host": kernel_gateway_host,
            "kernel_gateway_port": kernel_gateway_port,
            "kernel_env": kernel_env,
            "images_dir": images_dir,
            "approval_timeout": approval_timeout,
            "connect_timeout": connect_timeout,
            "sandbox": sandbox,
            "sandbox_config": sandbox_config,
            "log_level": log_level,
            "working_dir": working_dir,
            "kernel_gateway_url": kernel_gateway_url,
            "kernel_gateway_token": kernel_gateway_token,
            "max_output_chars": max_output_chars,
            "output_dir": output_dir,
            "max_output_file_bytes": max_output_file_bytes,
            "max_image_bytes": max_image_bytes,
            "spare_kernel": spare_kernel,
            "mcp_servers": mcp_servers,
            "mcptools_dir": mcptools_dir,
            "package_roots": package_roots,
            "kernel_init_timeout": kernel_init_timeout,
            "approve_tool_calls": approve_tool_calls,
            "approve_shell_cmds": approve_shell_cmds,
            "require_shell_escape": require_shell_escape,
            "limits": limits,
            "execute_accepts_asks": execute_accepts_asks,
        }
        given = {name: value for name, value in arguments.items() if value is not UNSET}
        for message in check_arguments(given, workspace=workspace is not None):
            warnings.warn(message, DeprecationWarning, stacklevel=2)

        self.workspace = Path(workspace).resolve() if workspace is not None else None
        self.tool_server_host: str = _given(tool_server_host, "localhost")
        self.tool_server_port: int | None = _given(tool_server_port, None)
        self.kernel_gateway_host: str = _given(kernel_gateway_host, "localhost")
        self.kernel_gateway_port: int | None = _given(kernel_gateway_port, None)
        self.kernel_env: dict[str, str] = dict(_given(kernel_env, None) or {})
        self.images_dir: Path | None = _path(_given(images_dir, None))
        self.approval_timeout: float | None = _given(approval_timeout, 60)
        self.connect_timeout: float = _given(connect_timeout, 30)
        self.sandbox: bool = _given(sandbox, False)
        self.sandbox_config: Path | None = _path(_given(sandbox_config, None))
        self.log_level: str = _given(log_level, "WARNING").upper()
        self.working_dir: Path = self.workspace or Path(_given(working_dir, None) or Path.cwd()).resolve()
        self.kernel_gateway_url: str | None = _given(kernel_gateway_url, None)
        self.kernel_gateway_token: str = _given(kernel_gateway_token, "")
        self.max_output_chars: int = _given(max_output_chars, DEFAULT_MAX_OUTPUT_CHARS)
        self.output_dir: Path | None = _path(_given(output_dir, None))
        # None: the default (with `workspace`: its ipybox.toml's, read when attaching).
        self.max_output_file_bytes: int | None = _given(max_output_file_bytes, None)
        self.max_image_bytes: int | None = _given(max_image_bytes, None)
        self.spare_kernel: bool = _given(spare_kernel, True)
        self.mcp_servers: dict[str, Mapping[str, Any]] = dict(_given(mcp_servers, None) or {})
        self.mcptools_dir: Path = _path(_given(mcptools_dir, None)) or self.working_dir / "mcptools"
        self.package_roots: list[Path] = [Path(root).resolve() for root in _given(package_roots, None) or ()]
        self.kernel_init_timeout: float | None = _given(kernel_init_timeout, 60)
        self.approve_tool_calls: bool = _given(approve_tool_calls, True)
        self.approve_shell_cmds: bool = _given(approve_shell_cmds, False)
        # Attached to a workspace: what this application does with its kernel's `ask`s (`stream()` decides
        # them). The MCP server sets "elicitation" or "none" for its sessions, by what the client can do.
        self._ask_answers: Answers = "application"
        self.require_shell_escape: bool = _given(require_shell_escape, False)
        self.limits: ResourceLimits = _given(limits, None) or ResourceLimits()
        self.execute_accepts_asks: bool = _given(execute_accepts_asks, False)
        # As in ipybox 0.9.2: only a working_dir the caller names is restored before each cell.
        self.reset_cwd: bool = self.workspace is None and _given(working_dir, None) is not None
        self._backend: _Backend = (
            _Attached(self, self.workspace) if self.workspace is not None else _Embedded(self)
        )
        self._execution: _Execution | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def kernel_client(self) -> KernelClient:
        """The client of the running kernel. Raises RuntimeError before `start()`."""
        client = self._backend.client
        if client is None:
            raise RuntimeError("the code executor is not running: use 'async with CodeExecutor()' or start()")
        return client

    @property
    def _client(self) -> KernelClient | None:
        return self._backend.client

    @property
    def tool_server(self) -> ToolServer:
        """The tool server that runs MCP tools for the kernel. Raises RuntimeError before `start()` and when
        attached to a workspace (whose supervisor runs the tool server)."""
        server = self._backend.tool_server
        if server is None:
            raise RuntimeError("the code executor is not running: use 'async with CodeExecutor()' or start()")
        return server

    @property
    def kernel_gateway(self) -> KernelGateway | None:
        """The embedded kernel gateway (None when using an external one or a workspace's)."""
        return self._backend.gateway

    @property
    def _proxy(self) -> DomainProxy | None:
        # The sandbox's way out to allowed domains, while running (tests check that it stops).
        return self._backend.proxy

    async def start(self) -> None:
        """Start the tool server, the kernel gateway (unless external) and a kernel, or attach to the
        workspace. Stops what it started when it fails.

        Raises:
            SandboxUnavailableError: `sandbox=True` and this machine can't sandbox.
            NotRunningError: `workspace` is given and no workspace runs there.
        """
        if self._backend.client is not None:
            raise RuntimeError("the code executor is already running")
        # No `logger.setLevel(self.log_level)`: the `ipybox` logger is the application's (an `ipybox up`
        # that serves MCP sessions, each an executor, lost its INFO lines to it); `log_level` goes to
        # what this executor starts.
        await self._backend.start()

    async def stop(self) -> None:
        """Stop the kernel(s), the embedded gateway, the tool server and its MCP servers (or give the
        workspace's kernel back). Leaves no process behind."""
        await self._backend.stop()

    async def _on_approval(self, request: ApprovalRequest) -> None:
        execution = self._execution
        if execution is None or execution.cancellation.cancelled:
            # A call made while no execution runs (a thread the code left behind), or by one being
            # cancelled: nobody is there to decide.
            await request.reject()
            return
        if execution.auto_approve:
            await request.accept()
            return
        execution.ask(request)

    def _declines(self, call: ToolCall) -> str | None:
        # Asked by the workspace session before an `ask` becomes a request: the running `execute()` leaves
        # it to the workspace's people (a call while no execution runs is rejected by `_on_approval`).
        execution = self._execution
        return execution.declines if execution is not None else None

    def cancel(self) -> None:
        """Stop the running `stream()` or `execute()`, as ipybox 0.9.2's `cancel()`; safe to call from any
        task on the executor's event loop, also while an `ApprovalRequest` waits for its decision.

        Undecided approval requests of that execution are rejected (a later `accept()` of one raises
        `RuntimeError`), the code is interrupted and the stream ends without an exception: its last item
        is a `CodeExecutionResult` with the output so far and `cancelled=True`, which `execute()` returns.
        The kernel keeps its state and is ready for the next execution (unless the code ignores interrupts
        for `interrupt_grace` seconds: then its kernel is replaced, with a warning logged). Does nothing
        when no execution runs.
        """
        execution = self._execution
        if execution is not None:
            execution.cancellation.cancel()

    def _pause_timer(self) -> Callable[[], None]:
        # Waiting for a human's decision does not count against the execution's timeout.
        timer = self._client.timer if self._client is not None else None
        if timer is None:
            return lambda: None
        timer.pause()
        return timer.resume

    async def execute(self, code: str, timeout: float | None = 120) -> CodeExecutionResult:
        """Execute code and return its result; MCP tool calls are approved automatically (ipybox 0.9.2's
        `execute()`). Attached to a workspace, its rules decide, and a call a rule answers with `ask` is
        not answered here: the workspace asks the people present, or denies it (`execute_accepts_asks=True`
        accepts it instead).

        Args:
            code: Python code (IPython syntax; top-level `await` works).
            timeout: Seconds the code may run (`None`: no limit). On timeout it is interrupted (state kept);
                if it ignores the interrupt, the kernel is replaced (state lost). Either way `TimeoutError`
                is raised, its message starting as ipybox 0.9.2's ("Code execution exceeded timeout of
                0.20s (approval wait excluded).").

        Returns:
            The result; after `cancel()`, the output up to then with `cancelled=True`.

        Raises:
            CodeExecutionError: The code raised an exception (a rejected tool call included), or the kernel
                died.
            TimeoutError: The code ran past `timeout`.
        """
        result: CodeExecutionResult | None = None
        accepts = self.workspace is None or self.execute_accepts_asks
        declines = None if accepts else _EXECUTE_DECLINES
        async for item in self._stream(code, timeout, chunks=False, auto_approve=accepts, declines=declines):
            # Declining, only calls the workspace refused already arrive here (nobody could be asked).
            if isinstance(item, ApprovalRequest) and accepts:
                await item.accept()
            elif isinstance(item, CodeExecutionResult):
                result = item
        assert result is not None
        return result

    def stream(
        self, code: str, timeout: float | None = 120, chunks: bool = False
    ) -> AsyncIterator[StreamItem]:
        """Execute code, yielding an `ApprovalRequest` for each MCP tool call, output chunks (with
        `chunks=True`) and, last, the result.

        Each approval request must be answered with `accept()` or `reject()`; several can be pending at once
        (when the code calls tools from threads or with `asyncio.gather`). A call left undecided fails after
        `approval_timeout` (never, when it is `None`). `timeout=None` lets the code run without a limit.
        After `cancel()` the stream ends with a result marked `cancelled` (see `cancel`).

        Raises:
            CodeExecutionError: The code raised an exception (a rejected tool call included), or the kernel
                died.
            TimeoutError: The code ran past `timeout` (time spent waiting for approvals does not count).
        """
        return self._stream(code, timeout, chunks=chunks, auto_approve=False)

    async def _stream(
        self,
        code: str,
        timeout: float | None,
        *,
        chunks: bool,
        auto_approve: bool,
        declines: str | None = None,
    ) -> AsyncIterator[StreamItem]:
        client = self.kernel_client
        async with self._lock:
            execution = _Execution(auto_approve, declines)
            queue = execution.queue

            async def run() -> None:
                outcome: object = _DONE
                try:
                    async for item in client.stream(code, timeout, cancellation=execution.cancellation):
                        if chunks or isinstance(item, CodeExecutionResult):
                            queue.put_nowait(item)
                except BaseException as e:
                    outcome = _Failed(e)
                if execution.cancellation.cancelled:
                    # Only now that the code stopped. Rejected at once, a call waiting in the kernel raised
                    # ApprovalRejectedError just as the interrupt came, which then landed while IPython showed
                    # that traceback: a stray "KeyboardInterrupt" in the output (2 of 3 workspace test runs).
                    execution.withdraw()
                queue.put_nowait(outcome)

            self._execution = execution
            task = asyncio.create_task(run(), name="ipybox-execution")
            try:
                while (item := await queue.get()) is not _DONE:
                    if isinstance(item, _Failed):
                        # The code stopped by a cancel may have failed before the client saw the cancel.
                        cancelled = execution.cancelled_result(item.error)
                        if cancelled is None:
                            raise item.error
                        yield cancelled
                        break
                    if isinstance(item, ApprovalRequest) and execution.cancellation.cancelled:
                        continue  # withdrawn (rejected) by the cancel
                    assert isinstance(item, ApprovalRequest | CodeExecutionChunk | CodeExecutionResult)
                    yield item
            finally:
                self._execution = None
                if not task.done():
                    # The caller stopped listening: stop the code too, so the kernel is free again (one
                    # interrupt can land before the code runs, or be swallowed by it), and withdraw the
                    # approvals it asked for (with no approval_timeout they would wait forever).
                    execution.cancellation.cancel()
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    execution.withdraw()
                    with contextlib.suppress(Exception):
                        await client.interrupt_until_idle()
                if execution.withdrawals:
                    await asyncio.gather(*execution.withdrawals, return_exceptions=True)

    async def reset(self) -> None:
        """Start over with a fresh kernel: variables, definitions and imports are gone. Also stops the MCP
        servers started so far (not a workspace's, which other sessions share); they start again on their
        next call."""
        _ = self.kernel_client  # raises when not running
        await self._backend.reset()

    async def check_in_fresh_kernel(self, code: str, timeout: float = 60) -> str:
        """Execute `code` in a new kernel and return its output text; the kernel is deleted afterwards.

        The executor's own kernel is not used and keeps its state. The new kernel is started as the
        executor's are: by its gateway (sandboxed when the executor is), or leased from the workspace's
        pool. Its MCP tool calls follow the approval rules and are never asked about: with an embedded
        gateway it runs while no execution does (it waits for one to finish) and an approval it needs is
        rejected; a workspace refuses its `ask`s itself, with a reason saying so, and asks nobody. This is the `RunCheck` of `ipybox.codeact.checks`.

        Raises:
            CodeExecutionError: The code raised an exception, or the kernel died.
            TimeoutError: It ran past `timeout`.
        """
        _ = self.kernel_client  # raises when not running
        return await self._backend.run_in_fresh_kernel(code, timeout)

    async def save_code_action(
        self, category: str, name: str, *, api: str, impl: str, overwrite: bool = False
    ) -> SavedAction:
        """Save a code action as `gentools/<category>/<name>/` next to the `mcptools` directory, after
        checking it: names, syntax and layout by parsing, then an import of the new package in a fresh
        kernel (`check_in_fresh_kernel`), never in the executor's own. Later code actions of this executor
        (and of other kernels after a `reset()`, if they imported an earlier version) use it as `from
        gentools.<category>.<name> import Params, run`; a workspace's MCP server also offers it as the tool
        `<category>__<name>`.

        Args:
            category: The action's category (a lowercase identifier, e.g. `github`).
            name: The action's name within it (e.g. `commits_of_top_repos`).
            api: The source of `api.py`, the interface agents read: `run()` with a docstring, `Params`
                (a pydantic model) if it takes arguments, and its result model.
            impl: The source of `impl.py`: what `run()` does, composing `mcptools` and other `gentools`.
            overwrite: Replace an existing action of that name.

        Returns:
            The saved action: its module, MCP tool name, signature, schemas and the tools it may call.

        Raises:
            CodeActionError: A bad name, code that does not parse, match the layout or import (each problem
                as `gentools/<category>/<name>/impl.py:LINE:COL: message`), or an existing action without
                `overwrite=True`. Nothing was written.
            SymlinkRefusedError: `gentools/`, the category or the action is a symlink.

        Example:
            ```python
            api = '''
            from pydantic import BaseModel

            class Params(BaseModel):
                name: str

            class Result(BaseModel):
                greeting: str

            def run(params: Params) -> Result:
                \"\"\"Greet someone.\"\"\"
                from .impl import greet
                return Result(greeting=greet(params.name))
            '''
            impl = "def greet(name: str) -> str:\\n    return f'hello {name}'\\n"
            action = await executor.save_code_action("demo", "greet", api=api, impl=impl)
            assert action.tool_name == "demo__greet"
            await executor.reset()
            result = await executor.execute(
                "from gentools.demo.greet import Params, run\\nprint(run(Params(name='ada')).greeting)"
            )
            assert result.text == "hello ada"
            ```
        """
        from ipybox.codeact.actions import save_code_action

        _ = self.kernel_client  # raises when not running
        saved = await save_code_action(
            self.check_in_fresh_kernel,
            await self._backend.mcptools_dir(),
            category,
            name,
            api=api,
            impl=impl,
            root=self.working_dir,
            overwrite=overwrite,
        )
        # This executor's kernel may have imported an earlier version (or looked for the package before it
        # existed): its next import reads the saved files.
        forget = (
            "def _ipybox_forget(module):\n"
            "    import importlib, sys\n"
            "    for name in [n for n in sys.modules if n == module or n.startswith(module + '.')]:\n"
            "        del sys.modules[name]\n"
            "    importlib.invalidate_caches()\n"
            f"_ipybox_forget({saved.module!r})\n"
            "del _ipybox_forget\n"
        )
        try:
            await self.execute(forget, timeout=30)
        except Exception as e:  # the action is saved: a kernel that can't forget imports it after a reset
            logger.warning("the kernel could not forget the earlier version of %s: %s", saved.module, e)
        return saved


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None
