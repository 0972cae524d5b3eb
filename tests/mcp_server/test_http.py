"""The MCP endpoint `ipybox up` serves (streamable HTTP): bearer token, Origin check, a kernel per session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.session import ElicitationFnT
from mcp.client.streamable_http import streamable_http_client

from ipybox.approval.asks import AskAnswer
from ipybox.supervisor import Supervisor, read_state
from tests.mcp_server.sessions import check_cancellation_frees_the_kernel, check_progress, owned_session, text
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(make_workspace(tmp_path_factory.mktemp("mcp-http"), "mcp-http", warm_pool=2))
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


def client(
    url: str, token: str, elicitation_callback: ElicitationFnT | None = None
) -> AbstractAsyncContextManager[ClientSession]:
    async def open_session(stack: AsyncExitStack) -> ClientSession:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        await stack.enter_async_context(http)
        read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        session = ClientSession(read, write, elicitation_callback=elicitation_callback)
        return await stack.enter_async_context(session)

    return owned_session(open_session)


async def test_each_session_has_its_own_kernel(supervisor: Supervisor) -> None:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    assert state.mcp_url.startswith("http://127.0.0.1:")
    async with client(state.mcp_url, state.mcp_token) as one, client(state.mcp_url, state.mcp_token) as two:
        await one.call_tool("execute_ipython_cell", {"code": "x = 'one'"})
        assert text(await one.call_tool("execute_ipython_cell", {"code": "print(x)"})) == "one"
        other = await two.call_tool("execute_ipython_cell", {"code": "print('x' in globals())"})
        assert text(other) == "False"
        code = "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='over http')))"
        assert text(await two.call_tool("execute_ipython_cell", {"code": code})) == "over http"
        assert supervisor.status().leases == 2


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Origin": "http://evil.example"}, 403),
    ],
)
async def test_requests_without_the_token_or_from_other_origins_are_refused(
    supervisor: Supervisor, headers: dict[str, str], status: int
) -> None:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None
    if "Origin" in headers:
        headers = {**headers, "Authorization": f"Bearer {state.mcp_token}"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(
            state.mcp_url,
            json=body,
            headers={**headers, "Accept": "application/json, text/event-stream"},
        )
    assert response.status_code == status


async def test_ask_becomes_an_elicitation_over_http(supervisor: Supervisor) -> None:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    answers = [True, False]
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"allow": answers.pop(0)})

    # No rule covers edge.weather, and the workspace's default is "ask".
    code = "from mcptools.edge import weather\nprint(weather.run(weather.Params(city='Graz')).city)"
    async with client(state.mcp_url, state.mcp_token, elicit) as session:
        assert text(await session.call_tool("execute_ipython_cell", {"code": code})) == "Graz"
        rejected = await session.call_tool("execute_ipython_cell", {"code": code})
    assert rejected.is_error and "rejected" in text(rejected)
    assert len(asked) == 2 and "edge.weather" in asked[0]


async def test_progress_and_cancellation_over_http(supervisor: Supervisor) -> None:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    async with client(state.mcp_url, state.mcp_token) as session:
        await check_progress(session)
        await check_cancellation_frees_the_kernel(session)


async def _answer_when_asked(supervisor: Supervisor, accept: bool, scope: str = "once") -> str:
    """Answer the first ask to reach the workspace's board as a person at the console would."""
    for _ in range(1000):
        if supervisor.board.pending:
            ask = supervisor.board.pending[0]
            answer = AskAnswer(accept, scope, "console", "console (test)")  # type: ignore[arg-type]
            why = await supervisor.answer(ask.id, answer)
            assert why is None, why
            return f"{ask.call.server}.{ask.call.tool}"
        await asyncio.sleep(0.01)
    raise AssertionError("no ask reached the console")


async def test_a_client_without_elicitation_gets_its_ask_answered_by_a_person_at_the_console(
    supervisor: Supervisor,
) -> None:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    code = "from mcptools.edge import weather\nprint(weather.run(weather.Params(city='Linz')).city)"
    async with client(state.mcp_url, state.mcp_token) as session:
        with supervisor.board.present("console"):  # a console page is open
            person = asyncio.create_task(_answer_when_asked(supervisor, True))
            result = await session.call_tool("execute_ipython_cell", {"code": code})
            assert await person == "edge.weather"
        assert text(result) == "Linz"
        # With nobody at the console, the same call is refused at once, naming what to do.
        refused = await session.call_tool("execute_ipython_cell", {"code": code})
    assert refused.is_error and "nobody is connected to answer" in text(refused)
    assert "no MCP client with elicitation" in text(refused)


async def test_a_person_answering_first_withdraws_the_mcp_clients_elicitation(supervisor: Supervisor) -> None:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    dialog_open = asyncio.Event()
    dialog_closed = asyncio.Event()

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        dialog_open.set()
        try:
            await asyncio.sleep(60)  # a dialog nobody looks at
        finally:
            dialog_closed.set()
        return types.ElicitResult(action="accept", content={"allow": False})

    code = "from mcptools.edge import weather\nprint(weather.run(weather.Params(city='Wels')).city)"
    async with client(state.mcp_url, state.mcp_token, elicit) as session:
        with supervisor.board.present("console"):
            cell = asyncio.create_task(session.call_tool("execute_ipython_cell", {"code": code}))
            await asyncio.wait_for(dialog_open.wait(), 30)
            assert supervisor.board.pending[0].asked_of == "elicitation"
            await _answer_when_asked(supervisor, True)
            result = await asyncio.wait_for(cell, 30)
    assert text(result) == "Wels"
    await asyncio.wait_for(dialog_closed.wait(), 10)  # the client was told to drop its dialog
