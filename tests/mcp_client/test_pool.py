"""`MCPServers`' bookkeeping of who uses which started server, which a caller's reset relies on (issue 14,
item 4): in-flight calls count from before their server starts until they return, whatever the outcome;
`reset_caller` stops only what that caller alone used. Against our edge server over stdio."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ipybox.mcp_client.pool import MCPServers, UnknownServerError
from tests.servers import params

pytestmark = pytest.mark.integration

GUARD = 30  # seconds: only against a hang


@pytest.fixture
async def servers() -> AsyncIterator[MCPServers]:
    pool = MCPServers({name: params.edge() for name in ("one", "two", "host")}, connect_timeout=GUARD)
    yield pool
    await pool.stop()


async def test_a_call_is_in_flight_until_it_returns_and_makes_its_caller_a_user(servers: MCPServers) -> None:
    pending = asyncio.ensure_future(servers.call("one", "slow", {"seconds": 1}, caller="b"))
    for _ in range(GUARD * 100):  # counted from before the server has started
        if servers.calls_in_flight("one"):
            break
        await asyncio.sleep(0.01)
    assert servers.calls_in_flight("one") == {"b": 1}
    await asyncio.wait_for(pending, GUARD)
    assert servers.calls_in_flight("one") == {}
    assert servers.users("one") == {"b"}


async def test_calls_that_fail_leave_nothing_in_flight(servers: MCPServers) -> None:
    result = await servers.call("one", "fail", {"message": "no"}, caller="a")
    assert result.is_error
    with pytest.raises(UnknownServerError):
        await servers.call("missing", "echo", {"text": "x"}, caller="a")
    assert servers.calls_in_flight("one") == {} and servers.calls_in_flight("missing") == {}
    assert servers.users("one") == {"a"}


async def test_reset_caller_stops_what_the_caller_alone_used_and_keeps_the_rest(servers: MCPServers) -> None:
    await asyncio.gather(
        servers.call("one", "echo", {"text": "x"}, caller="a"),
        servers.call("two", "echo", {"text": "x"}, caller="a"),
        servers.connection("host"),  # started by the host for its own use: no caller's
    )
    await servers.call("two", "echo", {"text": "x"}, caller="b")
    assert await servers.reset_caller("a") == ["one"]
    assert servers.started("one") is None
    assert servers.started("two") is not None and servers.users("two") == {"b"}
    assert servers.started("host") is not None
    assert await servers.reset_caller("b") == ["two"]
