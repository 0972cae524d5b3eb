"""The ipybox MCP server: `register_mcp_server`, `execute_ipython_cell`, `install_package`, `reset` and
`close_kernel`, for agents that act by writing code, plus code as tool (`search_tools`, `save_code_action`
and each saved code action as a tool of its own: `ipybox.mcp_server.code_actions`).

Kernels (`ipybox.mcp_server.kernels`): every kernel is a `CodeExecutor` attached to the workspace (leased
from its warm pool); all share the workspace's tool server and its approval rules.

- A handshake-era client (MCP 2025-11-25 and older) gets a kernel per MCP session, given back when the
  session ends (a client's DELETE, the MCP SDK's idle timeout for clients that vanished, the end of stdio).
- A 2026-07-28 client has no session. Over stdio one process serves one client, so calls without a handle
  share the process's kernel, as before. Over HTTP a call without a handle opens a kernel and its result
  ends with the kernel's handle, which later calls pass as `kernel`; `kernel="new"` opens another one
  (several per client are fine); handles expire unused (`[endpoints] kernel_idle`).
- `close_sessions` (and the sweep of an entered `WorkspaceMCP`) give back kernels whose end was not seen.

Asks: a tool call a rule answers with `ask` is put to the MCP client when it can answer (it declares
elicitation); otherwise the workspace's people are asked (the console, `ipybox approve`), or it is denied
and the cell's output says which rule to add. Handshake-era clients get an elicitation mid-call;
2026-07-28 clients get an `InputRequiredResult` and their retry resumes the same running cell
(`ipybox.mcp_server.rounds`), or, when they take tasks, a long cell becomes a task
(`ipybox.mcp_server.tasks`). `register_mcp_server` makes the host run what the client names, so it is
decided by the same rules (as the call `ipybox.register_mcp_server`; when no rule decides it, asked where
the kernels are sandboxed and allowed where they run unsandboxed on this host, since they could start it
themselves; see `ipybox.mcp_server.registration`) before anything is written, and asks the same way.

What the agent is told, the server's instructions and the notes in the descriptions of
`execute_ipython_cell` and `install_package`, is rendered from the workspace's configuration
(`ipybox.mcp_server.instructions`): sandbox on or off, the hosts it allows, where kernels write, who
answers asks, whether packages can be installed.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import mcp_types as types
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import trace
from pydantic import BaseModel, Field

from ipybox import __version__
from ipybox.approval.ask_events import AskQuestion
from ipybox.approval.request import ApprovalRequest
from ipybox.config import CONFIG_FILE, EndpointsSection, WorkspaceConfig
from ipybox.config.servers import map_server_name
from ipybox.executor.code_executor import CodeExecutor
from ipybox.kernels.result import CodeExecutionChunk, CodeExecutionError, CodeExecutionResult
from ipybox.lifecycle import Service, first_of, task_scope
from ipybox.mcp_client.params import check_server_name
from ipybox.mcp_server.code_actions import (
    CodeActions,
    WorkspaceMCPServer,
    add_code_action_tools,
)
from ipybox.mcp_server.files import add_file_tools
from ipybox.mcp_server.instructions import (
    cell_note,
    facts_of,
    package_failure_hint,
    package_note,
    render_instructions,
)
from ipybox.mcp_server.kernels import ACTION_CALL, NEW, Kernel, Kernels, caller_of, session_key
from ipybox.mcp_server.registration import (
    ALLOW_RULE_EXAMPLE,
    Registration,
    add_server,
    decide_own_call,
    decide_registration,
    load_workspace_config,
    parse_registration,
)
from ipybox.mcp_server.rounds import Operation, Operations
from ipybox.mcp_server.tasks import TASK_AFTER, TasksExtension, become_task, declares_tasks
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, Verdict
from ipybox.running.control_client import ControlClient
from ipybox.running.questions import ask_question
from ipybox.running.state import NotRunningError, StatePaths, read_state
from ipybox.running.status import ServerOutcome
from ipybox.safefs import read_file

T = TypeVar("T")

logger = logging.getLogger(__name__)

BeforeCall = Callable[[], Awaitable[None]]
"""Awaited before every tool call: `ipybox mcp` starts its workspace there, on first use."""


class _Approval(BaseModel):
    allow: bool = Field(description="Run this tool call?")


Asker = Callable[[str, dict[str, Any]], Awaitable[bool]]
"""Ask the MCP client about something (`True`: allowed): an elicitation mid-call on handshake-era
revisions, a question of an `Operation` answered in band on 2026-07-28."""


class WorkspaceMCP(Service):
    """The MCP server of a workspace, its callers' kernels and the work running for them.

    A `Service`: enter it (`async with`) while it serves. Its task group holds the 2026-07-28 calls between
    their rounds (`ipybox.mcp_server.rounds`) and the sweep that closes idle kernels; closing it cancels
    them, ends the `subscriptions/listen` streams and gives every kernel back to the pool.
    `close_sessions` gives back the idle ones on demand.

    Attributes:
        server: The MCP server (serve it over stdio or streamable HTTP).
        kernels: The callers' kernels, by session and by handle.
        operations: The calls running for 2026-07-28 clients.
    """

    def __init__(
        self,
        server: WorkspaceMCPServer,
        kernels: Kernels,
        operations: Operations,
        actions: CodeActions,
        sweep_every: float = 60.0,
    ) -> None:
        super().__init__("mcp-server")
        self.server = server
        self.kernels = kernels
        self.operations = operations
        self._actions = actions
        self._sweep_every = sweep_every

    async def _startup(self) -> None:
        self.operations.attach(lambda work, name: self.spawn(work, name=name))
        self._actions.spawn = lambda work, name: self.spawn(work, name=name)
        self.spawn(self._sweep(), name="ipybox-mcp-sweep")

    async def _shutdown(self) -> None:
        self.operations.detach()
        self._actions.spawn = None
        self.server.end_subscriptions()
        await self.close_sessions(0)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_every)
            self.operations.sweep()
            await self.kernels.close_idle()

    async def close_sessions(self, idle_for: float = 0) -> None:
        """Give back the kernels unused for `idle_for` seconds (all of them by default: the server stops,
        and so does a description of saved actions running in the background)."""
        if idle_for <= 0:
            self._actions.stop_describing()
        await self.kernels.close_idle(idle_for)


def create_server(
    workspace: Path,
    *,
    output_dir: Path | None = None,
    kernel_idle: float | None = None,
    max_kernels: int | None = None,
    config: WorkspaceConfig | None = None,
    before_call: BeforeCall | None = None,
) -> WorkspaceMCP:
    """The MCP server for the running workspace in `workspace` (see `ipybox up` / `ipybox mcp`); enter the
    result while serving it.

    Args:
        workspace: The workspace directory; a supervisor must be running for it.
        output_dir: Where complete outputs too long to return are saved (default: `.ipybox/outputs`).
        kernel_idle: Seconds a client's kernel may sit unused before it goes back to the pool (default:
            `[endpoints] kernel_idle`).
        max_kernels: How many kernel handles one client may hold (default: `[endpoints] max_kernels`).
        config: The workspace's effective configuration, which the instructions and tool descriptions
            describe (default: loaded from `ipybox.toml`; the server reads, never writes, it).
        before_call: Awaited before every tool call (see `BeforeCall`); a `ToolError` it raises is the
            call's error.
    """
    workspace = workspace.resolve()
    outputs = output_dir or workspace / ".ipybox" / "outputs"
    if config is None:
        config = _config(workspace)
    endpoints = config.endpoints if config is not None else EndpointsSection()
    facts = facts_of(config) if config is not None else None
    operations = Operations()
    server = WorkspaceMCPServer(
        name="ipybox",
        version=__version__,
        instructions=render_instructions(facts),
        extensions=[TasksExtension(operations, _render_task)],
    )
    server.before_call = before_call
    if not _tracing():
        # mcp wraps every message in a span, which costs even with no exporter to send it to.
        server.middleware[:] = [m for m in server.middleware if not isinstance(m, OpenTelemetryMiddleware)]

    async def open_executor(ctx: Context) -> CodeExecutor:
        executor = CodeExecutor(workspace=workspace, output_dir=outputs, images_dir=workspace / "images")
        # A client that can't elicit gets no questions: the workspace asks people (console, `ipybox
        # approve`) instead, and tells the session only so that its cell's clock stops meanwhile.
        executor._ask_answers = "elicitation" if _can_elicit(ctx) else "none"
        await executor.start()
        return executor

    kernels = Kernels(
        open_executor,
        idle=kernel_idle if kernel_idle is not None else endpoints.kernel_idle,
        max_kernels=max_kernels if max_kernels is not None else endpoints.max_kernels,
    )

    async def kernel_for(
        ctx: Context, handle: str | None, *, open_new: bool = True
    ) -> tuple[Kernel, str | None]:
        """The kernel a call runs in, and the handle to tell the client when the call opened one."""
        if handle is not None and handle != NEW:
            kernel = kernels.get(handle, ctx)
        else:
            key = None if handle == NEW else session_key(ctx)
            if key is None and handle is None and ACTION_CALL.get():
                kernel = await _shielded(kernels.open_for_call(ctx))
                return kernel, None
            if key is None:  # a new kernel asked for, or a 2026-07-28 call over HTTP: no session to keep one
                if not open_new:
                    raise ToolError(
                        "name the kernel: pass the handle execute_ipython_cell returned as `kernel`"
                    )
                kernel = await _shielded(kernels.open(ctx))
                kernel.touch()
                return kernel, kernel.handle
            kernel = await session_kernel(ctx, key)
        kernel.touch()
        return kernel, None

    async def session_kernel(ctx: Context, key: str) -> Kernel:
        known = kernels.of_session(key)
        if known is not None:
            return known
        # Shielded: when the session ends while its kernel is being leased, the request is cancelled, and
        # cleanup in a cancelled anyio scope cannot await, so the lease stayed taken. Finished, the session
        # is known and its end gives the lease back.
        kernel, opened = await _shielded(kernels.open_session(key, ctx))
        if opened and not _modern(ctx):
            # A 2026-07-28 request's connection ends with the request: stdio's kernel lasts the process.
            ended = _session_end(ctx)
            if ended is not None:
                ended.push_async_callback(kernels.end_session, key, kernel)
        return kernel

    @asynccontextmanager
    async def executor_of(ctx: Context) -> AsyncIterator[CodeExecutor]:
        token = ACTION_CALL.set(True)  # a caller without a kernel gets one for this call, no handle
        try:
            kernel, _ = await kernel_for(ctx, None)
        finally:
            ACTION_CALL.reset(token)
        try:
            yield kernel.executor
        finally:
            await kernels.release(kernel)

    # search_tools, save_code_action, and each saved code action as a tool (`code_actions`).
    actions = add_code_action_tools(server, workspace, executor_of, kernels.executors)

    async def in_rounds(
        ctx: Context, work: Callable[[Asker], Awaitable[T]], meta: dict[str, Any]
    ) -> T | InputRequiredResult:
        """Run `work` with a way to ask the client: mid-call on handshake-era revisions; on 2026-07-28 in
        an `Operation` whose questions go back as an `InputRequiredResult`, resumed by the retry."""
        if not _modern(ctx):
            return await work(lambda message, details: _elicit_allow(ctx, message))
        owner = caller_of(ctx)
        if ctx.request_state is not None:
            operation = operations.resume(ctx.request_state, owner)
            operation.answer(ctx.input_responses)
        else:
            operation = Operation[T](owner, meta)
            operations.start(operation, lambda op: work(op.ask))
        return await _drive(ctx, operation, operations)

    async def approve(ctx: Context, call: ToolCall) -> str | InputRequiredResult | None:
        """Decide a file coming in or going out (`ipybox.mcp_server.files`) as a call of ipybox's own."""

        async def decide(ask: Asker) -> str | None:
            try:
                config = await asyncio.to_thread(load_workspace_config, workspace)
            except ValueError as e:
                raise ToolError(str(e)) from None
            audit = AuditLog(StatePaths(config.resolve(config.workspace.state_dir)).audit)
            verdict = decide_own_call(
                config.approval, call, f"no rule applies; {call.tool} is asked by default"
            )
            logger.info(
                "%s of %s: %s (%s)", call.tool, call.args.get("path"), verdict.decision, verdict.reason
            )
            text = f"ipybox: allow {call.tool} of {call.args.get('path')!r} ({call.args.get('size')} bytes)?"
            return await _approve_call(ctx, ask, workspace, audit, call, verdict, text)

        return await in_rounds(ctx, decide, {"tool": call.tool})

    # upload_file and download_file, for clients that don't share the workspace's filesystem.
    add_file_tools(server, workspace, approve)

    @server.tool()
    async def register_mcp_server(
        server_name: str, server_params: dict[str, Any], ctx: Context
    ) -> str | InputRequiredResult:
        """Add an MCP server to the workspace and generate its Python API under mcptools/<server_name>/.
        The workspace's approval rules decide whether it may be added; without a rule for it, the user
        is asked if the kernels are sandboxed (it is allowed if they are not).

        Args:
            server_name: The package name the generated API gets, a Python identifier; another name
                (`my-server`) is mapped to one (`my_server`), and the result says so.
            server_params: {"command", "args", "env", "cwd", "sandbox"} for a stdio server, or {"url",
                "headers", "type"} for a remote one ("type": "streamable_http" or "sse"). In a workspace
                with sandboxed kernels, a stdio server runs sandboxed ("sandbox": true unless a policy is
                given), and a policy beyond the kernels' (writing outside the workspace or below its top
                level, hosts or sockets they can't reach) is always asked. "${VAR}" placeholders are filled on the host from its environment or the
                workspace's .env; their values never reach the kernel.

        Returns the generated modules, e.g. "mcptools.fetch: fetch" (import mcptools.<server_name>.<tool>).
        """

        async def register(ask: Asker) -> str:
            modules = await _register(workspace, ctx, ask, server_name, server_params)
            # Registering adds modules, not MCP tools; but a saved action that needed the new server to
            # import may now be listed (announced if so).
            await actions.describe_failed_again()
            return modules

        return await in_rounds(ctx, register, {"tool": "register_mcp_server"})

    @server.tool()
    @_noted(cell_note(facts))
    async def execute_ipython_cell(
        code: str,
        ctx: Context,
        timeout: float = 120,
        max_output_chars: int = 5000,
        kernel: str | None = None,
    ) -> list[types.TextContent | types.ImageContent] | InputRequiredResult:
        """Execute Python code in a stateful IPython kernel (variables, imports and definitions persist)
        and return its output. Code can import the generated APIs of registered MCP servers
        (`from mcptools.<server> import <tool>`). Output longer than max_output_chars is cut to its first
        max_output_chars characters, followed by "[Output truncated: exceeded N character limit]" and the
        path of a file holding the complete output. Plots come back as images.

        Args:
            code: Python code (IPython syntax, top-level await allowed).
            timeout: Seconds the code may run before it is interrupted.
            max_output_chars: Characters of output to return at most (the first ones).
            kernel: Which kernel to run in. Omitted: this connection's kernel; a client without one (MCP
                2026-07-28 over HTTP) gets a new kernel, and the result ends with its handle. "new": a new
                kernel (several at once are fine). A handle ("kernel-..."): that kernel, with the state
                earlier calls left in it; pass the handle a result gave you to keep your variables.
        """
        if _modern(ctx):
            if ctx.request_state is not None:
                operation = operations.resume(ctx.request_state, caller_of(ctx))
                operation.answer(ctx.input_responses)
            else:
                target, announce = await kernel_for(ctx, kernel)
                cell = _Cell(
                    target, code, timeout, max_output_chars, announce, _can_elicit(ctx), kernels.release
                )
                operation = Operation[_Content](caller_of(ctx), {"tool": "execute_ipython_cell"})
                operation.on_cancel(cell.cancel)
                operations.start(operation, cell.run)
            async with _reporting_progress(ctx, timeout):  # a long round keeps its client informed
                return await _drive(ctx, operation, operations, tasks=declares_tasks(ctx))
        target, announce = await kernel_for(ctx, kernel)
        denied: list[str] = []
        async with target.lock:
            _bound_output(target.executor, max_output_chars)
            result: CodeExecutionResult | None = None
            error: str | None = None
            try:
                async with _reporting_progress(ctx, timeout):
                    async for item in target.executor.stream(code, timeout=timeout):
                        if isinstance(item, ApprovalRequest):
                            if not await _ask(ctx, item):
                                denied.append(str(item))
                        elif isinstance(item, CodeExecutionResult):
                            result = item
            except CodeExecutionError as e:
                error = str(e)
            except TimeoutError as e:
                error = str(e) or f"the code ran past its timeout of {timeout:g} s and was interrupted"
            except anyio.get_cancelled_exc_class():
                # The client cancelled the request. Its scope stays cancelled, so what frees the kernel for
                # the next call must be shielded; the session's lock is held until the kernel is free.
                with anyio.CancelScope(shield=True):
                    if not await target.executor.kernel_client.interrupt_until_idle():
                        logger.warning("a cancelled execution did not stop when interrupted")
                raise
            finally:
                target.touch()
        return await _render(result, error, denied, max_output_chars, announce, _can_elicit(ctx))

    @server.tool()
    @_noted(package_note(facts))
    async def install_package(package_name: str, ctx: Context, kernel: str | None = None) -> str:
        """Install a Python package into the kernel's environment with pip.

        Args:
            package_name: A requirement such as "requests", "numpy>=1.20" or "git+https://...".
            kernel: The kernel to install from, as for execute_ipython_cell (the package is installed into
                the environment every kernel of the workspace shares).
        """
        if not package_name.strip() or any(c in package_name for c in "\n\r\0"):
            raise ToolError("package_name must be one requirement, e.g. 'requests' or 'numpy>=1.20'")
        now = await asyncio.to_thread(_config, workspace)
        current = facts_of(now) if now is not None else facts
        # In the sandbox a refused connection is the policy, not a glitch: pip's five retries (with their
        # back-off) would only delay the answer.
        retries = ["--retries", "0"] if current is not None and current.sandboxed else []
        target, announce = await kernel_for(ctx, kernel)
        argv = ["-m", "pip", "install", "--quiet", *retries, package_name.strip()]
        code = (
            "import subprocess as _sp, sys as _sys\n"
            f"_r = _sp.run([_sys.executable, *{argv!r}], "
            "capture_output=True, text=True)\n"
            "print(_r.stdout[-3000:] + _r.stderr[-3000:])\n"
            "print('exit', _r.returncode)"
        )
        async with target.lock:
            result = await target.executor.execute(code, timeout=600)
            target.touch()
        text = (result.text or "").strip()
        if not text.endswith("exit 0"):
            hint = package_failure_hint(current) if current is not None else None
            raise ToolError(
                f"pip could not install {package_name!r}:\n{text}" + (f"\n{hint}" if hint else "")
            )
        return f"installed {package_name}" + _handle_note(announce)

    @server.tool()
    async def reset(ctx: Context, kernel: str | None = None) -> str:
        """Start over with a fresh kernel: variables and imports are gone; installed packages and the
        generated mcptools/ stay.

        Args:
            kernel: The kernel to reset, as for execute_ipython_cell; its handle stays valid.
        """
        target, _ = await kernel_for(ctx, kernel, open_new=False)
        async with target.lock:
            await target.executor.reset()
            target.touch()
        return "the kernel was reset"

    @server.tool()
    async def close_kernel(kernel: str, ctx: Context) -> str:
        """Close a kernel you opened (its variables are gone) when you no longer need it. Kernels unused
        for a while are closed anyway.

        Args:
            kernel: The handle execute_ipython_cell returned ("kernel-...").
        """
        await kernels.close(kernels.get(kernel, ctx))
        return f"kernel {kernel} was closed"

    return WorkspaceMCP(server, kernels, operations, actions)


