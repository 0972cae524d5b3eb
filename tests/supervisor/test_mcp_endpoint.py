"""The workspace's MCP endpoint (streamable HTTP) with real MCP clients: a session's kernel goes back to the
pool when the session ends, and serving sessions leaves the supervisor's log at INFO."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from ipybox.config import EndpointsSection
from ipybox.supervisor import Supervisor, read_state
from ipybox.supervisor.mcp_endpoint import MCPEndpoint
from tests.mcp_server.sessions import owned_session, text

pytestmark = pytest.mark.integration


def client(
    url: str, token: str, *, terminate_on_close: bool = True
) -> AbstractAsyncContextManager[ClientSession]:
    """An MCP session over streamable HTTP; on exit the client DELETEs it unless `terminate_on_close` is
    false (a client that vanishes)."""

    async def open_session(stack: AsyncExitStack) -> ClientSession:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        await stack.enter_async_context(http)
        read, write = await stack.enter_async_context(
            streamable_http_client(url, http_client=http, terminate_on_close=terminate_on_close)
        )
        return await stack.enter_async_context(ClientSession(read, write))

    return owned_session(open_session)


async def until(condition: Callable[[], bool], guard: float = 30) -> None:
    """Wait for `condition`; the guard only keeps a failing test from hanging."""
    deadline = asyncio.get_running_loop().time() + guard
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within the guard"
        await asyncio.sleep(0.05)


@pytest.fixture(autouse=True)
async def no_leases(supervisor: Supervisor) -> None:
    """Each test starts with no lease held: an earlier test's closed session gives its kernel back at once,
    but "at once" is a moment after its client's exit returned."""
    await until(lambda: supervisor.status().leases == 0)


def the_endpoint(supervisor: Supervisor) -> tuple[str, str]:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    return state.mcp_url, state.mcp_token


async def test_a_session_its_client_closes_gives_its_kernel_back_at_once(supervisor: Supervisor) -> None:
    url, token = the_endpoint(supervisor)
    async with client(url, token) as session:
        result = await session.call_tool("execute_ipython_cell", {"code": "print('leased')"})
        assert text(result) == "leased"
        assert supervisor.status().leases == 1
    # Before, the lease stayed until a sweep of sessions idle for 30 minutes.
    await until(lambda: supervisor.status().leases == 0)
    assert supervisor.status().pool.leased == 0


async def test_a_session_closed_while_its_cell_runs_gives_back_a_kernel_that_works(
    supervisor: Supervisor,
) -> None:
    url, token = the_endpoint(supervisor)
    async with client(url, token) as session:
        endless = {"code": "while True: pass", "timeout": 300}
        call = asyncio.create_task(session.call_tool("execute_ipython_cell", endless))
        await until(lambda: supervisor.status().leases == 1)
    with pytest.raises(Exception, match="Connection closed"):
        await call
    await until(lambda: supervisor.status().leases == 0)
    async with client(url, token) as session:
        result = await session.call_tool("execute_ipython_cell", {"code": "print('free')"})
        assert text(result) == "free"


async def test_a_session_whose_client_vanished_gives_its_kernel_back_after_the_idle_timeout(
    supervisor: Supervisor,
) -> None:
    endpoint = MCPEndpoint(
        supervisor.workspace, EndpointsSection(), supervisor.paths.outputs, session_idle=1.0
    )
    async with endpoint:
        assert endpoint.url is not None
        async with client(endpoint.url, endpoint.token, terminate_on_close=False) as session:
            await session.call_tool("execute_ipython_cell", {"code": "x = 1"})
            assert supervisor.status().leases == 1
        # No DELETE: the SDK closes the session after 1 s without a request, and its kernel goes back.
        await until(lambda: supervisor.status().leases == 0)


async def test_the_log_keeps_its_info_lines_after_an_mcp_session(supervisor: Supervisor) -> None:
    url, token = the_endpoint(supervisor)
    async with client(url, token) as session:
        await session.call_tool("execute_ipython_cell", {"code": "x = 1"})
    config = supervisor.workspace / "ipybox.toml"
    original = config.read_text()
    before = supervisor.paths.log.read_text().count("approval rules reloaded")
    # A reload after the session (before, the session's executor had set the `ipybox` logger to WARNING).
    config.write_text(original.replace("ask_timeout = 3", "ask_timeout = 4"))
    try:
        await until(lambda: supervisor.paths.log.read_text().count("approval rules reloaded") > before)
    finally:
        config.write_text(original)
    assert " INFO ipybox.supervisor: approval rules reloaded" in supervisor.paths.log.read_text()
