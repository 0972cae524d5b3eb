"""The approval wire format: JSON-RPC 2.0 text frames between an approval channel (server) and an
`ApprovalClient`, one message per frame, each parsed into a model below on arrival.

Server to client, one per tool call waiting for a decision (`ApprovalAsk`):

```json
{"jsonrpc": "2.0", "id": 7, "method": "approve",
 "params": {"server_name": "fs", "tool_name": "write_file", "tool_args": {"path": "a"},
            "annotations": {"destructiveHint": true}}}
```

Client to server, the decision on request `id` (`ApprovalAnswer`), `accept` a JSON boolean:

```json
{"jsonrpc": "2.0", "id": 7, "result": {"accept": true}}
```

An application that does not answer a request itself (`CodeExecutor.execute()` attached to a workspace)
declines it, saying why; a workspace then leaves the question to the people `[approval] ask` lists, or
denies it when none is there. A server that does not know `declined` reads a refusal:

```json
{"jsonrpc": "2.0", "id": 7, "result": {"accept": false, "declined": "execute() answers no asks"}}
```

While a workspace asks someone else about a call of the client's kernel (a person at the console or in
`ipybox approve`), the client is told so that it stops its execution's clock (`AskNotice`, a JSON-RPC
notification: no `id` of its own), and told again when the question is settled. The same `withdrawn` notice
takes back an `approve` request that was answered elsewhere first (its `id` is the request's):

```json
{"jsonrpc": "2.0", "method": "waiting", "params": {"id": 8}}
{"jsonrpc": "2.0", "method": "withdrawn", "params": {"id": 8, "accept": false, "by": "console (root)"}}
```

A client that answers nothing itself (`answers=none`: an MCP session whose client can't elicit) is told
of each call of its kernel that nobody could be asked about (`refused`, with the call and the reason), so
it can say so next to the cell's output.

Either way, a message that can't be used is answered with a JSON-RPC error (`ApprovalError`), its `id`
that of the message when one could be read, else `null`:

```json
{"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "params.tool_name: Field required"}}
```

Every message is a [WireMessage][ipybox.approval.message.WireMessage], as the approvers' protocol's are
([ask_events][ipybox.approval.ask_events]). Contracts: a malformed message never crashes the receiving end
and never approves anything: the
server takes a malformed answer (or an error) for a pending call as a refusal of that call, and a client
answers a malformed request with an error, which the server takes as a refusal too. Fields a receiver
does not know are ignored, so either end can add some; the types of known fields are strict (`accept`
must be `true` or `false`, not `1` or `"yes"`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from ipybox.approval.links import PathLink
from ipybox.approval.message import WireMessage
from ipybox.errors import ApprovalFailedError
from ipybox.rules.calls import ToolCall, origins_of, provenance_json

__all__ = [
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "PARSE_ERROR",
    "ApprovalAnswer",
    "ApprovalAsk",
    "ApprovalError",
    "ApprovalMessageError",
    "AskNotice",
    "CallParams",
    "Decision",
    "ErrorDetail",
    "parse_ask",
    "parse_reply",
    "parse_server_frame",
]

PARSE_ERROR: Final = -32700
"""JSON-RPC: the frame is not a JSON object."""
INVALID_REQUEST: Final = -32600
"""JSON-RPC: a JSON object, but not a message of this protocol."""
INVALID_PARAMS: Final = -32602
"""JSON-RPC: an `approve` request whose `params` are not a tool call."""


class ApprovalMessageError(ApprovalFailedError, ValueError):
    """A frame on the approval websocket is not a valid message; the text says what was wrong with it.

    Attributes:
        message_id: The `id` of the offending message, if it had a usable one (so the receiver can
            answer it, or refuse the call it was about).
        code: The JSON-RPC error code for an `ApprovalError` answering it.
    """

    def __init__(self, text: str, *, message_id: int | None = None, code: int = INVALID_REQUEST) -> None:
        super().__init__(text)
        self.message_id = message_id
        self.code = code


class CallParams(WireMessage):
    """A tool call as the application sees it (`ApprovalAsk.params`); the caller is not sent. `links`: the
    path arguments that lead elsewhere through a link, resolved by the host
    ([links][ipybox.approval.links]).

    Its fields are ipybox's one vocabulary of a call (`server`, `tool`, `args`, as
    [ToolCall][ipybox.rules.calls.ToolCall]); on the wire they are `server_name`, `tool_name` and
    `tool_args`, as ipybox 0.9.2 sent them (a frame using the field names is read too).
    """

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    server: StrictStr = Field(validation_alias="server_name", serialization_alias="server_name")
    tool: StrictStr = Field(validation_alias="tool_name", serialization_alias="tool_name")
    args: dict[str, Any] = Field(validation_alias="tool_args", serialization_alias="tool_args")
    annotations: dict[str, Any] = Field(default_factory=dict)
    links: dict[str, PathLink] = Field(default_factory=dict)
    provenance: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    """Optional: where argument values came from, by argument path (`ToolCall.provenance` as JSON: per
    origin `server`, `tool`, `serial`, `label`, `time`); empty when no value matched."""

    @classmethod
    def of(cls, call: ToolCall, links: Mapping[str, PathLink] | None = None) -> CallParams:
        return cls(
            server=call.server,
            tool=call.tool,
            args=dict(call.args),
            annotations=dict(call.annotations),
            links=dict(links or {}),
            provenance=provenance_json(call.provenance),
        )

    def to_call(self) -> ToolCall:
        return ToolCall(
            self.server, self.tool, self.args, self.annotations, provenance=origins_of(self.provenance)
        )


class ApprovalAsk(WireMessage):
    """Server to client: decide on this call, and answer with its `id`."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: StrictInt
    method: Literal["approve"] = "approve"
    params: CallParams