_Content = list[types.TextContent | types.ImageContent]


class _Cell:
    """A cell of a 2026-07-28 client, run as an `Operation`: its asks become the operation's questions."""

    def __init__(
        self,
        kernel: Kernel,
        code: str,
        timeout: float,
        max_output_chars: int,
        announce: str | None,
        can_elicit: bool,
        release: Callable[[Kernel], Awaitable[None]],
    ) -> None:
        self.kernel = kernel
        self.release = release
        self.code = code
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self.announce = announce
        self.can_elicit = can_elicit

    async def cancel(self) -> None:
        # The stream ends (without a result, as 0.9.2's); the kernel keeps its state.
        self.kernel.executor.cancel()

    async def run(self, operation: Operation[_Content]) -> _Content:
        denied: list[str] = []
        result: CodeExecutionResult | None = None
        error: str | None = None
        tail = ""
        async with self.kernel.lock:
            executor = self.kernel.executor
            _bound_output(executor, self.max_output_chars)
            try:
                async for item in executor.stream(self.code, timeout=self.timeout, chunks=True):
                    if isinstance(item, ApprovalRequest):
                        if not await self._ask(operation, item):
                            denied.append(str(item))
                    elif isinstance(item, CodeExecutionChunk):
                        tail = (tail + item.text)[-_PROGRESS_TAIL:]
                        operation.say(tail)
                    elif isinstance(item, CodeExecutionResult):
                        result = item
            except CodeExecutionError as e:
                error = str(e)
            except TimeoutError as e:
                error = str(e) or f"the code ran past its timeout of {self.timeout:g} s and was interrupted"
            finally:
                self.kernel.touch()
        await self.release(self.kernel)
        if operation.cancelled:
            error = "the cell was cancelled: it was interrupted, and its kernel keeps its state"
        return await _render(result, error, denied, self.max_output_chars, self.announce, self.can_elicit)

    async def _ask(self, operation: Operation[_Content], request: ApprovalRequest) -> bool:
        """Ask the client in band; a person may answer first (the console, `ipybox approve`), or the ask
        time out: the request is then settled, and the question withdrawn."""
        if not self.can_elicit:
            await request.reject()
            return False
        settled: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def on_settled(accepted: bool) -> None:
            if not settled.done():
                settled.set_result(accepted)

        request.add_done_callback(on_settled)
        rule = await _rule_of(self.kernel.executor, request)
        details = {
            "server": request.server_name,
            "tool": request.tool_name,
            "arguments": request.tool_args,
            **rule,
        }
        if request.provenance:
            details["provenance"] = request.provenance
        why = f" ({rule['reason']})" if rule.get("reason") else ""
        origins = "".join(f"\n{line}" for line in request.origin_lines())
        allowed = await operation.ask(
            f"ipybox: allow the tool call {request}?{why}{origins}", details, settled
        )
        if request.decision is not None:  # settled elsewhere first (or cancelled): as it was settled
            return bool(request.decision)
        await (request.accept() if allowed else request.reject())
        return allowed


