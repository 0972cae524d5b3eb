"""`AsksService`: who decides a workspace's tool calls, and how people answer the `ask`s: the approver
(`WorkspaceApprover`, the `[approval]` rules), the ask board, the websockets that answer, and `always`
answers that become rules in `ipybox.toml`.

Contract:

- The approver is made with the service, deciding by the file's `[approval]`; `start()` arms the audit
  log's disk reserve (before a kernel can fill the disk, so decisions are recorded on a full one).
  `set_policy()` replaces the policy (the reconciler applied an edit).
- Three websockets answer asks, each served until its peer leaves, its work in a task group of its own
  scope (nothing outlives the connection):
  - `serve_approvals(lease, ws)`: the application holding `lease` answers its kernels' asks (the
    `ApprovalChannel` protocol of `ipybox.approval.channel`);
  - `serve_approver(ws, who)`: `ipybox approve`, a person at a terminal (the protocol of
    `ipybox.approval.ask_events`); while connected, `terminal` is a route that can answer;
  - `serve_asker(ws)`: a question from another process (the MCP server, about a client's
    `register_mcp_server`), answered by people or by the asker's MCP client (elicitation).
- An `always` answer writes a rule into `ipybox.toml` (refused with the reason when the file would not load
  with it) and `reload_rules()` applies it now; to an ask about a host (`WorkspaceApprover.ask_host`, the
  kernels' proxy's asker), it writes the host into `[sandbox.network] allowedDomains` (or
  `deniedDomains`) instead.
- `forget_session(lease)`: answers "for this session" of a released lease end.

The diagram of an ask's routes: `docs/design.md`, "Data path"; the websockets' protocols: "Protocols".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from starlette.websockets import WebSocket, WebSocketDisconnect

from ipybox.approval.ask_events import (
    AnswerMessage,
    AnswerResult,
    AnswerView,
    AskClosedMessage,
    AskOpenedMessage,
    AskQuestion,
    AskView,
    message_of,
)
from ipybox.approval.asks import AskAnswer, AskBoard, AskOpened, PendingAsk, Subscription
from ipybox.approval.channel import Answers, ApprovalChannel
from ipybox.approval.links import PathLink, path_links
from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.config import CONFIG_FILE, WorkspaceConfig
from ipybox.config.domain_writer import write_domain_answer
from ipybox.config.rule_writer import write_answer_rule
from ipybox.lifecycle import Service, first_of
from ipybox.reconcile.pins import ToolPins
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, Verdict
from ipybox.running.status import CallerId, LeaseId
from ipybox.supervisor.leases import LeaseTable
from ipybox.supervisor.proxy_clients import caller_of_client

logger = logging.getLogger("ipybox.supervisor")

_ANSWERS: dict[str, Answers] = {"application": "application", "elicitation": "elicitation", "none": "none"}
# Why a websocket handler stops: the peer left or the connection broke.
_GONE = (WebSocketDisconnect, RuntimeError, OSError)


class AsksService(Service):
    """The approver, the ask board and the answering websockets; see the module docstring.

    Args:
        workspace: The workspace directory.
        audit_path: Where decisions are recorded.
        leases: Who holds which kernel (whose application answers its asks).
        config: The configuration in effect (`[approval]` before the service started, servers' `cwd`).
        reload_rules: Applies `ipybox.toml`'s rules now; returns why the file does not load, if it doesn't.
        console_url: The web console's address, for the people asked (`None` when it is off).
        pins: The workspace's tool pins: calls to tools that differ from them are asked about.
        secrets: Values the audit log redacts wherever they occur (`[secrets]` resolved on the host).
    """

    def __init__(
        self,
        workspace: Path,
        audit_path: Path,
        *,
        leases: LeaseTable,
        config: Callable[[], WorkspaceConfig],
        reload_rules: Callable[[], Awaitable[Exception | None]],
        console_url: Callable[[], str | None],
        pins: ToolPins | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        super().__init__("asks")
        self.workspace = workspace
        self.audit_path = audit_path
        self.leases = leases
        self.config = config
        self.reload_rules = reload_rules
        self.console_url = console_url
        self.board = AskBoard()
        self.approver = WorkspaceApprover(
            config().approval,
            AuditLog(audit_path, secrets=secrets),
            leases.answerer,
            board=self.board,
            session_of=lambda caller: leases.lease_of(CallerId(caller)),
            write_rule=self._write_answer_rule,
            console=console_url,
            links=self._path_links,
            refusal_of=leases.refusal,
            pending_tool=pins.pending if pins is not None else (lambda server, tool: None),
            write_domain=self._write_domain_answer,
            caller_of_client=lambda pid: caller_of_client(leases, pid),
            session_info=leases.info,
            cell_text_of=leases.cell_text,
        )

    async def _startup(self) -> None:
        self.approver.audit.arm_reserve()  # before a kernel can fill the disk: decisions are recorded on a full one

    @property
    def policy(self) -> ApprovalPolicy:
        return self.approver.policy

    def set_policy(self, policy: ApprovalPolicy) -> None:
        self.approver.policy = policy

    @property
    def audit(self) -> AuditLog:
        return self.approver.audit

    def explain(self, call: ToolCall) -> list[tuple[ToolCall, Verdict]]:
        return self.approver.explain(call)

    async def answer(self, ask_id: str, answer: AskAnswer) -> str | None:
        return await self.approver.answer(ask_id, answer)

    def forget_session(self, lease: LeaseId) -> None:
        self.approver.forget_session(lease)

    # -- the websockets

    async def serve_approvals(self, lease: str, websocket: WebSocket) -> None:
        """The lease's application answers its kernels' asks on `websocket` until it leaves."""
        if lease not in self.leases:
            await websocket.close(code=4404, reason="unknown lease")
            return
        answers = websocket.query_params.get("answers", "application")
        if answers not in _ANSWERS:
            await websocket.close(code=4400, reason=f"answers must be one of {', '.join(_ANSWERS)}")
            return
        channel = self.leases.open_channel(
            LeaseId(lease),
            ApprovalChannel(True, self.config().approval.ask_timeout, answers=_ANSWERS[answers]),
        )
        try:
            await channel.connect(websocket)
        finally:
            if not channel.open:
                self.leases.close_channel(LeaseId(lease), channel)

    async def serve_approver(self, websocket: WebSocket, who: str) -> None:
        """Serve `ipybox approve` on `websocket` until it leaves: the board's events go out, answers come
        in; while it is connected, the terminal is a route that can answer."""
        await websocket.accept()
        by = f"terminal ({who})" if who else "terminal"
        sending = asyncio.Lock()

        async def send(text: str) -> None:
            async with sending:
                await websocket.send_text(text)

        async def receive() -> None:  # until the approver leaves
            while True:
                frame = await websocket.receive_text()
                try:
                    message = AnswerMessage.model_validate_json(frame)
                except ValueError as e:
                    await send(AnswerResult(id="", ok=False, error=f"not an answer: {e}").to_json())
                    continue
                answer = AskAnswer(message.accept, message.scope, "terminal", by, message.choices)
                why = await self.answer(message.id, answer)
                settled = self.board.settled_with(message.id) if why is None else 0
                result = AnswerResult(
                    id=message.id,
                    ok=why is None,
                    error=why,
                    settled=settled,
                    accept=message.accept if why is None else None,
                )
                await send(result.to_json())

        async def forward(subscription: Subscription) -> None:  # until it is cut off for not reading
            for ask in subscription.pending:
                await send(message_of(AskOpened(ask)).to_json())
            while (event := await subscription.events.get()) is not None:
                await send(message_of(event).to_json())
            await websocket.close(code=4408, reason="the approver fell behind: connect again")

        with self.board.present("terminal"), self.board.subscribe() as subscription:
            try:
                await first_of(receive(), forward(subscription))
            except _GONE as e:
                logger.debug("an approver left: %s", e)
            finally:
                with contextlib.suppress(Exception):
                    await websocket.close()

    async def serve_asker(self, websocket: WebSocket) -> None:
        """Serve a question from another process (`AskQuestion`) on `websocket`: route it, take the asker's
        elicitation answer if it was asked, and send the answer that won (`closed`). The asker leaving
        withdraws the question."""
        approver = self.approver
        await websocket.accept()
        try:
            question = AskQuestion.model_validate_json(await websocket.receive_text())
        except (ValueError, WebSocketDisconnect) as e:
            with contextlib.suppress(Exception):
                await websocket.close(code=4400, reason=f"not a question: {e}"[:120])
            return
        call = ToolCall(question.server, question.tool, question.args, question.annotations)
        opened = approver.open_question(
            call, Verdict("ask", question.rule_id, question.reason), elicitation=question.elicitation
        )
        if isinstance(opened, str):  # nobody can answer
            with contextlib.suppress(Exception):
                await websocket.send_text(AskClosedMessage(id="", why=opened).to_json())
                await websocket.close()
            return
        ask = opened
        why = "the asker went away"

        async def elicitation_answers() -> None:  # until the asker leaves
            while True:
                message = AnswerMessage.model_validate_json(await websocket.receive_text())
                if message.id == ask.id and ask.asked_of == "elicitation":
                    answer = AskAnswer(message.accept, "once", "elicitation", "the MCP client")
                    self.board.answer(ask.id, answer)

        async def close_when_answered() -> None:
            nonlocal why
            await websocket.send_text(AskOpenedMessage(ask=AskView.of(ask)).to_json())
            done, _ = await asyncio.wait([ask.answered], timeout=ask.timeout)
            if ask.answered in done and not ask.answered.cancelled():
                answer = AnswerView.of(ask.answered.result())
                await websocket.send_text(AskClosedMessage(id=ask.id, answer=answer).to_json())
            elif not done:
                why = f"no answer within {ask.timeout:g} s"
                await websocket.send_text(AskClosedMessage(id=ask.id, why=why).to_json())

        try:
            await first_of(close_when_answered(), elicitation_answers())
        except (*_GONE, ValueError) as e:  # ValueError: not an answer (the question is withdrawn)
            logger.debug("an asker left: %s", e)
        finally:
            self.board.close(ask, why=why)
            with contextlib.suppress(Exception):
                await websocket.close()

    # -- what the approver asks of the workspace

    def _path_links(self, call: ToolCall) -> dict[str, PathLink]:
        """Where `call`'s path arguments lead through links, resolved here on the host against the server's
        `cwd` (else the workspace), for the people and the application asked."""
        cwd = getattr(self.config().servers.get(call.server), "cwd", None)
        base = self.workspace / cwd if isinstance(cwd, str) else self.workspace
        return path_links(call.args, base=base, workspace=self.workspace)

    async def _write_domain_answer(self, host: str, accept: bool, by: str) -> None:
        """An `always` answer to an ask about a host (`[sandbox.network] unknown = "ask"`): the host goes
        into `allowedDomains` (or `deniedDomains`) of `ipybox.toml` (refused with the reason when the file
        would not load or not allow it), and the workspace loads the edit now: the kernels' proxy gets
        it as any network edit."""
        key = await asyncio.to_thread(write_domain_answer, self.workspace / CONFIG_FILE, host, accept=accept)
        logger.info("%s added %s to %s in %s", by, host, key, CONFIG_FILE)
        error = await self.reload_rules()
        if error is not None:  # checked before writing: only a concurrent edit gets here
            logger.warning("%s does not load after %s was added to %s: %s", CONFIG_FILE, host, key, error)

    async def _write_answer_rule(
        self, ask: PendingAsk, accept: bool, by: str, choices: Mapping[str, str] | None
    ) -> None:
        """An `always` answer: the rule it makes (narrowed by the person's `choices`) goes into
        `ipybox.toml` (refused with the reason when it would not load), and the workspace loads it now, as
        it would any edit."""
        written = await asyncio.to_thread(
            write_answer_rule,
            self.workspace / CONFIG_FILE,
            ask.call,
            accept=accept,
            asked_by=ask.rule_id,
            by=by,
            redact=self.approver.audit.redact,
            choices=choices,
        )
        logger.info("%s added rule %r to %s:%d", by, written.id, CONFIG_FILE, written.line)
        # The rule now; whatever else the file says is applied in the background (never waited for here).
        error = await self.reload_rules()
        if error is not None:  # checked before writing: only a concurrent edit gets here
            logger.warning("%s does not load after rule %r was added: %s", CONFIG_FILE, written.id, error)
