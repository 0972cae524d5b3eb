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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from ipybox.approval.request import ApprovalRequest
from ipybox.executor.arguments import UNSET, Unset, check_arguments
from ipybox.executor.kernel_setup import StartedKernels, embedded_kernel_setup, start_kernel_gateway
from ipybox.kernels.gateway import GatewayEndpoint, KernelGateway
from ipybox.kernels.kernel_client import DEFAULT_MAX_OUTPUT_CHARS, KernelClient
from ipybox.kernels.result import CodeExecutionChunk, CodeExecutionResult
from ipybox.mcp_client.registry import ServerRegistry
from ipybox.tool_server.tool_server import ToolServer

if TYPE_CHECKING:
    from ipybox.running.attach import WorkspaceSession
    from ipybox.sandbox import DomainProxy

logger = logging.getLogger("ipybox")

StreamItem = ApprovalRequest | CodeExecutionChunk | CodeExecutionResult
OnApproval = Callable[[ApprovalRequest], Awaitable[None]]
PauseTimer = Callable[[], Callable[[], None]]


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = object()


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
            setup = embedded_kernel_setup(
                x.working_dir, x.kernel_env, sandbox=policy, mcptools_dir=x.mcptools_dir
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
                kernel_env=kernel_env,
                spare_kernel=x.spare_kernel,
                # A kernel that dies while starting is reported with the end of the gateway's log.
                gateway_log=self.gateway.log_path if self.gateway is not None else None,
                # A cell whose gateway died says how it died (an external gateway's is not known).
                gateway_loss=self._gateway_loss if self.gateway is not None else None,
            )
            await self.client.connect()
        except BaseException:
            await self.stop()
            raise

    async def _gateway_loss(self) -> str | None:
        how = await self.gateway.exited(timeout=1.0) if self.gateway is not None else None
        return f"it exited with {how}" if how is not None else None

    def _create_tool_server(self) -> ToolServer:
        x = self.x
        registry = ServerRegistry()
        servers = {**registry.servers(x.mcptools_dir), **x.mcp_servers}
        server = ToolServer(
            host=x.tool_server_host,
            port=x.tool_server_port,
            approval_required=True,
            approval_timeout=x.approval_timeout,
            connect_timeout=x.connect_timeout,
            log_level=x.log_level,
            servers=servers,
            media_dir=x.images_dir or Path("images"),
            dotenv_path=x.working_dir / ".env",
            # Sources generated after the executor started are found in the registry on first use.
            lookup=lambda name: registry.servers(x.mcptools_dir).get(name),
            # Annotations recorded at generation decide a server's calls before it first starts here
            # (only for the parameters they were listed with).
            annotations_lookup=lambda name, params: registry.recorded_annotations(
                x.mcptools_dir, name, params
            ),
        )
        server.approval.handler = x._on_approval
        server.approval.pause = x._pause_timer
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
        session = WorkspaceSession(
            self.workspace,
            x._on_approval,
            x._pause_timer,
            images_dir=x.images_dir,
            output_dir=x.output_dir,
            max_output_chars=x.max_output_chars,
        )
        await session.open()  # closes itself when it fails
        self._session, self.client = session, session.kernel_client

    async def stop(self) -> None:
        session, self._session, self.client = self._session, None, None
        if session is not None:
            await session.close()

    async def reset(self) -> None:
        # The workspace's MCP servers are shared with other sessions: they keep running.
        assert self.client is not None
        await self.client.reset()