_PROGRESS_TAIL = 2000


async def _drive(
    ctx: Context, operation: Operation[T], operations: Operations, tasks: bool = False
) -> T | InputRequiredResult:
    """Wait for `operation` on behalf of this round's request: its questions as an `InputRequiredResult`,
    its value once it ended, or (`tasks`: the client takes tasks) a task once it ran `TASK_AFTER` s.
    A cancelled request cancels the operation."""
    try:
        if tasks:
            status = await operation.wait(TASK_AFTER)
            if status == "running":
                operation.meta["task"] = True
                become_task(operation)
                return InputRequiredResult(request_state=operation.state)  # replaced by the task
        status = await operation.wait()
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await operation.cancel()
        raise
    if status == "asking":
        operation.round += 1
        requests = {key: question.request() for key, question in operation.questions.items()}
        return InputRequiredResult(input_requests=requests, request_state=operation.state)  # type: ignore[arg-type]
    operations.forget(operation)
    return operation.result()


async def _render_task(operation: Operation[Any]) -> types.CallToolResult:
    """A finished task's `CallToolResult` (a cell that raised: `isError`)."""
    try:
        content = operation.result()
    except ToolError as e:
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(e))], is_error=True)
    except Exception as e:  # as the SDK reports what a tool raises unexpectedly
        logger.warning("a task failed: %r", e)
        text = f"Error executing tool {operation.meta.get('tool', '')}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
    return types.CallToolResult(content=list(content))


