"""What people approving a workspace's `ask`s see and send: the web console's event stream (SSE, one
JSON message per event) and `ipybox approve`'s websocket (`/approvers` on the control socket), as models.

Server to approver, one text frame (or SSE `data:`) each:

```json
{"type": "opened", "ask": {"id": "3-Yc...", "server": "filesystem", "tool": "write_file",
 "args": {"path": "out/a.md"}, "annotations": {"destructiveHint": true}, "rule_id": "ask-for-writes",
 "reason": "rule 'ask-for-writes' applies", "subject": null, "session": "1f2e3d4c", "asked_of": "console",
 "routes": ["console", "terminal"], "asked_at": "2026-11-24T07:00:00.000000Z",
 "expires_at": "2026-11-24T07:01:00.000000Z", "links": {}}}
{"type": "closed", "id": "3-Yc...", "answer": {"accept": true, "scope": "once", "route": "console",
 "by": "console (root)"}, "why": ""}
{"type": "answered", "id": "3-Yc...", "ok": false, "error": "already allowed once by terminal (...)"}
```

An `opened` ask also carries, when known, `tier` and `explanation` (the asking rule's admin tier and
its own `reason` text), `client` (who asked: the session's name, start, allowed/denied counts and answers
"for this session"), `cell` (the cell's code, the call's line, verified by the host or as reported by
the kernel) and `provenance` (where argument values came from, matched on the host: see
[provenance][ipybox.rules.provenance]): see [ask_context][ipybox.approval.ask_context]. An `answered` result says how many asks the answer
`settled` (more than 1 for an answer "for this session" that covered the session's other waiting asks of
the tool) and which way (`accept`).

Approver to server (websocket only; the console posts forms):

```json
{"type": "answer", "id": "3-Yc...", "accept": true, "scope": "session"}
```

A process that needs a question answered outside a kernel's tool call (the MCP server, about an MCP
client's `register_mcp_server`) puts it on `/asks`: it sends one `question`, gets `opened` (routed) or
`closed` (nobody could answer, `why` says so), may answer with its client's elicitation (`answer`, for
which it was `asked_of`), and gets `closed` with the answer that won:

```json
{"type": "question", "server": "ipybox", "tool": "register_mcp_server", "args": {...},
 "annotations": {...}, "rule_id": null, "reason": "...", "elicitation": true}
```

Every message is a [WireMessage][ipybox.approval.message.WireMessage], as the application's protocol's
are ([wire][ipybox.approval.wire]), and a call is `server`/`tool`/`args` in both, as in
[ToolCall][ipybox.rules.calls.ToolCall]. On connecting, an approver gets one `opened` per ask pending then. Arguments are sent whole (an approver
folds long values for display); secrets are not redacted here, since the people reading them are the ones
the workspace runs for, but the audit log redacts them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, TypeAdapter

from ipybox.approval.ask_context import CellView, ClientView
from ipybox.approval.asks import AskAnswer, AskClosed, AskOpened, PendingAsk, Scope
from ipybox.approval.links import PathLink
from ipybox.approval.message import WireMessage
from ipybox.rules.calls import AskRoute, is_untrusted, origin_text, provenance_json

__all__ = [
    "AnswerMessage",
    "AnswerResult",
    "AnswerView",
    "AskClosedMessage",
    "AskOpenedMessage",
    "AskQuestion",
    "AskView",
    "ServerMessage",
    "message_of",
    "parse_server_message",
    "settled_text",
]


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


class AskView(WireMessage):
    """A pending ask as an approver shows it (see `PendingAsk`): the one view the console, `ipybox approve`
    and the MCP client's elicitation (through the approval wire's `CallParams.ask`) render.

    Besides the call (`server`, `tool`, `args`, `annotations`, `links`) and its routing:

    Attributes:
        rule_id: The rule that asked (`None`: the default decision); `reason` why, `tier` the admin policy
            it belongs to (`None`: `ipybox.toml`), `explanation` the rule's own `reason` text.
        session: The session's id, short (for a tooltip: `client` says who it is).
        client: Who asked: the session's name and history in one line (`ClientView.history()`).
        cell: The code of the cell that made the call, the call's line marked, and whether the host
            verified the text ([ask_context][ipybox.approval.ask_context]).
        provenance: Where argument values came from, by argument path: the earlier results of the same
            session each matched, on the host ([provenance][ipybox.rules.provenance]); empty when none did.
    """

    id: str
    server: str
    tool: str
    args: dict[str, Any]
    annotations: dict[str, Any] = Field(default_factory=dict)
    rule_id: str | None = None
    reason: str = ""
    subject: str | None = None
    session: str | None = None
    asked_of: AskRoute | None = None
    routes: list[AskRoute] = Field(default_factory=list)
    asked_at: str
    expires_at: str | None = None
    links: dict[str, PathLink] = Field(default_factory=dict)
    tier: str | None = None
    explanation: str | None = None
    client: ClientView | None = None
    cell: CellView | None = None
    provenance: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)

    @classmethod
    def of(cls, ask: PendingAsk) -> AskView:
        expires = ask.asked_at + timedelta(seconds=ask.timeout) if ask.timeout is not None else None
        return cls(
            id=ask.id,
            server=ask.call.server,
            tool=ask.call.tool,
            args=dict(ask.call.args),
            annotations=dict(ask.call.annotations),
            rule_id=ask.rule_id,
            reason=ask.reason,
            subject=ask.subject,
            session=ask.session[:8] if ask.session is not None else None,
            asked_of=ask.asked_of,
            routes=list(ask.routes),
            asked_at=_iso(ask.asked_at),
            expires_at=_iso(expires) if expires is not None else None,
            links=dict(ask.links),
            tier=ask.tier,
            explanation=ask.explanation,
            client=ask.client,
            cell=ask.cell,
            provenance=provenance_json(ask.call.provenance),
        )

    @property
    def rule_text(self) -> str:
        """The rule that asked, and why: `rule 'ask-writes' (system admin policy): writes go under out/`."""
        rule = f"rule '{self.rule_id}'" if self.rule_id is not None else "the default decision"
        if self.tier is not None:
            rule += f" ({self.tier} admin policy)"
        why = self.explanation or self.reason
        if self.explanation and self.reason and self.explanation not in self.reason:
            why = f"{self.explanation} ({self.reason})"
        return f"{rule}: {why}" if why else rule

    def text(self, max_code_lines: int = 12) -> str:
        """The ask as plain text, for an MCP client's elicitation message: the call, who asked, the rule,
        and the code around the call (at most `max_code_lines` lines)."""
        args = ", ".join(
            f"{name}={_short(value)}" + (f" {self.links[name].describe()}" if name in self.links else "")
            for name, value in self.args.items()
        )
        call = self.call_text if self.subject is not None else f"{self.call_text}({args})"
        lines = [f"ipybox: allow the tool call {call}?"]
        lines.extend(
            ("UNTRUSTED: " if is_untrusted(found) else "origin: ") + origin_text(path, found)
            for path, found in self.provenance.items()
        )
        if self.client is not None:
            lines.append(f"Asked by {self.client.title}: {self.client.history()}")
        lines.append(f"Asked because of {self.rule_text}")
        if self.cell is not None:
            shown = self.cell.lines(all_lines=False)[:max_code_lines]
            where = f"cell {self.cell.cell}" if self.cell.cell is not None else "the cell"
            lines.append(f"Code ({where}, {self.cell.source}):")
            lines.extend(f"{'>' if line.call else ' '} {line.number:>4} | {line.text}" for line in shown)
        return "\n".join(lines)

    @property
    def call_text(self) -> str:
        """`server.tool` (or the shell command for one of a shell line)."""
        return self.subject if self.subject is not None else f"{self.server}.{self.tool}"


def _short(value: Any, limit: int = 200) -> str:
    """`value` as `ApprovalRequest` shows it (its `repr`), folded past `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


class AnswerView(WireMessage):
    accept: StrictBool
    scope: Scope
    route: AskRoute
    by: str = ""

    @classmethod
    def of(cls, answer: AskAnswer) -> AnswerView:
        return cls(accept=answer.accept, scope=answer.scope, route=answer.route, by=answer.by)

    def describe(self) -> str:
        return AskAnswer(self.accept, self.scope, self.route, self.by).describe()


class AskOpenedMessage(WireMessage):
    type: Literal["opened"] = "opened"
    ask: AskView


class AskClosedMessage(WireMessage):
    """`answer` is `None` when the ask was withdrawn (`why`: timed out, the calling code went away)."""

    type: Literal["closed"] = "closed"
    id: str
    answer: AnswerView | None = None
    why: str = ""


class AnswerResult(WireMessage):
    """The server's reply to an approver's `answer`: `ok`, or why not (already answered, the `always`
    rule would not load, ...)."""

    type: Literal["answered"] = "answered"
    id: str
    ok: bool
    error: str | None = None
    settled: int = 0
    """How many asks the answer settled, this one included: 1, or for an answer `for this session` also
    the session's other pending asks of the same tool (answered alike at once); 0 when not `ok`."""
    accept: bool | None = None
    """The answer given, when `ok`."""


class AnswerMessage(WireMessage):
    """An approver's answer to the pending ask `id`."""

    type: Literal["answer"] = "answer"
    id: str
    accept: StrictBool
    scope: Scope = "once"
    choices: dict[str, str] | None = None
    """For `always`: what the rule requires of each argument (`AskAnswer.choices`)."""


class AskQuestion(WireMessage):
    """A question for the workspace's people (and, with `elicitation`, the asker's MCP client first if
    `[approval] ask` says so); see the module docstring."""

    type: Literal["question"] = "question"
    server: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    annotations: dict[str, Any] = Field(default_factory=dict)
    rule_id: str | None = None
    reason: str = ""
    elicitation: StrictBool = False


ServerMessage = Annotated[AskOpenedMessage | AskClosedMessage | AnswerResult, Field(discriminator="type")]
_SERVER_MESSAGE: TypeAdapter[AskOpenedMessage | AskClosedMessage | AnswerResult] = TypeAdapter(ServerMessage)


def parse_server_message(frame: str | bytes) -> AskOpenedMessage | AskClosedMessage | AnswerResult:
    """Parse a frame from the server.

    Raises:
        pydantic.ValidationError: Not one of the server's messages.
    """
    return _SERVER_MESSAGE.validate_json(frame)


def settled_text(accept: bool, settled: int) -> str:
    """What an answer "for this session" did: `Allowed for this session: settled 3 waiting calls`."""
    verb = "Allowed" if accept else "Denied"
    return f"{verb} for this session: settled {settled} waiting call{'' if settled == 1 else 's'}"


def message_of(event: AskOpened | AskClosed) -> AskOpenedMessage | AskClosedMessage:
    """The message telling approvers about a board event."""
    if isinstance(event, AskOpened):
        return AskOpenedMessage(ask=AskView.of(event.ask))
    answer = AnswerView.of(event.answer) if event.answer is not None else None
    return AskClosedMessage(id=event.ask.id, answer=answer, why=event.why)