class NoticeParams(WireMessage):
    """`id`: the question (an `approve` request's id, or a `waiting` notice's); `accept` and `by`: how it was
    settled (`withdrawn` only; `accept` is `None` when nobody answered: the time ran out); `call` and
    `reason`: a call nobody could be asked about (`refused` only)."""

    id: StrictInt
    accept: StrictBool | None = None
    by: StrictStr = ""
    call: CallParams | None = None
    reason: StrictStr = ""


class AskNotice(WireMessage):
    """Server to client: someone else is being asked about a call of this client's kernel (`waiting`), or a
    question was settled elsewhere (`withdrawn`)."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["waiting", "withdrawn", "refused"]
    params: NoticeParams


class Decision(WireMessage):
    """The client's decision: `accept` is `True` to let the call run. `declined` (with `accept` false): the
    client does not answer this call itself, and why; someone else may (see the module)."""

    accept: StrictBool
    declined: StrictStr | None = None


class ApprovalAnswer(WireMessage):
    """Client to server: the decision on the request `id`."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: StrictInt
    result: Decision


class ErrorDetail(WireMessage):
    """A JSON-RPC error: one of the codes above, and what was wrong."""

    code: StrictInt
    message: StrictStr


class ApprovalError(WireMessage):
    """Either way: the message `id` (`None` if it had no usable one) could not be used."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: StrictInt | None
    error: ErrorDetail

    @classmethod
    def of(cls, error: ApprovalMessageError) -> ApprovalError:
        return cls(id=error.message_id, error=ErrorDetail(code=error.code, message=str(error)))


def parse_ask(frame: str | bytes) -> ApprovalAsk:
    """Parse a frame the server sent.

    Raises:
        ApprovalMessageError: It is not an `approve` request with a tool call in its `params`.
    """
    data = _object(frame, "approval request")
    message_id = _id_of(data)
    if data.get("method") != "approve":
        raise ApprovalMessageError(
            f"not an approval request: expected method 'approve', got {data.get('method')!r}",
            message_id=message_id,
        )
    try:
        return ApprovalAsk.model_validate(data)
    except ValidationError as e:
        code = INVALID_PARAMS if message_id is not None else INVALID_REQUEST
        raise ApprovalMessageError(
            f"malformed approval request: {_explain(e)}", message_id=message_id, code=code
        ) from None


def parse_server_frame(frame: str | bytes) -> ApprovalAsk | AskNotice:
    """Parse any frame the server sends: an `approve` request or a notice.

    Raises:
        ApprovalMessageError: It is neither.
    """
    data = _object(frame, "approval request")
    if data.get("method") in ("waiting", "withdrawn", "refused") and "id" not in data:
        try:
            return AskNotice.model_validate(data)
        except ValidationError as e:
            raise ApprovalMessageError(f"malformed approval notice: {_explain(e)}") from None
    return parse_ask(frame)


def parse_reply(frame: str | bytes) -> ApprovalAnswer | ApprovalError:
    """Parse a frame the client sent: a decision, or an error about a request it could not use.

    Raises:
        ApprovalMessageError: It is neither, e.g. `{"id": 7, "result": {"accept": "yes"}}`.
    """
    data = _object(frame, "approval answer")
    kind: type[ApprovalAnswer | ApprovalError] = ApprovalError if "error" in data else ApprovalAnswer
    try:
        return kind.model_validate(data)
    except ValidationError as e:
        raise ApprovalMessageError(
            f"malformed approval answer: {_explain(e)}", message_id=_id_of(data)
        ) from None


def _object(frame: str | bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(frame)
    except ValueError:
        raise ApprovalMessageError(
            f"an {what} must be a JSON object; got non-JSON text", code=PARSE_ERROR
        ) from None
    if not isinstance(data, dict):
        raise ApprovalMessageError(
            f"an {what} must be a JSON object; got {type(data).__name__}", code=PARSE_ERROR
        )
    return data


def _id_of(data: dict[str, Any]) -> int | None:
    # A bool is an int in Python, never an id on the wire.
    value = data.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _explain(error: ValidationError) -> str:
    """`field.path: what is wrong` for each problem, e.g. `result.accept: Input should be a valid boolean`."""
    parts = []
    for problem in error.errors(include_url=False):
        where = ".".join(str(part) for part in problem["loc"]) or "message"
        parts.append(f"{where}: {problem['msg']}")
    return "; ".join(parts)