def _bound_output(executor: CodeExecutor, max_output_chars: int) -> None:
    """Have the cell's output kept as ipybox 0.9.2's MCP server returned it: its first `max_output_chars`
    characters (not the SDK's head and tail); longer output is saved whole to a file.

    One character more is kept than returned: 0.9.2 compared the output without its trailing newline, so
    a print of exactly `max_output_chars` characters is not truncated (`_render` cuts what is longer)."""
    client = executor.kernel_client
    client.max_output_chars = max_output_chars + 1
    client.keep_output_tail = False


async def _render(
    result: CodeExecutionResult | None,
    error: str | None,
    denied: list[str],
    max_output_chars: int,
    announce: str | None,
    can_elicit: bool,
) -> _Content:
    """A cell's tool result: its output (or its error, raised as a `ToolError`), the images it displayed,
    and the handle of the kernel the call opened."""
    content: _Content = []
    text = error if error is not None else (result.text if result is not None else "") or ""
    if (
        error is None
        and result is not None
        and (result.output_file is not None or len(text) > max_output_chars)
    ):
        # As ipybox 0.9.2: the first max_output_chars characters (the collector kept those, see
        # `_bound_output`; what follows them in `text` is its own notice), then 0.9.2's notice, which
        # agents may look for; then where the whole output is, which 0.9.2 did not keep.
        text = text[:max_output_chars]
        text += f"\n\n[Output truncated: exceeded {max_output_chars} character limit]"
        if result.output_file is not None:
            text += f"\n[the complete output is in {result.output_file}]"
    if denied and not can_elicit:
        text += (
            "\n[ipybox: nobody could answer the approval questions of these calls, so they were denied: "
            f"{'; '.join(denied)}. This client cannot answer them; a person can, at the workspace's web "
            "console (`ipybox console` prints its login link) or with `ipybox approve`. Add an allow "
            "rule for them under [[approval.rules]] in ipybox.toml to run them without asking]"
        )
    text += _handle_note(announce)
    content.append(types.TextContent(type="text", text=text))
    for image in result.images if result is not None else []:
        try:  # the kernel may have replaced the file it displayed by a link to one it can't read
            data = base64.b64encode(await asyncio.to_thread(read_file, image)).decode()
        except OSError as e:
            content.append(types.TextContent(type="text", text=f"[ipybox: image not returned: {e}]"))
            continue
        content.append(types.ImageContent(type="image", data=data, mime_type="image/png"))
    if error is not None:
        raise ToolError(text)
    return content


