"""How the stdio transport reads a server's stdout: whole lines in linear time, a bounded size, and an
answer for every line that answers a request (no process here: `_Lines` and `parse_message` alone)."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage

from ipybox.mcp_client.stdio_transport import MESSAGE_TOO_LARGE, _Lines, parse_message


def response(request_id: int | str, text: str) -> dict[str, Any]:
    content = [{"type": "text", "text": text}]
    return {"jsonrpc": "2.0", "id": request_id, "result": {"content": content}}


def feed_in_chunks(lines: _Lines, data: bytes, size: int) -> list[SessionMessage | Exception]:
    items: list[SessionMessage | Exception] = []
    for start in range(0, len(data), size):
        items.extend(lines.feed(data[start : start + size]))
    return items


def text_of(item: SessionMessage | Exception) -> str:
    assert isinstance(item, SessionMessage), item
    message = item.message
    assert isinstance(message, types.JSONRPCResponse), message
    result = types.CallToolResult.model_validate(message.result)
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def error_of(item: SessionMessage | Exception) -> tuple[int | str, types.ErrorData]:
    assert isinstance(item, SessionMessage), item
    message = item.message
    assert isinstance(message, types.JSONRPCError), message
    return message.id, message.error


def test_messages_split_across_reads_arrive_whole_and_in_order() -> None:
    data = b"".join(json.dumps(response(i, "é" * i + "\n")).encode() + b"\n" for i in range(50))
    items = feed_in_chunks(_Lines(1 << 20), b"\n" + data + b"  \n", 7)
    assert [text_of(item) for item in items] == ["é" * i + "\n" for i in range(50)]


def test_a_large_message_read_in_small_chunks_is_held_once_not_per_read() -> None:
    text = "x" * (8 << 20)
    data = json.dumps(response(1, text)).encode() + b"\n"
    lines = _Lines(16 << 20)
    items = feed_in_chunks(lines, data[:-1], 64 * 1024)
    # Until its newline, one growing buffer holds the line (the SDK's reader re-copied it on every read).
    assert items == [] and len(lines._pending) == len(data) - 1
    [item] = lines.feed(b"\n")
    assert text_of(item) == text and len(lines._pending) == 0


def test_a_message_over_the_limit_answers_its_request_with_an_error_and_is_not_held() -> None:
    limit = 256 * 1024
    lines = _Lines(limit)
    big = json.dumps(response(7, "y" * (3 * limit))).encode() + b"\n"
    items = feed_in_chunks(lines, big[:-1], 64 * 1024)
    assert items == [] and len(lines._pending) == 0  # read past: nothing of it is kept
    items = lines.feed(b"\n" + json.dumps(response(8, "next")).encode() + b"\n")
    request_id, error = error_of(items[0])
    assert request_id == 7 and error.data == {
        "ipybox": MESSAGE_TOO_LARGE,
        "size": len(big) - 1,
        "limit": limit,
    }
    assert text_of(items[1]) == "next"  # the stream is in step again


def test_the_request_of_a_message_over_the_limit_is_found_at_its_end_too() -> None:
    # The TypeScript SDK writes the id last: {"result":...,"jsonrpc":"2.0","id":"req-3"}.
    result = {"content": [{"type": "text", "text": 'z"id":1}' * 50_000}]}
    line = json.dumps({"result": result, "jsonrpc": "2.0", "id": "req-3"}).encode() + b"\n"
    [item] = _Lines(64 * 1024).feed(line)
    assert error_of(item)[0] == "req-3"


def test_a_request_of_the_servers_own_over_the_limit_is_not_taken_for_an_answer() -> None:
    # Its id is in the server's id space: an error response with it could fail an unrelated call.
    request = {"jsonrpc": "2.0", "id": 1, "method": "sampling/createMessage", "params": {"x": "w" * 100_000}}
    [item] = _Lines(64 * 1024).feed(json.dumps(request).encode() + b"\n")
    assert isinstance(item, Exception)


@pytest.mark.parametrize("padding", [0, 2 << 20], ids=["small", "large"])  # the two parsers
def test_lone_surrogates_and_invalid_utf8_become_replacement_characters(padding: int) -> None:
    pad = b"p" * padding
    line = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"%sa\\ud800b\\udfffc\\ud83d\\ude00"}]}}'
    assert text_of(parse_message(line % pad)) == "p" * padding + "a\ufffdb\ufffdc\U0001f600"
    line = b'{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"%sa\xffb\xc3\xa9"}]}}'
    assert text_of(parse_message(line % pad)) == "p" * padding + "a\ufffdb\u00e9"


def test_an_answer_that_is_not_json_rpc_answers_its_request_with_an_error() -> None:
    request_id, error = error_of(parse_message(b'{"jsonrpc":"2.0","id":4,"result":{"content":[{"type": 1'))
    assert (
        request_id == 4
        and error.code == types.PARSE_ERROR
        and "not a valid JSON-RPC message" in error.message
    )


def test_a_line_that_answers_no_request_is_an_exception_for_the_session() -> None:
    assert isinstance(parse_message(b"Server started on stdio"), Exception)
