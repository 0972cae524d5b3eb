"""The ipybox MCP server: `register_mcp_server`, `execute_ipython_cell`, `install_package` and `reset`,
for agents that act by writing code, plus code as tool (`search_tools`, `save_code_action` and each saved
code action as a tool of its own: `ipybox.mcp_server.code_actions`).

Each MCP session gets a kernel of its own from the workspace's warm pool (a `CodeExecutor` attached to the
workspace); all sessions share the workspace's tool server and its approval rules. A session's kernel goes
back to the pool when the session ends: a client's DELETE, the MCP SDK's idle timeout for clients that
vanished, the end of stdio. `close_sessions` is the backstop for sessions whose end was not seen.

A tool call a rule answers with `ask` becomes an elicitation to the MCP client when it supports them;
otherwise it is denied, and the cell's output says which rule to add. `register_mcp_server` makes the host
run what the client names, so it is decided by the same rules (as the call `ipybox.register_mcp_server`,
asked when no rule decides it; see `ipybox.mcp_server.registration`) before anything is written.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from opentelemetry import trace
from pydantic import BaseModel, Field

from ipybox import __version__
from ipybox.approval.ask_events import AskQuestion
from ipybox.approval.request import ApprovalRequest
from ipybox.config import CONFIG_FILE
from ipybox.executor.code_executor import CodeExecutor
from ipybox.kernels.result import CodeExecutionError, CodeExecutionResult
from ipybox.mcp_server.code_actions import WorkspaceMCPServer, add_code_action_tools
from ipybox.mcp_server.registration import (
    ALLOW_RULE_EXAMPLE,
    Registration,
    add_server,
    decide_registration,
    load_workspace_config,
    parse_registration,
)
from ipybox.rules import ApprovalPolicy, AuditLog
from ipybox.running.control_client import ControlClient
from ipybox.running.questions import ask_question
from ipybox.running.state import NotRunningError, StatePaths, read_state
from ipybox.running.status import ServerOutcome
from ipybox.safefs import read_file

logger = logging.getLogger(__name__)

INSTRUCTIONS = """\
ipybox runs Python in a stateful, sandboxed IPython kernel. MCP servers registered with
register_mcp_server become typed Python APIs under mcptools/<server>/: one module per tool with a
pydantic `Params` model, a `Result` model (or str) and `run(params)` / `arun(params)`.
Discover them in code: `import mcptools.<server> as m; print(m.__doc__)` lists the tools, and
`help(mcptools.<server>.<tool>)` shows one. search_tools(query) finds tools and saved code
actions by what they do and names the file with each interface: read only those. Where a tool has
an output parser (mcpparse/<server>/<tool>.py: `ParseResult` + `parse(raw)`, which you may write
for tools without an output schema), prefer its `run_parsed()`. Compose many tool calls in one
execute_ipython_cell call (loops, conditionals) and print only what you need. Save code that
worked with save_code_action: it becomes gentools/<category>/<name>/ (import it in later code)
and the MCP tool <category>__<name>. Tool calls are approved by the workspace's rules."""


class _Approval(BaseModel):
    allow: bool = Field(description="Run this tool call?")


class _Session:
    """One MCP session's kernel."""

    def __init__(self, executor: CodeExecutor) -> None:
        self.executor = executor
        self.lock = asyncio.Lock()
        self.last_used = 0.0


@dataclass(frozen=True)
class WorkspaceMCP:
    """The MCP server of a workspace, and how to give back its sessions' kernels."""

    server: MCPServer
    close_sessions: Callable[[float], Awaitable[None]]


