"""The approval wire format: what each end sends parses back to the same message, and any other frame is
refused with an error that says what was wrong, never a crash."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipybox.approval.ask_events import AskOpenedMessage
from ipybox.approval.message import WireMessage
from ipybox.approval.wire import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    ApprovalAnswer,
    ApprovalAsk,
    ApprovalError,
    ApprovalMessageError,
    AskNotice,
    CallParams,
    Decision,
    ErrorDetail,
    NoticeParams,
    parse_ask,
    parse_reply,
    parse_server_frame,
)
from ipybox.rules import ToolCall

CALL = ToolCall("fs", "write_file", {"path": "out/a.md", "n": [1, {"x": None}]}, {"destructiveHint": True})


def test_an_ask_round_trips_to_the_same_call_without_its_caller() -> None:
    call = ToolCall(CALL.server, CALL.tool, CALL.args, CALL.annotations, caller="kernel-7")
    frame = ApprovalAsk(id=7, params=CallParams.of(call)).to_json()
    assert "kernel-7" not in frame  # who called stays on the host
    ask = parse_ask(frame)
    assert ask.id == 7 and ask.params.to_call() == CALL


def test_answers_and_errors_round_trip() -> None:
    for message in (
        ApprovalAnswer(id=3, result=Decision(accept=True)),
        ApprovalAnswer(id=4, result=Decision(accept=False)),
        ApprovalError(
            id=5, error=ErrorDetail(code=INVALID_PARAMS, message="params.tool_name: Field required")
        ),
        ApprovalError(id=None, error=ErrorDetail(code=PARSE_ERROR, message="not JSON")),
    ):
        assert parse_reply(message.to_json()) == message


def test_the_frames_of_earlier_versions_still_parse() -> None:
    ask = parse_ask(
        '{"jsonrpc": "2.0", "id": 1, "method": "approve", "params": {"server_name": "s", "tool_name": "t", '
        '"tool_args": {"a": 1}, "annotations": {}}}'
    )
    assert ask.params.to_call() == ToolCall("s", "t", {"a": 1})
    assert parse_reply('{"jsonrpc": "2.0", "id": 1, "result": {"accept": true}}') == ApprovalAnswer(
        id=1, result=Decision(accept=True)
    )


def test_fields_a_receiver_does_not_know_are_ignored() -> None:
    ask = parse_ask(
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "approve",
                "params": {"server_name": "s", "tool_name": "t", "tool_args": {}, "risk": "high"},
                "meta": {},
            }
        )
    )
    assert ask.params.to_call() == ToolCall("s", "t")
    reply = parse_reply('{"id": 2, "result": {"accept": false, "note": "no"}, "x": 1}')
    assert reply == ApprovalAnswer(id=2, result=Decision(accept=False))


@pytest.mark.parametrize(
    ("frame", "says", "message_id", "code"),
    [
        ("not json", "non-JSON", None, PARSE_ERROR),
        ("[1, 2]", "must be a JSON object; got list", None, PARSE_ERROR),
        ('{"id": 1, "method": "ping"}', "expected method 'approve', got 'ping'", 1, INVALID_REQUEST),
        ('{"id": 1, "method": "approve"}', "params: Field required", 1, INVALID_PARAMS),
        (
            '{"id": 1, "method": "approve", "params": {"server_name": "s", "tool_args": {}}}',
            "params.tool_name: Field required",
            1,
            INVALID_PARAMS,
        ),
        (
            '{"id": 1, "method": "approve", "params": {"server_name": 5, "tool_name": "t", "tool_args": {}}}',
            "params.server_name: Input should be a valid string",
            1,
            INVALID_PARAMS,
        ),
        (
            '{"id": "1", "method": "approve", "params": {"server_name": "s", "tool_name": "t", "tool_args": {}}}',
            "id: Input should be a valid integer",
            None,
            INVALID_REQUEST,
        ),
        (
            '{"id": 1, "jsonrpc": "1.0", "method": "approve", '
            '"params": {"server_name": "s", "tool_name": "t", "tool_args": []}}',
            "jsonrpc: Input should be '2.0'; params.tool_args: Input should be a valid dictionary",
            1,
            INVALID_PARAMS,
        ),
    ],
)
def test_a_malformed_ask_is_refused_saying_what_is_wrong(
    frame: str, says: str, message_id: int | None, code: int
) -> None:
    with pytest.raises(ApprovalMessageError, match="approval request") as info:
        parse_ask(frame)
    assert says in str(info.value)
    assert (info.value.message_id, info.value.code) == (message_id, code)


@pytest.mark.parametrize(
    ("frame", "says", "message_id"),
    [
        ('{"id": 1, "result": {"accept": "yes"}}', "result.accept: Input should be a valid boolean", 1),
        ('{"id": 1, "result": {"accept": 1}}', "result.accept: Input should be a valid boolean", 1),
        ('{"id": 1, "result": {}}', "result.accept: Field required", 1),
        ('{"id": 1}', "result: Field required", 1),
        ('{"id": true, "result": {"accept": true}}', "id: Input should be a valid integer", None),
        ('{"id": 1, "error": {"code": -1}}', "error.message: Field required", 1),
        ('"accept"', "must be a JSON object; got str", None),
    ],
)
def test_a_malformed_answer_is_refused_saying_what_is_wrong(
    frame: str, says: str, message_id: int | None
) -> None:
    with pytest.raises(ApprovalMessageError, match="approval answer") as info:
        parse_reply(frame)
    assert says in str(info.value)
    assert info.value.message_id == message_id


def test_a_refusal_becomes_the_error_message_that_answers_it() -> None:
    with pytest.raises(ApprovalMessageError) as info:
        parse_ask('{"id": 9, "method": "approve", "params": {}}')
    error = ApprovalError.of(info.value)
    assert (error.id, error.error.code) == (9, INVALID_PARAMS)
    assert error.error.message.startswith("malformed approval request: params.server_name: Field required")
    assert parse_reply(error.to_json()) == error


JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
KEYS = st.sampled_from(["id", "jsonrpc", "method", "params", "result", "error", "accept", "server_name"])
MESSAGES = st.dictionaries(KEYS, JSON | st.fixed_dictionaries({}, optional={"accept": JSON}), max_size=5)


@given(st.one_of(JSON, MESSAGES).map(json.dumps) | st.binary(max_size=20))
def test_no_frame_makes_either_parser_fail_other_than_with_a_message_error(frame: str | bytes) -> None:
    for parse in (parse_ask, parse_reply):
        try:
            parse(frame)
        except ApprovalMessageError as e:
            assert str(e)


def test_notices_parse_from_any_server_frame_and_requests_still_do() -> None:
    waiting = parse_server_frame('{"jsonrpc": "2.0", "method": "waiting", "params": {"id": 8}}')
    assert isinstance(waiting, AskNotice) and (waiting.method, waiting.params.id) == ("waiting", 8)
    withdrawn = parse_server_frame(
        '{"jsonrpc": "2.0", "method": "withdrawn", "params": {"id": 8, "accept": false, "by": "console (root)"}}'
    )
    assert isinstance(withdrawn, AskNotice) and withdrawn.params.accept is False
    refused = AskNotice(
        method="refused",
        params=NoticeParams(
            id=9, call=CallParams.of(ToolCall("fs", "write_file", {"path": "a"})), reason="why"
        ),
    )
    back = parse_server_frame(refused.to_json())
    assert isinstance(back, AskNotice) and back.params.call is not None
    assert back.params.call.to_call() == ToolCall("fs", "write_file", {"path": "a"})
    ask = ApprovalAsk(id=7, params=CallParams.of(ToolCall("fs", "read_file")))
    assert parse_server_frame(ask.to_json()) == ask


def test_a_malformed_notice_is_a_message_error_not_a_crash() -> None:
    with pytest.raises(ApprovalMessageError, match=r"malformed approval notice: params\.accept"):
        parse_server_frame('{"jsonrpc": "2.0", "method": "withdrawn", "params": {"id": 8, "accept": "yes"}}')


def test_call_params_speak_the_one_call_vocabulary_and_send_the_0_9_2_names() -> None:
    params = CallParams.of(ToolCall("fs", "write_file", {"path": "a"}))
    assert (params.server, params.tool, params.args) == ("fs", "write_file", {"path": "a"})
    sent = json.loads(ApprovalAsk(id=1, params=params).to_json())["params"]
    assert (sent["server_name"], sent["tool_name"], sent["tool_args"]) == ("fs", "write_file", {"path": "a"})
    assert {"server", "tool", "args"}.isdisjoint(sent)
    assert parse_ask(json.dumps({"id": 1, "method": "approve", "params": sent})).params.to_call() == ToolCall(
        "fs", "write_file", {"path": "a"}
    )


def test_both_approval_protocols_share_one_message_base_and_send_any_argument() -> None:
    assert issubclass(ApprovalAsk, WireMessage) and issubclass(AskOpenedMessage, WireMessage)
    # A lone surrogate (a kernel's "\ud800") has no UTF-8 form: sent as its escape, as approvers show it.
    frame = ApprovalAsk(
        id=1, params=CallParams.of(ToolCall("fs", "write_file", {"path": "\ud800"}))
    ).to_json()
    assert parse_ask(frame).params.args == {"path": "\\ud800"}