class CodeExecutor:
    """Executes Python code in a stateful IPython kernel, with programmatic MCP tool calling.

    `CodeExecutor` starts an embedded kernel gateway (or uses one you run: `kernel_gateway_url`) and a
    kernel on it, or attaches to a running workspace (`workspace`). Variables, imports and definitions
    persist across executions until `reset()`.

    Which arguments apply where (see `ipybox.executor.arguments`): with `workspace`, only `images_dir`,
    `output_dir`, `max_output_chars` and `log_level`; the others are the workspace's `ipybox.toml`'s to
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
        approval_timeout: Seconds an MCP tool call waits for `accept()`/`reject()` before it fails.
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
        spare_kernel: Keep a started kernel in reserve, so `reset()` is a swap (about 1 ms) instead of a
            kernel start (about 0.5 s), at the cost of one idle kernel's memory.
        mcp_servers: MCP servers the generated tool API may call, by name, in addition to those
            `generate_mcp_sources` recorded for `mcptools_dir`.
        mcptools_dir: Where the generated tool packages are (default: `mcptools` in the working dir).
        workspace: A directory where `ipybox up` runs: attach to it instead of starting a gateway and a tool
            server of its own. The kernel comes from the workspace's warm pool (ready in milliseconds), runs
            in the workspace directory under the workspace's sandbox and environment, and its tool calls
            follow the workspace's approval rules; calls a rule answers with `ask` reach `stream()` as
            `ApprovalRequest`s (and are accepted by `execute()`).

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
        approval_timeout: float | Unset = UNSET,
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
        spare_kernel: bool | Unset = UNSET,
        mcp_servers: Mapping[str, Mapping[str, Any]] | Unset | None = UNSET,
        mcptools_dir: str | Path | Unset | None = UNSET,
        workspace: str | Path | None = None,
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
            "spare_kernel": spare_kernel,
            "mcp_servers": mcp_servers,
            "mcptools_dir": mcptools_dir,
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
        self.approval_timeout: float = _given(approval_timeout, 60)
        self.connect_timeout: float = _given(connect_timeout, 30)
        self.sandbox: bool = _given(sandbox, False)
        self.sandbox_config: Path | None = _path(_given(sandbox_config, None))
        self.log_level: str = _given(log_level, "WARNING").upper()
        self.working_dir: Path = self.workspace or Path(_given(working_dir, None) or Path.cwd()).resolve()
        self.kernel_gateway_url: str | None = _given(kernel_gateway_url, None)
        self.kernel_gateway_token: str = _given(kernel_gateway_token, "")
        self.max_output_chars: int = _given(max_output_chars, DEFAULT_MAX_OUTPUT_CHARS)
        self.output_dir: Path | None = _path(_given(output_dir, None))
        self.spare_kernel: bool = _given(spare_kernel, True)
        self.mcp_servers: dict[str, Mapping[str, Any]] = dict(_given(mcp_servers, None) or {})
        self.mcptools_dir: Path = _path(_given(mcptools_dir, None)) or self.working_dir / "mcptools"
        self._backend: _Backend = (
            _Attached(self, self.workspace) if self.workspace is not None else _Embedded(self)
        )
        self._approvals: asyncio.Queue[StreamItem | _Failed | object] | None = None
        self._auto_approve = False
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
        if self._auto_approve:
            await request.accept()
            return
        queue = self._approvals
        if queue is None:
            # A call made while no execution runs (a thread the code left behind): nobody can decide.
            await request.reject()
            return
        queue.put_nowait(request)

    def _pause_timer(self) -> Callable[[], None]:
        # Waiting for a human's decision does not count against the execution's timeout.
        timer = self._client.timer if self._client is not None else None
        if timer is None:
            return lambda: None
        timer.pause()
        return timer.resume

    async def execute(self, code: str, timeout: float | None = 120) -> CodeExecutionResult:
        """Execute code and return its result; MCP tool calls are approved automatically.

        Args:
            code: Python code (IPython syntax; top-level `await` works).
            timeout: Seconds the code may run. On timeout it is interrupted (state kept); if it ignores the
                interrupt, the kernel is replaced (state lost). Either way `TimeoutError` is raised.

        Raises:
            CodeExecutionError: The code raised an exception (a rejected tool call included), or the kernel
                died.
            TimeoutError: The code ran past `timeout`.
        """
        result: CodeExecutionResult | None = None
        async for item in self._stream(code, timeout, chunks=False, auto_approve=True):
            if isinstance(item, ApprovalRequest):
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
        `approval_timeout`.

        Raises:
            CodeExecutionError: The code raised an exception (a rejected tool call included), or the kernel
                died.
            TimeoutError: The code ran past `timeout` (time spent waiting for approvals does not count).
        """
        return self._stream(code, timeout, chunks=chunks, auto_approve=False)

    async def _stream(
        self, code: str, timeout: float | None, *, chunks: bool, auto_approve: bool
    ) -> AsyncIterator[StreamItem]:
        client = self.kernel_client
        async with self._lock:
            queue: asyncio.Queue[StreamItem | _Failed | object] = asyncio.Queue()

            async def run() -> None:
                try:
                    async for item in client.stream(code, timeout):
                        if chunks or isinstance(item, CodeExecutionResult):
                            queue.put_nowait(item)
                except BaseException as e:
                    queue.put_nowait(_Failed(e))
                else:
                    queue.put_nowait(_DONE)

            self._approvals, self._auto_approve = queue, auto_approve
            task = asyncio.create_task(run(), name="ipybox-execution")
            try:
                while (item := await queue.get()) is not _DONE:
                    if isinstance(item, _Failed):
                        raise item.error
                    assert isinstance(item, ApprovalRequest | CodeExecutionChunk | CodeExecutionResult)
                    yield item
            finally:
                self._approvals, self._auto_approve = None, False
                if not task.done():
                    # The caller stopped listening: stop the code too, so the kernel is free again (one
                    # interrupt can land before the code runs, or be swallowed by it).
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    with contextlib.suppress(Exception):
                        await client.interrupt_until_idle()

    async def reset(self) -> None:
        """Start over with a fresh kernel: variables, definitions and imports are gone. Also stops the MCP
        servers started so far (not a workspace's, which other sessions share); they start again on their
        next call."""
        _ = self.kernel_client  # raises when not running
        await self._backend.reset()


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None
