"""Every tool call on an `MCPConnection` is bounded and answered: `call_timeout`, `max_result_size`, lone
surrogates and invalid UTF-8 in answers, lone surrogates in arguments; and the connection stays up after
each, for the other calls. Against our edge server, over stdio, streamable HTTP and SSE."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from ipybox.mcp_client import (
    CallTimeoutError,
    MCPConnection,
    ResultTooLargeError,
    ServerTimeoutError,
    ToolCallError,
)
from tests.servers import params
from tests.servers.processes import pids, tagged

pytestmark = pytest.mark.integration

TAG = "connection-limits"
LIMITS = {"call_timeout": 1.5, "max_result_size": "256KiB"}
# Guards against a hang, far above what each call takes when it works (a timed-out call: 1.5 s).
GUARD = 30


@pytest.fixture(scope="module")
def edge_http_sse_responses_url() -> Iterator[str]:
    with params.edge_http_server("streamable-http", "--sse-responses") as url:
        yield url


@pytest.fixture(scope="module", params=["stdio", "streamable_http", "streamable_http_sse", "sse"])
async def limited(request: pytest.FixtureRequest) -> AsyncIterator[MCPConnection]:
    """A connection whose server parameters set `call_timeout` and `max_result_size`."""
    if request.param == "stdio":
        server_params: dict[str, Any] = tagged(params.edge(), f"{TAG}-stdio")
    elif request.param == "streamable_http":
        server_params = {"url": request.getfixturevalue("edge_http_url")}
    elif request.param == "streamable_http_sse":  # answers as SSE streams, as most such servers do
        server_params = {"url": request.getfixturevalue("edge_http_sse_responses_url")}
    else:
        server_params = {"url": request.getfixturevalue("edge_sse_url")}
    async with MCPConnection(
        f"edge_{request.param}", {**server_params, **LIMITS}, connect_timeout=20, call_timeout=600
    ) as connection:
        yield connection


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def still_serves(connection: MCPConnection) -> None:
    async with asyncio.timeout(GUARD):
        assert text_of(await connection.call_tool("echo", {"text": "still here"})) == "still here"


async def test_a_call_without_an_answer_fails_after_the_servers_call_timeout_and_is_cancelled_there(
    limited: MCPConnection, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled"
    async with asyncio.timeout(GUARD):
        with pytest.raises(CallTimeoutError) as raised:
            await limited.call_tool("hang", {"cancelled_marker": str(marker)})
    name = limited.server_name
    assert raised.value.timeout == 1.5  # the server's own, not the connection's 600 s
    assert f"{name}.hang did not answer within 1.5 s" in str(raised.value)
    assert f"[servers.{name}] call_timeout" in str(raised.value)
    async with asyncio.timeout(GUARD):  # notifications/cancelled reached the tool
        while not marker.exists():
            await asyncio.sleep(0.05)
    await still_serves(limited)


async def test_an_explicit_timeout_wins_over_call_timeout(limited: MCPConnection) -> None:
    async with asyncio.timeout(GUARD):
        result = await limited.call_tool("slow", {"seconds": 2}, timeout=20)
    assert text_of(result) == "slept 2.0"


async def test_an_answer_over_max_result_size_fails_and_the_connection_stays_up(
    limited: MCPConnection,
) -> None:
    # Half a MiB: the SSE transport's client refuses events over 1 MiB whatever the limit (and drops the
    # connection), which is the SDK's; streamable HTTP's is raised to max_result_size.
    async with asyncio.timeout(GUARD):
        with pytest.raises(ResultTooLargeError) as raised:
            await limited.call_tool("big_text", {"megabytes": 0.5})
    assert raised.value.limit == 256 * 1024
    assert raised.value.size is None or raised.value.size >= 512 * 1024  # unknown when not read to the end
    assert "more than its max_result_size of 256 KiB" in str(raised.value)
    await still_serves(limited)
    async with asyncio.timeout(GUARD):  # under the limit: whole
        assert text_of(await limited.call_tool("big_text", {"megabytes": 0.2})) == "x" * int(
            0.2 * 1024 * 1024
        )


@pytest.mark.parametrize("tool", ["lone_surrogate", "invalid_utf8"])
async def test_an_answer_that_is_not_valid_unicode_is_answered(limited: MCPConnection, tool: str) -> None:
    async with asyncio.timeout(GUARD):
        try:
            result = await limited.call_tool(tool, {})
        except ToolCallError as e:
            # The SDK's streamable HTTP client answers a response it can't parse with an error itself.
            assert limited.server_name.startswith("edge_streamable_http") and "parse" in str(e)
        else:
            assert text_of(result) == "before \ufffd after"
    await still_serves(limited)


async def test_arguments_with_a_lone_surrogate_are_refused_before_anything_is_sent(
    limited: MCPConnection,
) -> None:
    before = pids(f"{TAG}-stdio")
    async with asyncio.timeout(GUARD):
        with pytest.raises(ToolCallError, match=r"argument items\[1\].text holds a lone surrogate"):
            await limited.call_tool("echo_args", {"items": ["fine", {"text": "bad \ud800"}]})
    await still_serves(limited)
    assert pids(f"{TAG}-stdio") == before  # a stdio server was not restarted


async def test_answers_over_the_sdks_default_sse_event_size_arrive_over_streamable_http(
    edge_http_sse_responses_url: str,
) -> None:
    connection = MCPConnection("edge", {"url": edge_http_sse_responses_url}, connect_timeout=20)
    async with connection, asyncio.timeout(GUARD):
        result = await connection.call_tool("big_text", {"megabytes": 3})
        assert text_of(result) == "x" * (3 << 20)


async def test_a_50_mb_answer_arrives_whole_over_stdio() -> None:
    # mcp's own stdio client re-copied the pending line on every 64 KiB read: 20 MB took 6 s, 50 MB ~40 s.
    async with MCPConnection("edge", params.edge(), connect_timeout=20) as connection, asyncio.timeout(GUARD):
        result = await connection.call_tool("big_text", {"megabytes": 25, "char": "é"})  # 50 MiB of UTF-8
        assert text_of(result) == "é" * (25 << 20)


async def test_a_server_that_never_lists_its_tools_fails_after_call_timeout() -> None:
    server_params = {**params.edge(), "env": {"EDGE_NEVER_LIST": "1"}, "call_timeout": 1}
    async with MCPConnection("mute", server_params, connect_timeout=20) as connection, asyncio.timeout(GUARD):
        with pytest.raises(ServerTimeoutError, match="'mute': did not list its tools within 1 s"):
            await connection.list_tools()
