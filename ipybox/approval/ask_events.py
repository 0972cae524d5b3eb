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

from ipybox.approval.asks import AskAnswer, AskClosed, AskOpened, PendingAsk, Scope
from ipybox.approval.links import PathLink
from ipybox.approval.message import WireMessage
from ipybox.rules.calls import AskRoute, provenance_json

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
]


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


class AskView(WireMessage):
    """A pending ask as an approver shows it (see `PendingAsk`)."""

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
    provenance: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    """Where argument values came from, by argument path (`ToolCall.provenance` as JSON: `server`,
    `tool`, `serial`, `label`, `time` per origin); empty when none matched."""

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
            provenance=provenance_json(ask.call.provenance),
        )

    @property
    def call_text(self) -> str:
        """`server.tool` (or the shell command for one of a shell line)."""
        return self.subject if self.subject is not None else f"{self.server}.{self.tool}"


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


class AnswerMessage(WireMessage):
    """An approver's answer to the pending ask `id`."""

    type: Literal["answer"] = "answer"
    id: str
    accept: StrictBool
    scope: Scope = "once"


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


def message_of(event: AskOpened | AskClosed) -> AskOpenedMessage | AskClosedMessage:
    """The message telling approvers about a board event."""
    if isinstance(event, AskOpened):
        return AskOpenedMessage(ask=AskView.of(event.ask))
    answer = AnswerView.of(event.answer) if event.answer is not None else None
    return AskClosedMessage(id=event.ask.id, answer=answer, why=event.why)