def _handle_note(handle: str | None) -> str:
    if handle is None:
        return ""
    return (
        f'\n[ipybox: this ran in a new kernel, {handle}: pass kernel="{handle}" to the next calls to keep its '
        "variables; without it, each call over this connection starts a new kernel]"
    )


async def _register(
    workspace: Path, ctx: Context, ask: Asker, server_name: str, server_params: dict[str, Any]
) -> str:
    # A name as other clients' configurations spell them (`my-server`) is taken as `ipybox server add`
    # takes it: mapped to the package name it gets, and the mapping said in the result.
    given = server_name
    try:
        check_server_name(server_name)
    except ValueError:
        if server_name.strip():  # an empty one is refused as it is, below
            server_name = map_server_name(server_name)
    mapped = (
        f"{given!r} is registered as {server_name!r} (a server's name is its Python package). "
        if server_name != given
        else ""
    )
    try:
        config = await asyncio.to_thread(load_workspace_config, workspace)
        registration = await asyncio.to_thread(
            parse_registration, workspace, config, server_name, server_params
        )
    except ValueError as e:
        raise ToolError(str(e)) from None
    # The supervisor's audit log (it finds its state directory the same way).
    audit = AuditLog(StatePaths(config.resolve(config.workspace.state_dir)).audit)
    try:
        denied = await _approve_registration(ctx, ask, workspace, config.approval, audit, registration)
    except OSError as e:  # the decision could not be recorded: never act on an unrecorded decision
        raise ToolError(f"the audit log could not be written ({e}); nothing was registered") from None
    if denied is not None:
        raise ToolError(f"registering MCP server {server_name!r} was denied: {denied}. Nothing was written.")
    try:
        await asyncio.to_thread(add_server, workspace, registration)
    except ValueError as e:
        raise ToolError(str(e)) from None
    # The workspace applies the file now and answers with this server's outcome (no polling).
    outcome = await _apply(workspace, server_name)
    if outcome.state != "ready":
        raise ToolError(f"MCP server {server_name!r} could not be started: {outcome.error}")
    modules = sorted(
        p.stem for p in (workspace / "mcptools" / server_name).glob("*.py") if p.stem != "__init__"
    )
    return f"{mapped}mcptools.{server_name}: {', '.join(modules)}"


