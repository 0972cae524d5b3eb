"""`CodeExecutor`: the main entry point of the SDK."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from ipybox.approval.request import ApprovalRequest
from ipybox.kernels.gateway import GatewayEndpoint, KernelGateway
from ipybox.kernels.kernel_client import DEFAULT_MAX_OUTPUT_CHARS, KernelClient
from ipybox.kernels.kernelspec import KernelSpec
from ipybox.kernels.result import CodeExecutionChunk, CodeExecutionResult
from ipybox.mcp_client.registry import ServerRegistry
from ipybox.tool_server.tool_server import ToolServer

if TYPE_CHECKING:
    from ipybox.running.attach import WorkspaceSession
    from ipybox.sandbox import DomainProxy

logger = logging.getLogger("ipybox")

StreamItem = ApprovalRequest | CodeExecutionChunk | CodeExecutionResult


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = object()


class CodeExecutor:
    """Executes Python code in a stateful IPython kernel, with programmatic MCP tool calling.

    `CodeExecutor` starts an embedded kernel gateway (or uses one you run: `kernel_gateway_url`) and a
    kernel on it. Variables, imports and definitions persist across executions until `reset()`.

    Args:
        tool_server_host: Host of the tool server (ipybox 0.9 compatibility; the tool server listens on
            loopback or a Unix socket only).
        tool_server_port: Port of the tool server; `None` picks a free one.
        kernel_gateway_host: Host of the embedded gateway (loopback only).
        kernel_gateway_port: Port of the embedded gateway; `None` picks a free one.
        kernel_env: Environment variables for the kernel. The kernel does not inherit the host's environment:
            it gets PATH, HOME, LANG and little else, plus these.
        images_dir: Where images displayed by code (plots) are saved; default `images` in the working dir.
        approval_timeout: Seconds an MCP tool call waits for `accept()`/`reject()` before it fails.
        connect_timeout: Seconds an MCP server gets to start.
        sandbox: Run kernels (and all they start) in a bubblewrap sandbox: no network, writes only to the
            working dir and a private /tmp, `.env` files and credentials unreadable (see
            `ipybox.sandbox.SandboxPolicy`). Fails with `SandboxUnavailableError` when the machine can't
            sandbox; never runs unsandboxed instead.
        sandbox_config: Sandbox policy file (JSON, sandbox-runtime format) extending the default policy.
        log_level: Log level of ipybox and its gateway (DEBUG, INFO, WARNING, ERROR, CRITICAL).
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
            under the workspace's sandbox and environment, and its tool calls follow the workspace's
            approval rules; calls a rule answers with `ask` reach `stream()` as `ApprovalRequest`s (and are
            accepted by `execute()`). The other arguments about gateways, tool servers and sandboxes do not
            apply then.

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
        tool_server_host: str = "localhost",
        tool_server_port: int | None = None,
        kernel_gateway_host: str = "localhost",
        kernel_gateway_port: int | None = None,
        kernel_env: dict[str, str] | None = None,
        images_dir: str | Path | None = None,
        approval_timeout: float = 60,
        connect_timeout: float = 30,
        sandbox: bool = False,
        sandbox_config: str | Path | None = None,
        log_level: str = "WARNING",
        *,
        working_dir: str | Path | None = None,
        kernel_gateway_url: str | None = None,
        kernel_gateway_token: str = "",
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        output_dir: str | Path | None = None,
        spare_kernel: bool = True,
        mcp_servers: Mapping[str, Mapping[str, Any]] | None = None,
        mcptools_dir: str | Path | None = None,
        workspace: str | Path | None = None,
    ) -> None:
        if sandbox and kernel_gateway_url is not None:
            raise ValueError(
                "sandbox=True sandboxes kernels of the embedded gateway; a gateway at kernel_gateway_url "
                "runs kernels its own way: drop one of the two"
            )
        if sandbox and tool_server_port is not None:
            raise ValueError(
                "sandbox=True needs the tool server on a Unix socket (a sandboxed kernel has no network): "
                "leave tool_server_port unset"
            )
        self.tool_server_host = tool_server_host
        self.tool_server_port = tool_server_port
        self.kernel_gateway_host = kernel_gateway_host
        self.kernel_gateway_port = kernel_gateway_port
        self.kernel_env = dict(kernel_env or {})
        self.images_dir = Path(images_dir) if images_dir is not None else None
        self.approval_timeout = approval_timeout
        self.connect_timeout = connect_timeout
        self.sandbox = sandbox
        self.sandbox_config = Path(sandbox_config) if sandbox_config is not None else None
        self.log_level = log_level.upper()
        self.working_dir = Path(working_dir or Path.cwd()).resolve()
        self.kernel_gateway_url = kernel_gateway_url
        self.kernel_gateway_token = kernel_gateway_token
        self.max_output_chars = max_output_chars
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.spare_kernel = spare_kernel
        self.mcp_servers = dict(mcp_servers or {})
        self.mcptools_dir = Path(mcptools_dir) if mcptools_dir is not None else self.working_dir / "mcptools"
        self.workspace = Path(workspace).resolve() if workspace is not None else None
        self._session: WorkspaceSession | None = None
        self._gateway: KernelGateway | None = None
        self._client: KernelClient | None = None
        self._tool_server: ToolServer | None = None
        self._proxy: DomainProxy | None = None
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
        if self._client is None:
            raise RuntimeError("the code executor is not running: use 'async with CodeExecutor()' or start()")
        return self._client

    @property
    def tool_server(self) -> ToolServer:
        """The tool server that runs MCP tools for the kernel. Raises RuntimeError before `start()` and when
        attached to a workspace (whose supervisor runs the tool server)."""
        if self._tool_server is None:
            raise RuntimeError("the code executor is not running: use 'async with CodeExecutor()' or start()")
        return self._tool_server

    @property
    def kernel_gateway(self) -> KernelGateway | None:
        """The embedded kernel gateway (None when using an external one)."""
        return self._gateway

    async def start(self) -> None:
        """Start the tool server, the kernel gateway (unless external) and a kernel."""
        if self._client is not None:
            raise RuntimeError("the code executor is already running")
        logger.setLevel(self.log_level)
        if self.workspace is not None:
            await self._attach(self.workspace)
            return
        try:
            self._tool_server = self._create_tool_server()
            await self._tool_server.start()
            env = {**self.kernel_env, **self._tool_server.kernel_env}
            kernel_env: dict[str, str] | None = None
            if self.kernel_gateway_url is not None:
                endpoint = GatewayEndpoint(self.kernel_gateway_url.rstrip("/"), self.kernel_gateway_token)
                kernel_env = env
            else:
                self._gateway = KernelGateway(
                    host=self.kernel_gateway_host,
                    port=self.kernel_gateway_port,
                    env=env,
                    working_dir=self.working_dir,
                    kernel_spec=await self._kernel_spec(),
                    log_level=self.log_level,
                )
                await self._gateway.start()
                endpoint = self._gateway.endpoint
            self._client = KernelClient(
                endpoint,
                images_dir=self.images_dir,
                output_dir=self.output_dir,
                max_output_chars=self.max_output_chars,
                kernel_env=kernel_env,
                spare_kernel=self.spare_kernel,
                # A kernel that dies while starting is reported with the end of the gateway's log.
                gateway_log=self._gateway.log_path if self._gateway is not None else None,
            )
            await self._client.connect()
        except BaseException:
            await self.stop()
            raise

    async def _attach(self, workspace: Path) -> None:
        from ipybox.running.attach import WorkspaceSession

        session = WorkspaceSession(
            workspace,
            self._on_approval,
            self._pause_timer,
            images_dir=self.images_dir,
            output_dir=self.output_dir,
            max_output_chars=self.max_output_chars,
        )
        await session.open()
        self._session, self._client = session, session.kernel_client

    async def _kernel_spec(self) -> KernelSpec | None:
        if not self.sandbox:
            return None
        from ipybox.sandbox import DomainProxy, SandboxPolicy, sandboxed_kernel_spec

        policy = SandboxPolicy.from_file(self.sandbox_config) if self.sandbox_config else SandboxPolicy()
        proxy_socket = None
        if policy.network.allowed_domains:
            self._proxy = DomainProxy(policy.network.allowed_domains, policy.network.denied_domains)
            proxy_socket = await self._proxy.start()
        # The sandbox shows the working dir's top level as it was when a kernel started: a package
        # directory made later would stay out of sight until a reset, so it is made now.
        if self.mcptools_dir.parent.resolve() == self.working_dir.resolve():
            self.mcptools_dir.mkdir(exist_ok=True)
        return sandboxed_kernel_spec(
            policy,
            self.working_dir,
            tool_socket=Path(self.tool_server.calls_address.removeprefix("unix:")),
            proxy_socket=proxy_socket,
        )

    def _create_tool_server(self) -> ToolServer:
        registry = ServerRegistry()
        servers = {**registry.servers(self.mcptools_dir), **self.mcp_servers}
        server = ToolServer(
            host=self.tool_server_host,
            port=self.tool_server_port,
            approval_required=True,
            approval_timeout=self.approval_timeout,
            connect_timeout=self.connect_timeout,
            log_level=self.log_level,
            servers=servers,
            media_dir=self.images_dir or Path("images"),
            dotenv_path=self.working_dir / ".env",
            # Sources generated after the executor started are found in the registry on first use.
            lookup=lambda name: registry.servers(self.mcptools_dir).get(name),
            # Annotations recorded at generation decide a server's calls before it first starts here
            # (only for the parameters they were listed with).
            annotations_lookup=lambda name, params: registry.recorded_annotations(
                self.mcptools_dir, name, params
            ),
        )
        server.approval.handler = self._on_approval
        server.approval_wait = self._pause_timer
        return server

    async def stop(self) -> None:
        """Stop the kernel(s), the embedded gateway, the tool server and its MCP servers. Leaves no process
        behind."""
        client, self._client = self._client, None
        gateway, self._gateway = self._gateway, None
        tool_server, self._tool_server = self._tool_server, None
        proxy, self._proxy = self._proxy, None
        session, self._session = self._session, None
        if session is not None:
            await session.close()
            return
        try:
            if client is not None:
                # An embedded gateway ends all its kernels when it stops.
                await client.disconnect(shutdown_kernels=gateway is None)
        finally:
            try:
                if gateway is not None:
                    await gateway.stop()
            finally:
                if tool_server is not None:
                    await tool_server.stop()
                if proxy is not None:
                    await proxy.stop()

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
        servers started so far; they start again on their next call."""
        if self._session is not None:  # the workspace's MCP servers are shared: they keep running
            await self.kernel_client.reset()
            return
        await asyncio.gather(self.kernel_client.reset(), self.tool_server.reset())