def create_server(workspace: Path, *, output_dir: Path | None = None) -> WorkspaceMCP:
    """The MCP server for the running workspace in `workspace` (see `ipybox up` / `ipybox mcp`).

    Args:
        workspace: The workspace directory; a supervisor must be running for it.
        output_dir: Where complete outputs too long to return are saved (default: `.ipybox/outputs`).
    """
    workspace = workspace.resolve()
    outputs = output_dir or workspace / ".ipybox" / "outputs"
    sessions: dict[str, _Session] = {}
    server = WorkspaceMCPServer(name="ipybox", version=__version__, instructions=INSTRUCTIONS)
    if not _tracing():
        # mcp wraps every message in a span, which costs even with no exporter to send it to.
        server.middleware[:] = [m for m in server.middleware if not isinstance(m, OpenTelemetryMiddleware)]

    async def session_of(ctx: Context) -> _Session:
        # stdio carries one session; over HTTP the transport names each one in a header.
        request = ctx.request_context.request
        headers = getattr(request, "headers", None)
        key = headers.get("mcp-session-id", "") if headers is not None else "stdio"
        session = sessions.get(key)
        if session is None:
            # Shielded: when the session ends while its kernel is being leased, the request is cancelled,
            # and cleanup in a cancelled anyio scope cannot await, so the lease stayed taken. Finished, the
            # session is known and its end gives the lease back.
            with anyio.CancelScope(shield=True):
                opened = await open_session(key, ctx)
            session = opened
        session.last_used = asyncio.get_running_loop().time()
        return session

    async def open_session(key: str, ctx: Context) -> _Session:
        executor = CodeExecutor(workspace=workspace, output_dir=outputs, images_dir=workspace / "images")
        # A client that can't elicit gets no questions: the workspace asks people (console, `ipybox
        # approve`) instead, and tells the session only so that its cell's clock stops meanwhile.
        executor._ask_answers = "elicitation" if _can_elicit(ctx) else "none"
        await executor.start()
        session = sessions.setdefault(key, _Session(executor))
        if session.executor is not executor:  # another request of the session won the race
            await executor.stop()
            return session
        ended = _session_end(ctx)
        if ended is not None:
            ended.push_async_callback(end_session, key, session)
        return session

    async def end_session(key: str, session: _Session) -> None:
        """Give back the kernel of a session that ended, once a call still finishing with it is done."""
        async with session.lock:
            if sessions.get(key) is not session:
                return  # the sweep gave it back already
            del sessions[key]
            await session.executor.stop()
        logger.info("MCP session %s ended: its kernel went back to the pool", key[:8])

    async def close_sessions(idle_for: float = 0) -> None:
        """Give back the kernels of sessions idle for `idle_for` seconds (all of them by default: the
        server stops, and so does a description of saved actions running in the background)."""
        if idle_for <= 0:
            actions.stop_describing()
        now = asyncio.get_running_loop().time()
        for key, session in list(sessions.items()):
            if now - session.last_used >= idle_for and not session.lock.locked():
                sessions.pop(key, None)
                await session.executor.stop()

    async def executor_of(ctx: Context) -> CodeExecutor:
        return (await session_of(ctx)).executor

    # search_tools, save_code_action, and each saved code action as a tool (`code_actions`).
    actions = add_code_action_tools(
        server, workspace, executor_of, lambda: [s.executor for s in sessions.values()]
    )

    @server.tool()
    async def register_mcp_server(server_name: str, server_params: dict[str, Any], ctx: Context) -> str:
        """Add an MCP server to the workspace and generate its Python API under mcptools/<server_name>/.
        The workspace's approval rules decide whether it may be added (usually the user is asked).

        Args:
            server_name: A Python identifier; the package name the generated API gets.
            server_params: {"command", "args", "env", "cwd", "sandbox"} for a stdio server, or {"url",
                "headers", "type"} for a remote one ("type": "streamable_http" or "sse"). In a workspace
                with sandboxed kernels, a stdio server runs sandboxed ("sandbox": true unless a policy is
                given), and a policy beyond the kernels' (writing outside the workspace or below its top
                level, hosts or sockets they can't reach) is always asked. "${VAR}" placeholders are filled on the host from its environment or the
                workspace's .env; their values never reach the kernel.

        Returns the generated modules, e.g. "mcptools.fetch: fetch" (import mcptools.<server_name>.<tool>).
        """
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
            denied = await _approve_registration(ctx, workspace, config.approval, audit, registration)
        except OSError as e:  # the decision could not be recorded: never act on an unrecorded decision
            raise ToolError(f"the audit log could not be written ({e}); nothing was registered") from None
        if denied is not None:
            raise ToolError(
                f"registering MCP server {server_name!r} was denied: {denied}. Nothing was written."
            )
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
        return f"mcptools.{server_name}: {', '.join(modules)}"

    @server.tool()
    async def execute_ipython_cell(
        code: str, ctx: Context, timeout: float = 120, max_output_chars: int = 5000
    ) -> list[types.TextContent | types.ImageContent]:
        """Execute Python code in this session's stateful IPython kernel (variables, imports and definitions
        persist) and return its output. Code can import the generated APIs of registered MCP servers
        (`from mcptools.<server> import <tool>`). Output longer than max_output_chars keeps its head and
        tail, and the complete text is saved to a file whose path is given. Plots come back as images.

        Args:
            code: Python code (IPython syntax, top-level await allowed).
            timeout: Seconds the code may run before it is interrupted.
            max_output_chars: How much output to return.
        """
        session = await session_of(ctx)
        denied: list[str] = []
        async with session.lock:
            session.executor.kernel_client.max_output_chars = max_output_chars
            result: CodeExecutionResult | None = None
            error: str | None = None
            ticker = asyncio.create_task(_progress(ctx, timeout))
            try:
                async for item in session.executor.stream(code, timeout=timeout):
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
                    if not await session.executor.kernel_client.interrupt_until_idle():
                        logger.warning("a cancelled execution did not stop when interrupted")
                raise
            finally:
                ticker.cancel()
        content: list[types.TextContent | types.ImageContent] = []
        text = error if error is not None else (result.text if result is not None else "") or ""
        if result is not None and result.output_file is not None:
            # ipybox 0.9's notice, which agents may look for, then where the whole output is.
            text += f"\n\n[Output truncated: exceeded {max_output_chars} character limit]"
            text += f"\n[the complete output is in {result.output_file}]"
        if denied and not _can_elicit(ctx):
            text += (
                "\n[ipybox: nobody could answer the approval questions of these calls, so they were denied: "
                f"{'; '.join(denied)}. This client cannot answer them; a person can, at the workspace's web "
                "console (`ipybox console` prints its login link) or with `ipybox approve`. Add an allow "
                "rule for them under [[approval.rules]] in ipybox.toml to run them without asking]"
            )
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

    @server.tool()
    async def install_package(package_name: str, ctx: Context) -> str:
        """Install a Python package into the kernel's environment with pip.

        Args:
            package_name: A requirement such as "requests", "numpy>=1.20" or "git+https://...".
        """
        if not package_name.strip() or any(c in package_name for c in "\n\r\0"):
            raise ToolError("package_name must be one requirement, e.g. 'requests' or 'numpy>=1.20'")
        session = await session_of(ctx)
        code = (
            "import subprocess as _sp, sys as _sys\n"
            f"_r = _sp.run([_sys.executable, '-m', 'pip', 'install', '--quiet', {package_name.strip()!r}], "
            "capture_output=True, text=True)\n"
            "print(_r.stdout[-3000:] + _r.stderr[-3000:])\n"
            "print('exit', _r.returncode)"
        )
        async with session.lock:
            result = await session.executor.execute(code, timeout=600)
        text = (result.text or "").strip()
        if not text.endswith("exit 0"):
            raise ToolError(f"pip could not install {package_name!r}:\n{text}")
        return f"installed {package_name}"

    @server.tool()
    async def reset(ctx: Context) -> str:
        """Start over with a fresh kernel: variables and imports are gone; installed packages and the
        generated mcptools/ stay."""
        session = await session_of(ctx)
        async with session.lock:
            await session.executor.reset()
        return "the kernel was reset"

    return WorkspaceMCP(server, close_sessions)


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


