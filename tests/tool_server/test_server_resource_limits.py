"""A stdio server over its memory limit, behind a real `ToolServer`: the kernel's call fails with a
`server_memory_limit` error naming the limit and the peak, nothing of the server is left, the tool server
keeps serving the other servers, `stopped` says why the server is not running, and the next call starts it
again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
from ipybox.limits import detect_enforcement
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params
from tests.servers.processes import pids, tagged
from tests.tool_server.test_call_limits import answer_of

pytestmark = pytest.mark.integration

TAG = "server-resource-limits"
GUARD = 60  # against a hang, far above what a start and a call take (about 1 s)


@pytest.fixture(scope="module")
async def tool_server() -> AsyncIterator[ToolServer]:
    if detect_enforcement().cgroup is None:
        pytest.skip("a memory limit that kills needs control groups (see `ipybox doctor`)")
    servers = {
        "edge": {**tagged(params.edge(), TAG), "limits": {"memory": "64MiB"}},
        "other": tagged(params.edge(), f"{TAG}-other"),
    }
    async with ToolServer(servers=servers) as server:
        yield server


async def run(server: ToolServer, name: str, tool: str, args: dict[str, Any]) -> Any:
    runner = ToolRunner(name, address=server.calls_address, token=server.call_token)
    async with asyncio.timeout(GUARD):
        return await asyncio.to_thread(runner.run_sync, tool, args)


async def test_a_server_over_its_memory_limit_fails_the_call_and_the_tool_server_serves_the_others(
    tool_server: ToolServer,
) -> None:
    assert await run(tool_server, "other", "echo", {"text": "before"}) == "before"
    other_pids = pids(f"{TAG}-other")
    assert await run(tool_server, "edge", "allocate", {"megabytes": 4}) == "allocated 4 MiB"
    assert pids(TAG) != []
    with pytest.raises(ToolRunnerError) as raised:
        await run(tool_server, "edge", "allocate", {"megabytes": 200})
    assert "MCP server 'edge' went over its memory limit (limit 64 MiB, peak 64 MiB) and was stopped" in str(
        raised.value
    )
    assert pids(TAG) == []  # nothing of it is left
    stopped = tool_server.servers.stopped("edge")
    assert stopped is not None and stopped.startswith("MCP server 'edge' went over its memory limit")
    assert tool_server.servers.stopped("other") is None
    # The tool server and the other server never noticed.
    assert await run(tool_server, "other", "echo", {"text": "after"}) == "after"
    assert pids(f"{TAG}-other") == other_pids
    # The next call starts it again.
    assert await run(tool_server, "edge", "echo", {"text": "again"}) == "again"
    assert tool_server.servers.stopped("edge") is None


async def test_the_kernel_can_tell_a_memory_kill_by_its_error_type(tool_server: ToolServer) -> None:
    answer = await answer_of(tool_server, "allocate", {"megabytes": 200})
    assert answer["error"]["type"] == "server_memory_limit"
    assert "went over its memory limit (limit 64 MiB" in answer["error"]["message"]
    assert await run(tool_server, "edge", "echo", {"text": "again"}) == "again"