def _config(workspace: Path) -> WorkspaceConfig | None:
    """The workspace's configuration, or `None` when `ipybox.toml` does not load now (registering says
    why; the server then uses the default `[endpoints]` and tells the agent nothing about the sandbox)."""
    try:
        return load_workspace_config(workspace)
    except ValueError as e:
        logger.warning("the MCP server describes no workspace settings: %s", e)
        return None


def _noted(note: str) -> Callable[[T], T]:
    """Put `note` (about this workspace) at the end of a tool's description, before its arguments."""

    def noted(function: T) -> T:
        if not note:
            return function
        doc = function.__doc__ or ""
        head, args, rest = doc.partition("\n\n        Args:")
        function.__doc__ = f"{head}\n\n        {note}" + (args + rest if args else "")
        return function

    return noted


async def _shielded(work: Awaitable[T]) -> T:
    with anyio.CancelScope(shield=True):
        done = await work
    return done


async def _rule_of(executor: CodeExecutor, request: ApprovalRequest) -> dict[str, Any]:
    """Which rule asks about `request` and why, as the workspace's policy says now (for the question)."""
    workspace = executor.workspace
    if workspace is None:
        return {}
    try:
        config = await asyncio.to_thread(load_workspace_config, workspace)
    except ValueError:
        return {}
    verdict = config.approval.decide(request.call)
    return {"rule": verdict.rule_id, "reason": verdict.reason}