async def _ask(ctx: Context, request: ApprovalRequest) -> bool:
    """Ask the MCP client about a tool call (elicitation); `False` when it can't answer. A person may
    answer first (the console, `ipybox approve`): the request is then withdrawn and the dialog dropped."""
    if not _can_elicit(ctx):
        await request.reject()
        return False
    settled = asyncio.Event()
    request.add_done_callback(lambda accepted: settled.set())
    eliciting = asyncio.ensure_future(ctx.elicit(f"ipybox: allow the tool call {request}?", _Approval))
    waiting = asyncio.ensure_future(settled.wait())
    try:
        await asyncio.wait({eliciting, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        if not eliciting.done():  # settled elsewhere first: the client's dialog is no longer wanted
            eliciting.cancel()
            with contextlib.suppress(BaseException):
                await eliciting
    if request.withdrawn_by is not None or eliciting.cancelled():
        return bool(request.decision)
    try:
        answer = eliciting.result()
    except Exception as e:  # the client broke off: never approve what nobody approved
        logger.warning("elicitation failed (%s): denying %s", e, request)
        await request.reject()
        return False
    allowed = answer.action == "accept" and getattr(answer, "data", None) is not None and answer.data.allow
    await (request.accept() if allowed else request.reject())
    return bool(allowed)


async def _approve_registration(
    ctx: Context, workspace: Path, policy: ApprovalPolicy, audit: AuditLog, registration: Registration
) -> str | None:
    """Decide a registration by the workspace's rules; when they say `ask`, the running workspace routes
    the question (the MCP client's elicitation, the people at its console or in `ipybox approve`), as for
    the tool calls of its code. `None` when it may go ahead, else why not. The decision is audited.

    Raises:
        OSError: The audit log could not be written.
    """
    call = registration.call()
    verdict = decide_registration(policy, registration)
    source = f"rule {verdict.rule_id!r}" if verdict.rule_id is not None else "the default for registrations"
    logger.info("registration of MCP server %r: %s (%s)", registration.name, verdict.decision, verdict.reason)
    if verdict.decision != "ask":
        await asyncio.to_thread(audit.record, call, verdict)
        return None if verdict.decision == "allow" else f"denied by {source}"
    # Routed by the workspace as `[approval] ask` says: this client (elicitation) or the people at the
    # console or in `ipybox approve`; the first answer wins and the other question is withdrawn.
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
        try:
            answer = await ctx.elicit(f"ipybox: {registration}. Allow?", _Approval)
        except Exception as e:  # the client broke off: never approve what nobody approved
            logger.warning("elicitation failed (%s): denying the registration", e)
            return False
        return bool(
            answer.action == "accept" and getattr(answer, "data", None) is not None and answer.data.allow
        )

    try:
        answered = await ask_question(read_state(workspace), question, elicit)
    except NotRunningError as e:
        answered = f"{source} asks, but the workspace cannot be reached ({e})"
    if isinstance(answered, str):
        reason = answered
        if registration.exceeds is not None:
            # No rule can let it through: say what goes beyond, and who can approve it.
            reason += (
                f". {registration.exceeds[0].upper()}{registration.exceeds[1:]} (at the workspace's web "
                f"console, `ipybox console`, or with `ipybox approve`), or add the server to {CONFIG_FILE} "
                "yourself"
            )
        elif "nobody is connected" in reason:
            reason += f". To let MCP clients register servers, add to {CONFIG_FILE}:\n{ALLOW_RULE_EXAMPLE}"
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
