"""`CodeExecutor`: the main entry point of the SDK.

One class, two backends ([backends][ipybox.executor.backends]), chosen by its options
([options][ipybox.executor.options]):

- embedded (`EmbeddedOptions`; no `workspace`): a tool server, a kernel gateway (unless
  `kernel_gateway_url` names one) and a kernel of its own, all stopped with the executor
  (`EmbeddedBackend`).
- workspace (`WorkspaceOptions`; `workspace=DIR`): a lease on the workspace `ipybox up` runs in DIR
  (`WorkspaceBackend`): its kernels, sandbox, environment, MCP servers and approval rules.

`CodeExecutor(options=...)` takes the options; the keyword arguments (ipybox 0.9.2's and later ones) are
read into them ([arguments][ipybox.executor.arguments]). Arguments that do not apply to the chosen mode
raise `ValueError`; arguments kept from ipybox 0.9 that do nothing warn with `DeprecationWarning`.
Constructing an executor starts nothing: `start()` (or `async with`) does.

`cancel()` stops the running `stream()`/`execute()` the same way on both backends: the kernel client
interrupts the code (`KernelClient.stream`'s `cancellation`), which also ends a tool call waiting in the
kernel (its connection to the tool server closes, and the server drops the call); approvals asked for
meanwhile are rejected at once, and those still undecided once the code stopped are rejected then (a
workspace forgets them). The stream then ends, as ipybox 0.9.2's, without a result and without the error the
stopped code raised (KeyboardInterrupt, `ApprovalRejectedError`, or a timeout that fired meanwhile), and
`execute()` returns the output up to the cancel, marked `cancelled=True` (0.9.2's `execute()` returns
`text=None` there: nothing here drops output that was produced). A `KernelDiedError` is still raised, since the kernel's
state is gone. A cancel that comes after the code finished changes nothing: its result is yielded as usual.

A running execution is a task of the executor's task group (a `Service` of `ipybox.lifecycle`, held from
`start()` to `stop()`), not of the `stream()` generator: a task group inside a generator would span its
`yield`s, so a failure of its task would cancel the consumer at whatever it awaits meanwhile, and a
generator closed by the garbage collector would exit the group in another task. The generator cancels the
task and waits for it when it is closed early; `stop()` cancels a running one first (its stream raises
`RuntimeError`), then stops the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self, Unpack, cast

from ipybox.approval.channel import Answers
from ipybox.approval.request import ApprovalRequest
from ipybox.executor.arguments import LATER_NAMES, UNSET, ExecutorArguments, LaterArguments, Unset, options_of
from ipybox.executor.backends import EmbeddedBackend, ExecutorHooks, WorkspaceBackend
from ipybox.executor.options import EmbeddedOptions, WorkspaceOptions
from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.kernel_client import ExecutionTimeoutError, KernelClient
from ipybox.kernels.result import CodeExecutionChunk, CodeExecutionError, CodeExecutionResult, KernelDiedError
from ipybox.kernels.timer import Cancellation
from ipybox.lifecycle import Service, cancel_and_wait, task_scope
from ipybox.limits import ResourceLimits
from ipybox.rules.calls import ToolCall
from ipybox.tool_server.tool_server import ToolServer

if TYPE_CHECKING:
    from ipybox.codeact.actions import SavedAction
    from ipybox.sandbox import DomainProxy

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

    def ask(self, request: ApprovalRequest) -> None:
        self.pending.add(request)
        request.add_done_callback(lambda accepted: self.pending.discard(request))
        self.queue.put_nowait(request)

    async def withdraw(self) -> None:
        """Reject the approvals still undecided (a cancelled execution's, once its code stopped), together."""
        undecided = [request for request in self.pending if request.decision is None]
        if undecided:
            async with task_scope() as group:
                for request in undecided:
                    group.create_task(_reject_quietly(request), name="ipybox-withdraw-approval")

    def ends_quietly(self, error: BaseException) -> bool:
        """Whether `error` ends a cancelled execution without being raised (what the cancel caused)."""
        if not self.cancellation.cancelled or isinstance(error, KernelDiedError):
            return False
        if isinstance(error, CodeExecutionError | ExecutionTimeoutError) and error.result is not None:
            if isinstance(error, ExecutionTimeoutError) and error.kernel_restarted:
                logger.warning("the cancelled code timed out meanwhile: its kernel was replaced")
            return True
        return False


async def _reject_quietly(request: ApprovalRequest) -> None:
    # Decided meanwhile the other way (a late `accept()`), or its channel closed: nothing is left to do.
    with contextlib.suppress(Exception):
        await request.reject()


class CodeExecutor:
    """Executes Python code in a stateful IPython kernel, with programmatic MCP tool calling.

    `CodeExecutor` starts an embedded kernel gateway (or uses one you run: `kernel_gateway_url`) and a
    kernel on it, or attaches to a running workspace (`workspace`). Variables, imports and definitions
    persist across executions until `reset()`.

    Which arguments apply where (see `ipybox.executor.arguments`): with `workspace`, only `images_dir`,
    `output_dir`, `max_output_chars`, `max_output_file_bytes`, `max_image_bytes`, `kernel_init_timeout`,
    `log_level` and `execute_accepts_asks`; the others are the workspace's `ipybox.toml`'s to decide, and
    passing one raises `ValueError` naming it and the setting to use instead. The arguments are read into
    `options`; `options=` passes them made already (`EmbeddedOptions` or `WorkspaceOptions`), alone.

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
        kernel_gateway_url: Use this running gateway (e.g. Jupyter Enterprise Gateway, kernels on other
            machines) instead of an embedded one. Its kernels need share no file with this machine: each is
            set up right after it starts (tool calls over TLS to this executor's tool server, the generated
            packages imported from it, `kernel_env`), so their Python needs ipybox installed. Only
            `KERNEL_*` variables of `kernel_env` go with the kernel start request (for the gateway's kernel
            templates). More settings (kernel spec, CA file, where tool calls are listened for):
            `options=EmbeddedOptions(gateway=ExternalGateway(...))`. Checked at `start()`: a gateway that
            does not answer, refuses the token or lacks the kernel spec is one `GatewayStartError`.
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
        options: The whole configuration as value objects, instead of the other arguments.
        execute_accepts_asks: With `workspace`: `execute()` accepts every call a rule answers with `ask`,
            as an embedded executor's `execute()` accepts every tool call (the audit log records the
            application as the one who allowed it). Off by default: code that runs unattended must not
            answer a rule that asks for a decision. `stream()` is not affected.
        client: With `workspace`: the name the people asked about this application's calls see (the web
            console, `ipybox approve`); default `<program> (pid N)`.

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
        workspace: str | Path | None = None,
        options: EmbeddedOptions | WorkspaceOptions | None = None,
        **arguments: Unpack[LaterArguments],
    ) -> None:
        # ipybox 0.9.2's positional arguments, then the keyword ones: those passed, by name.
        published = {
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
        }
        unknown = sorted(set(arguments) - LATER_NAMES)
        if unknown:
            raise TypeError(f"CodeExecutor() got an unexpected keyword argument {unknown[0]!r}")
        given = cast(
            ExecutorArguments,
            {**{name: value for name, value in published.items() if value is not UNSET}, **arguments},
        )
        if options is not None:
            if given or workspace is not None:
                named = ", ".join(f"{name}=" for name in [*given, *(["workspace"] if workspace else [])])
                raise ValueError(
                    f"options= holds the whole configuration: drop {named} (set it in the options instead)"
                )
        else:
            options, deprecated = options_of(given, workspace)
            for message in deprecated:
                warnings.warn(message, DeprecationWarning, stacklevel=2)
        self.options: EmbeddedOptions | WorkspaceOptions = options
        self._backend: EmbeddedBackend | WorkspaceBackend = (
            WorkspaceBackend(options) if isinstance(options, WorkspaceOptions) else EmbeddedBackend(options)
        )
        self._execution: _Execution | None = None
        self._tasks: Service | None = None  # the running execution's group, from `start()` to `stop()`
        self._lock = asyncio.Lock()
        self._hooks = ExecutorHooks(self._on_approval, self._pause_timer, self._declines, self._lock)

    @property
    def backend(self) -> EmbeddedBackend | WorkspaceBackend:
        """What runs the kernel: an [EmbeddedBackend][ipybox.executor.backends.EmbeddedBackend] or a
        [WorkspaceBackend][ipybox.executor.backends.WorkspaceBackend], made from `options`."""
        return self._backend

    @property
    def workspace(self) -> Path | None:
        """The workspace attached to (absolute), or `None` for an embedded executor."""
        return self.options.workspace if isinstance(self.options, WorkspaceOptions) else None

    @property
    def working_dir(self) -> Path:
        """The kernels' working directory (absolute): the workspace's, or the one the options name."""
        return self._backend.working_dir

    @property
    def images_dir(self) -> Path | None:
        return self.options.output.images_dir

    @property
    def output_dir(self) -> Path | None:
        return self.options.output.output_dir

    @property
    def max_output_chars(self) -> int:
        return self.options.output.max_output_chars

    @property
    def max_output_file_bytes(self) -> int | None:
        return self.options.output.max_output_file_bytes

    @property
    def max_image_bytes(self) -> int | None:
        return self.options.output.max_image_bytes

    @property
    def log_level(self) -> str:
        return self.options.log_level

    @property
    def limits(self) -> ResourceLimits:
        """What each kernel of an embedded executor may use (`limits=`); a workspace's kernels have its
        `[kernel.limits]`, and this is empty."""
        o = self.options
        return ResourceLimits() if isinstance(o, WorkspaceOptions) else o.kernel.limits

    @property
    def kernel_init_timeout(self) -> float | None:
        o = self.options
        return o.kernel_init_timeout if isinstance(o, WorkspaceOptions) else o.kernel.init_timeout

    @property
    def execute_accepts_asks(self) -> bool:
        return isinstance(self.options, WorkspaceOptions) and self.options.execute_accepts_asks

    @property
    def _ask_answers(self) -> Answers:
        # Kept for callers that set it after construction (the MCP server's sessions); new code passes
        # `WorkspaceOptions(answers=...)`.
        return self._backend.answers if isinstance(self._backend, WorkspaceBackend) else "application"

    @_ask_answers.setter
    def _ask_answers(self, answers: Answers) -> None:
        if isinstance(self._backend, WorkspaceBackend):
            self._backend.answers = answers

    def _name_client(self, name: str | None) -> None:
        """Name this session for the people asked about its calls (the MCP server's sessions: their
        client's `clientInfo`); before `start()`."""
        if isinstance(self._backend, WorkspaceBackend):
            self._backend.client_name = name

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
        tasks = Service("code executor")
        await tasks.start()
        try:
            await self._backend.start(self._hooks)
        except BaseException:
            await tasks.aclose()
            raise
        self._tasks = tasks

    async def stop(self) -> None:
        """Stop the running execution (its stream raises `RuntimeError`), then the kernel(s), the embedded
        gateway, the tool server and its MCP servers (or give the workspace's kernel back). Leaves no process
        behind, also when the caller is cancelled meanwhile (which it then sees)."""
        tasks, self._tasks = self._tasks, None
        try:
            if tasks is not None:
                await tasks.aclose()
        finally:
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
        `RuntimeError`), the code is interrupted and the stream ends, as in ipybox 0.9.2, without an
        exception and without a `CodeExecutionResult` (the output so far is what `chunks=True` yielded);
        `execute()` returns the output so far with `cancelled=True` (0.9.2's returns `text=None`).
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
        stream = self._stream(
            code, timeout, chunks=False, auto_approve=accepts, declines=declines, keep_cancelled=True
        )
        async for item in stream:
            # Declining, only calls the workspace refused already arrive here (nobody could be asked).
            if isinstance(item, ApprovalRequest) and accepts:
                await item.accept()
            elif isinstance(item, CodeExecutionResult):
                result = item
        if result is None:  # cancelled before any output could be collected
            return CodeExecutionResult(None, [], cancelled=True)
        return result

    def stream(
        self, code: str, timeout: float | None = 120, chunks: bool = False
    ) -> AsyncIterator[StreamItem]:
        """Execute code, yielding an `ApprovalRequest` for each MCP tool call, output chunks (with
        `chunks=True`) and, last, the result.

        Each approval request must be answered with `accept()` or `reject()`; several can be pending at once
        (when the code calls tools from threads or with `asyncio.gather`). A call left undecided fails after
        `approval_timeout` (never, when it is `None`). `timeout=None` lets the code run without a limit.
        After `cancel()` the stream ends without a result, as in ipybox 0.9.2 (see `cancel`).

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
        keep_cancelled: bool = False,
    ) -> AsyncIterator[StreamItem]:
        # `keep_cancelled`: end a cancelled execution with its result (the output so far, `cancelled=True`)
        # instead of 0.9.2's silent end of `stream()`; `execute()` returns it rather than dropping output.
        client = self.kernel_client
        async with self._lock:
            execution = _Execution(auto_approve, declines)
            queue = execution.queue

            async def run() -> None:
                outcome: object = _DONE
                try:
                    try:
                        async for item in client.stream(code, timeout, cancellation=execution.cancellation):
                            if chunks or isinstance(item, CodeExecutionResult):
                                queue.put_nowait(item)
                    except asyncio.CancelledError:
                        raise
                    except BaseException as e:
                        outcome = _Failed(e)
                    if execution.cancellation.cancelled:
                        # Only now that the code stopped. Rejected at once, a call waiting in the kernel raised
                        # ApprovalRejectedError just as the interrupt came, which then landed while IPython
                        # showed that traceback: a stray "KeyboardInterrupt" in the output (2 of 3 workspace
                        # test runs).
                        await execution.withdraw()
                except asyncio.CancelledError:
                    # By `stop()` (a stream that cancels it no longer reads the queue): the consumer must not
                    # wait forever, nor see a cancellation that is not its own.
                    queue.put_nowait(
                        _Failed(RuntimeError("the code executor was stopped while this code ran"))
                    )
                    raise
                queue.put_nowait(outcome)

            tasks = self._tasks
            if tasks is None or not tasks.running:
                raise RuntimeError(
                    "the code executor is not running: use 'async with CodeExecutor()' or start()"
                )
            self._execution = execution
            task = tasks.spawn(run(), name="ipybox-execution")
            try:
                while (item := await queue.get()) is not _DONE:
                    if isinstance(item, _Failed):
                        # The code stopped by a cancel may have failed before the client saw the cancel.
                        if not execution.ends_quietly(item.error):
                            raise item.error
                        partial = getattr(item.error, "result", None)
                        if keep_cancelled and isinstance(partial, CodeExecutionResult):
                            yield replace(partial, cancelled=True)
                        break  # cancelled: no result, as in 0.9.2
                    if isinstance(item, ApprovalRequest) and execution.cancellation.cancelled:
                        continue  # withdrawn (rejected) by the cancel
                    if isinstance(item, CodeExecutionResult) and item.cancelled:
                        if keep_cancelled:
                            yield item
                        break  # as in 0.9.2: a cancelled stream ends without a result
                    assert isinstance(item, ApprovalRequest | CodeExecutionChunk | CodeExecutionResult)
                    yield item
            finally:
                self._execution = None
                if not task.done():
                    # The caller stopped listening: stop the code too, so the kernel is free again (one
                    # interrupt can land before the code runs, or be swallowed by it), and withdraw the
                    # approvals it asked for (with no approval_timeout they would wait forever).
                    execution.cancellation.cancel()
                    # Its failure is not this caller's to see; the caller's own cancellation still is.
                    await cancel_and_wait(task)
                    await execution.withdraw()
                    with contextlib.suppress(Exception):
                        await client.interrupt_until_idle()

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