def _session_end(ctx: Context) -> AsyncExitStack | None:
    """What mcp unwinds when the MCP session of `ctx` ends: its connection's `exit_stack`.

    mcp 2.x documents `Connection.exit_stack` as the place for per-connection cleanup (unwound, shielded,
    when a client DELETEs its session, the SDK's idle timeout closes it, stdio ends or the server stops)
    but gives a tool's `Context` no public way to the `Connection`: the request's `ServerSession` holds it.
    `None` if that changes; the sweep (`close_sessions`) then gives the kernel back, later.
    """
    connection = getattr(ctx.request_context.session, "_connection", None)
    stack = getattr(connection, "exit_stack", None)
    if not isinstance(stack, AsyncExitStack):
        logger.warning("mcp has no exit stack for this MCP session: its kernel goes back only when idle")
        return None
    return stack


def _tracing() -> bool:
    """Whether OpenTelemetry has a tracer provider of its own (an SDK with an exporter) to record spans."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _can_elicit(ctx: Context) -> bool:
    capabilities = ctx.client_capabilities
    return capabilities is not None and getattr(capabilities, "elicitation", None) is not None


def _modern(ctx: Context) -> bool:
    """Whether the request of `ctx` speaks a stateless revision (2026-07-28): no session, asks in band."""
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


async def _elicit_allow(ctx: Context, message: str) -> bool:
    """Ask a handshake-era client mid-call; `False` unless it accepts with `allow`."""
    try:
        answer = await ctx.elicit(message, _Approval)
    except Exception as e:  # the client broke off: never approve what nobody approved
        logger.warning("elicitation failed (%s): denying", e)
        return False
    return bool(answer.action == "accept" and getattr(answer, "data", None) is not None and answer.data.allow)


async def _ask(ctx: Context, request: ApprovalRequest) -> bool:
    """Ask the MCP client about a tool call (elicitation); `False` when it can't answer. A person may
    answer first (the console, `ipybox approve`): the request is then withdrawn and the dialog dropped."""
    if not _can_elicit(ctx):
        await request.reject()
        return False
    settled = asyncio.Event()
    request.add_done_callback(lambda accepted: settled.set())
    answers: list[Any] = []

    async def elicit() -> None:
        origins = "".join(f"\n{line}" for line in request.origin_lines())
        answers.append(await ctx.elicit(f"ipybox: allow the tool call {request}?{origins}", _Approval))

    try:
        # Whichever ends first: the client's answer, or a settlement elsewhere (its dialog is then dropped).
        await first_of(elicit(), settled.wait())
    except Exception as e:  # the client broke off: never approve what nobody approved
        logger.warning("elicitation failed (%s): denying %s", e, request)
        await request.reject()
        return False
    if request.withdrawn_by is not None or not answers:
        return bool(request.decision)
    answer = answers[0]
    allowed = answer.action == "accept" and getattr(answer, "data", None) is not None and answer.data.allow
    await (request.accept() if allowed else request.reject())
    return bool(allowed)


async def _approve_registration(
    ctx: Context,
    ask: Asker,
    workspace: Path,
    policy: ApprovalPolicy,
    audit: AuditLog,
    registration: Registration,
) -> str | None:
    """Decide a registration by the workspace's rules (`decide_registration`), asking as `_approve_call`
    does. `None` when it may go ahead, else why not.

    Raises:
        OSError: The audit log could not be written.
    """
    verdict = decide_registration(policy, registration)
    logger.info("registration of MCP server %r: %s (%s)", registration.name, verdict.decision, verdict.reason)

    def unanswered(reason: str) -> str:
        if registration.exceeds is not None:
            # No rule can let it through: say what goes beyond, and who can approve it.
            return reason + (
                f". {registration.exceeds[0].upper()}{registration.exceeds[1:]} (at the workspace's web "
                f"console, `ipybox console`, or with `ipybox approve`), or add the server to {CONFIG_FILE} "
                "yourself"
            )
        if "nobody is connected" in reason:
            return (
                reason + f". To let MCP clients register servers, add to {CONFIG_FILE}:\n{ALLOW_RULE_EXAMPLE}"
            )
        return reason

    return await _approve_call(
        ctx,
        ask,
        workspace,
        audit,
        registration.call(),
        verdict,
        f"ipybox: {registration}. Allow?",
        unanswered,
    )


async def _approve_call(
    ctx: Context,
    ask: Asker,
    workspace: Path,
    audit: AuditLog,
    call: ToolCall,
    verdict: Verdict,
    question_text: str,
    unanswered: Callable[[str], str] = lambda reason: reason,
) -> str | None:
    """Act on `verdict` for a call of ipybox's own (a registration, a file in or out); when it says `ask`,
    the running workspace routes the question (the MCP client through `ask`, the people at its console or
    in `ipybox approve`), as for the tool calls of its code; the first answer wins and the other question
    is withdrawn. `None` when it may go ahead, else why not (`unanswered` adds what to do when nobody
    answered). The decision is audited before anything happens.

    Raises:
        OSError: The audit log could not be written.
    """
    source = f"rule {verdict.rule_id!r}" if verdict.rule_id is not None else f"the default for {call.tool}"
    if verdict.decision != "ask":
        await asyncio.to_thread(audit.record, call, verdict)
        return None if verdict.decision == "allow" else f"denied by {source}"
    question = AskQuestion(
        server=call.server,
        tool=call.tool,
        args=dict(call.args),
        annotations=dict(call.annotations),
        rule_id=verdict.rule_id,
        reason=verdict.reason,
        elicitation=_can_elicit(ctx),
    )

    async def elicit() -> bool:
        details = {
            "server": call.server,
            "tool": call.tool,
            "arguments": dict(call.args),
            "rule": verdict.rule_id,
        }
        return await ask(question_text, details)

    try:
        answered = await ask_question(read_state(workspace), question, elicit)
    except NotRunningError as e:
        answered = f"{source} asks, but the workspace cannot be reached ({e})"
    if isinstance(answered, str):
        reason = unanswered(answered)
        await asyncio.to_thread(audit.record, call, verdict, timed_out=True, reason=reason)
        return reason
    await asyncio.to_thread(
        audit.record,
        call,
        verdict,
        answer="allow" if answered.accept else "deny",
        decided_by=answered.route,
        scope=answered.scope,
        by=answered.by,
    )
    return None if answered.accept else f"rejected by {answered.by or answered.route}"


@asynccontextmanager
async def _reporting_progress(ctx: Context, timeout: float) -> AsyncIterator[None]:
    """While open, the request of `ctx` gets a progress notification every second (`_progress`)."""
    async with task_scope() as group:
        ticker = group.create_task(_progress(ctx, timeout))
        try:
            yield
        finally:
            ticker.cancel()


async def _progress(ctx: Context, timeout: float) -> None:
    # Long cells keep the client informed (and its request timeout from firing).
    started = asyncio.get_running_loop().time()
    while True:
        await asyncio.sleep(1)
        elapsed = asyncio.get_running_loop().time() - started
        try:
            await ctx.report_progress(elapsed, timeout, f"running for {elapsed:.0f} s")
        except Exception:
            return


async def _apply(workspace: Path, server_name: str) -> ServerOutcome:
    async with ControlClient(read_state(workspace)) as control:
        return await control.apply_server(server_name)
