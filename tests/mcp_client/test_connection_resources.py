"""A stdio server's `limits` on an `MCPConnection`, against our edge server, sandboxed and not: a server over
its memory limit fails the call (or its start) with `ServerMemoryLimitError` naming the limit and the peak,
a process limit refuses its forks, a limit the machine can't enforce or a missing command fails the start
with one line, and nothing of a limited server outlives its connection: no process, no control group."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import mcp_types as types
import pytest

from ipybox.limits import detect_enforcement
from ipybox.mcp_client import MCPConnection, ServerMemoryLimitError, ServerStartError
from tests.servers import params
from tests.servers.processes import pids, pids_anywhere, tagged

pytestmark = pytest.mark.integration

TAG = "connection-resources"
GUARD = 60  # against a hang, far above what a start and a call take (about 1 s)
SANDBOX = {"unsandboxed": {}, "sandboxed": {"sandbox": True}}


@pytest.fixture(scope="module")
def cgroups() -> None:
    if detect_enforcement().cgroup is None:
        pytest.skip("memory and process limits that kill or refuse need control groups (see `ipybox doctor`)")


@pytest.fixture(params=list(SANDBOX))
def sandbox(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    yield SANDBOX[request.param]


def server(tag: str, limits: dict[str, Any], sandbox: dict[str, Any], *args: str) -> dict[str, Any]:
    return {**tagged(params.edge(*args), tag), **sandbox, "limits": limits}


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def group_dirs(connection: MCPConnection) -> list[str]:
    limited = connection._limited
    assert limited is not None and limited.group is not None and limited.limiter.parent is not None
    return [*limited.group.directories(), *limited.limiter.parent.directories()]


async def test_a_server_over_its_memory_limit_fails_the_call_naming_the_limit_and_leaves_nothing(
    cgroups: None, sandbox: dict[str, Any]
) -> None:
    tag = f"{TAG}-memory-{bool(sandbox)}"
    async with asyncio.timeout(GUARD):
        async with MCPConnection(
            "hungry", server(tag, {"memory": "64MiB"}, sandbox), connect_timeout=20
        ) as conn:
            assert text_of(await conn.call_tool("allocate", {"megabytes": 4})) == "allocated 4 MiB"
            dirs = group_dirs(conn)
            assert all(os.path.isdir(d) for d in dirs)
            with pytest.raises(ServerMemoryLimitError) as raised:
                await conn.call_tool("allocate", {"megabytes": 200})
            assert str(raised.value).startswith(
                "MCP server 'hungry' went over its memory limit (limit 64 MiB, peak 64 MiB) and was stopped"
            )
            assert "[servers.hungry.limits]" in str(raised.value) and "\n" not in str(raised.value)
            assert (raised.value.limit, raised.value.peak) == (64 * 1024**2, 64 * 1024**2)
            with pytest.raises(ServerMemoryLimitError):  # and so does the next call on this connection
                await conn.call_tool("echo", {"text": "still there?"})
    assert pids(tag) == []
    assert not any(os.path.exists(d) for d in dirs)


async def test_a_process_limit_refuses_the_servers_forks_and_the_server_keeps_serving(
    cgroups: None, sandbox: dict[str, Any]
) -> None:
    tag = f"{TAG}-processes-{bool(sandbox)}"
    async with asyncio.timeout(GUARD):
        async with MCPConnection(
            "forks", server(tag, {"processes": 16}, sandbox), connect_timeout=20
        ) as conn:
            answer = text_of(await conn.call_tool("spawn", {"count": 50}))
            started = int(answer.split()[1])
            assert 0 < started < 16
            assert answer.endswith("BlockingIOError: [Errno 11] Resource temporarily unavailable")
            assert text_of(await conn.call_tool("spawn", {"count": 3})) == "started 3 of 3"
            assert text_of(await conn.call_tool("echo", {"text": "alive"})) == "alive"
    assert pids(tag) == []


async def test_processes_a_limited_server_left_running_in_sessions_of_their_own_end_with_it(
    cgroups: None, sandbox: dict[str, Any]
) -> None:
    tag = f"{TAG}-daemons-{bool(sandbox)}"
    async with asyncio.timeout(GUARD):
        async with MCPConnection(
            "daemons", server(tag, {"processes": 64}, sandbox), connect_timeout=20
        ) as conn:
            answer = await conn.call_tool("spawn", {"count": 3, "leave_running": True})
            assert text_of(answer) == "started 3 of 3"
            assert len(pids_anywhere(tag)) >= 4  # the server and its three
    assert pids_anywhere(tag) == []


async def test_a_sandboxed_servers_private_tmp_is_as_large_as_its_tmp_limit() -> None:
    tag = f"{TAG}-tmp"
    async with asyncio.timeout(GUARD):
        async with MCPConnection(
            "tmp", server(tag, {"tmp": "8MiB"}, {"sandbox": True}), connect_timeout=20
        ) as conn:
            assert text_of(await conn.call_tool("fill_tmp", {"megabytes": 4})) == "wrote 4 MiB"
            full = text_of(await conn.call_tool("fill_tmp", {"megabytes": 16}))
            assert full == "OSError: [Errno 28] No space left on device"
            assert text_of(await conn.call_tool("echo", {"text": "alive"})) == "alive"
    assert pids(tag) == []


async def test_a_server_killed_for_its_memory_while_starting_fails_its_start_naming_the_limit(
    cgroups: None,
) -> None:
    tag = f"{TAG}-start"
    connection = MCPConnection("tiny", server(tag, {"memory": "8MiB"}, {}), connect_timeout=20)
    async with asyncio.timeout(GUARD):
        with pytest.raises(ServerMemoryLimitError) as raised:
            await connection.start()
    assert str(raised.value).startswith(
        "MCP server 'tiny' went over its memory limit (limit 8 MiB, peak 8 MiB)"
    )
    assert pids(tag) == []


async def test_a_limit_this_machine_cannot_enforce_fails_the_start_naming_it() -> None:
    tag = f"{TAG}-unenforceable"
    # setrlimit caps no CPU, on any machine: nothing may start without the cap it was given.
    limits = {"cpus": 0.5, "enforce": "rlimit"}
    with pytest.raises(ServerStartError) as raised:
        await MCPConnection("capped", server(tag, limits, {}), connect_timeout=20).start()
    message = str(raised.value)
    assert message.startswith(
        "MCP server 'capped': [servers.capped.limits] asks for limits this machine cannot"
    )
    assert "cpus 0.5: a CPU cap needs a control group" in message and "\n" not in message
    assert pids(tag) == []


async def test_a_missing_command_of_a_limited_server_is_command_not_found() -> None:
    raw = {"command": "no-such-mcp-server", "limits": {"open_files": 256}}
    with pytest.raises(ServerStartError) as raised:
        await MCPConnection("missing", raw, connect_timeout=20).start()
    assert str(raised.value) == "MCP server 'missing': cannot start 'no-such-mcp-server': command not found"


async def test_open_files_of_a_limited_server_are_capped(sandbox: dict[str, Any]) -> None:
    tag = f"{TAG}-files-{bool(sandbox)}"
    async with asyncio.timeout(GUARD):
        async with MCPConnection(
            "files", server(tag, {"open_files": 64}, sandbox), connect_timeout=20
        ) as conn:
            server_pids = pids(tag)  # bubblewrap's too, when sandboxed
            assert server_pids and {_soft_limit(pid, "Max open files") for pid in server_pids} == {64}
            assert text_of(await conn.call_tool("echo", {"text": "capped"})) == "capped"
    assert pids(tag) == []


def _soft_limit(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/limits") as f:
        line = next(line for line in f if line.startswith(name))
    return int(line[len(name) :].split()[0])
