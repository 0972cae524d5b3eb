"""A kernel's tool call through a real `ToolServer` always gets an answer, in bounded time and size: a server
that never answers (`call_timeout`), an answer over `max_result_size`, answers that are not valid Unicode,
arguments that are not, and large answers. The shared server keeps serving other calls after each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params
from tests.servers.processes import pids, tagged

pytestmark = pytest.mark.integration

TAG = "call-limits"
# Guards against a hang, far above what each call takes when it works (a timed-out call: 1.5 s).
GUARD = 30


@pytest.fixture(scope="module")
async def tool_server() -> AsyncIterator[ToolServer]:
    limited = {**tagged(params.edge(), TAG), "call_timeout": 1.5, "max_result_size": "1MiB"}
    servers = {"edge": limited, "roomy": params.edge()}  # roomy: the defaults (300 s, 64 MiB)
    async with ToolServer(servers=servers) as server:
        yield server


async def run(server: ToolServer, tool: str, args: dict[str, Any], name: str = "edge") -> Any:
    runner = ToolRunner(name, address=server.calls_address, token=server.call_token)
    async with asyncio.timeout(GUARD):
        return await asyncio.to_thread(runner.run_sync, tool, args)


async def answer_of(server: ToolServer, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """The call channel's answer line itself, to see the error's type."""
    reader, writer = await asyncio.open_unix_connection(server.calls_address.removeprefix("unix:"))
    request = {"token": server.call_token, "op": "run", "server": "edge", "tool": tool, "args": args}
    writer.write(json.dumps(request).encode() + b"\n")
    try:
        async with asyncio.timeout(GUARD):
            answer: dict[str, Any] = json.loads(await reader.readline())
            return answer
    finally:
        writer.close()


async def still_serves(server: ToolServer, server_pids: list[int]) -> None:
    assert await run(server, "echo", {"text": "next"}) == "next"
    assert pids(TAG) == server_pids  # the same process: not restarted


async def test_a_call_without_an_answer_fails_with_call_timeout_and_the_server_keeps_serving(
    tool_server: ToolServer, tmp_path: Path
) -> None:
    await run(tool_server, "echo", {"text": "started"})
    server_pids = pids(TAG)
    marker = tmp_path / "cancelled"
    with pytest.raises(ToolRunnerError) as raised:
        await run(tool_server, "hang", {"cancelled_marker": str(marker)})
    assert "edge.hang did not answer within 1.5 s" in str(raised.value)
    assert "[servers.edge] call_timeout" in str(raised.value)
    answer = await answer_of(tool_server, "hang", {})
    assert answer["error"]["type"] == "call_timeout"
    async with asyncio.timeout(GUARD):  # the server was told to cancel it
        while not marker.exists():
            await asyncio.sleep(0.05)
    await still_serves(tool_server, server_pids)


async def test_an_answer_over_max_result_size_fails_with_result_too_large_and_the_server_keeps_serving(
    tool_server: ToolServer,
) -> None:
    await run(tool_server, "echo", {"text": "started"})
    server_pids = pids(TAG)
    with pytest.raises(ToolRunnerError) as raised:
        await run(tool_server, "big_text", {"megabytes": 3})
    assert "edge.big_text answered with 3.0 MiB, more than its max_result_size of 1.0 MiB" in str(
        raised.value
    )
    assert "[servers.edge] max_result_size" in str(raised.value)
    assert (await answer_of(tool_server, "big_text", {"megabytes": 2}))["error"]["type"] == "result_too_large"
    await still_serves(tool_server, server_pids)


@pytest.mark.parametrize("tool", ["lone_surrogate", "invalid_utf8"])
async def test_an_answer_that_is_not_valid_unicode_is_answered(tool_server: ToolServer, tool: str) -> None:
    assert await run(tool_server, tool, {}) == "before \ufffd after"


async def test_arguments_with_a_lone_surrogate_are_refused_and_the_server_keeps_serving(
    tool_server: ToolServer,
) -> None:
    # The kernel sends it as the escape "\ud800" (json.dumps is ASCII), which the host reads back into a
    # lone surrogate: no transport can send that on (mcp's stdio writer failed, and the server restarted).
    await run(tool_server, "echo", {"text": "started"})
    server_pids = pids(TAG)
    with pytest.raises(ToolRunnerError, match="argument text holds a lone surrogate"):
        await run(tool_server, "echo", {"text": "bad \ud800"})
    await still_serves(tool_server, server_pids)


async def test_a_50_mb_answer_reaches_the_kernel_whole(tool_server: ToolServer) -> None:
    # It took 64 s before (mcp's stdio reader re-copied the pending line on every 64 KiB read).
    value = await run(tool_server, "big_text", {"megabytes": 50}, name="roomy")
    assert isinstance(value, str) and len(value) == 50 << 20 and value.strip("x") == ""


async def test_a_call_whose_kernel_goes_away_is_cancelled_and_the_server_told(
    tool_server: ToolServer, tmp_path: Path
) -> None:
    # As when a cell is interrupted during a call: the kernel closes its connection, and the call must
    # not hold the server until call_timeout.
    roomy = {"token": tool_server.call_token, "op": "run", "server": "roomy", "tool": "hang"}
    marker = tmp_path / "cancelled"
    _reader, writer = await asyncio.open_unix_connection(tool_server.calls_address.removeprefix("unix:"))
    writer.write(json.dumps({**roomy, "args": {"cancelled_marker": str(marker)}}).encode() + b"\n")
    await writer.drain()
    await asyncio.sleep(1.5)  # past the moment the channel starts watching a running call
    writer.close()
    async with asyncio.timeout(GUARD):  # far below roomy's call_timeout (300 s)
        while not marker.exists():
            await asyncio.sleep(0.05)
    assert await run(tool_server, "echo", {"text": "next"}, name="roomy") == "next"
