"""`AsksService` alone, in process (no kernels, no MCP servers): its approver and policy, and its answering
websockets served by a real embedded server on a Unix socket, reached with aiohttp as `ipybox approve` and
the MCP server reach them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from ipybox.approval.ask_events import (
    AnswerMessage,
    AnswerResult,
    AskClosedMessage,
    AskOpenedMessage,
    AskQuestion,
    parse_server_message,
)
from ipybox.asgi_server import EmbeddedServer
from ipybox.config import CONFIG_FILE, WorkspaceConfig, load_config
from ipybox.lifecycle import ServiceState
from ipybox.rules import ToolCall, Verdict
from ipybox.supervisor.asks import AsksService
from ipybox.supervisor.leases import LeaseTable
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.asyncio


@pytest.fixture
def config(tmp_path: Path) -> WorkspaceConfig:
    return load_config(make_workspace(tmp_path, "asks-service") / CONFIG_FILE)


def asks_service(config: WorkspaceConfig, reloads: list[str] | None = None) -> AsksService:
    async def reload_rules() -> Exception | None:
        if reloads is not None:
            reloads.append("rules")
        return None

    return AsksService(
        config.root,
        config.root / "audit.jsonl",
        leases=LeaseTable(),
        config=lambda: config,
        reload_rules=reload_rules,
        console_url=lambda: None,
    )


@pytest.fixture
async def served(config: WorkspaceConfig, tmp_path: Path) -> AsyncIterator[tuple[AsksService, Path]]:
    """The service, started, and the Unix socket its `/approvers` and `/asks` websockets are served on."""
    service = asks_service(config)

    async def approvers(websocket: WebSocket) -> None:
        await service.serve_approver(websocket, websocket.query_params.get("who", ""))

    async def asks(websocket: WebSocket) -> None:
        await service.serve_asker(websocket)

    app = Starlette(routes=[WebSocketRoute("/approvers", approvers), WebSocketRoute("/asks", asks)])
    server = EmbeddedServer(app, "test-asks")
    socket = tmp_path / "asks.sock"
    async with service:
        await server.start(unix_socket=socket)
        try:
            yield service, socket
        finally:
            await server.stop()


def edge_call() -> ToolCall:
    return ToolCall("edge", "slow", {"seconds": 1}, {})


async def receive(ws: aiohttp.ClientWebSocketResponse) -> object:
    return parse_server_message((await asyncio.wait_for(ws.receive(), 10)).data)


async def until(condition: object, guard: float = 5) -> None:
    async with asyncio.timeout(guard):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_before_it_starts_it_decides_by_the_files_approval_rules(config: WorkspaceConfig) -> None:
    service = asks_service(config)
    assert service.state is ServiceState.NEW and service.policy == config.approval
    [(_, verdict)] = service.explain(ToolCall("edge", "echo", {"text": "hi"}, {}))
    assert verdict.decision == "allow" and verdict.rule_id == "echo-ok"


async def test_a_started_service_decides_by_the_policy_it_is_given_later(config: WorkspaceConfig) -> None:
    async with asks_service(config) as service:
        assert service.state is ServiceState.RUNNING
        [(_, verdict)] = service.explain(ToolCall("edge", "getenv", {}, {}))
        assert verdict.decision == "deny" and verdict.rule_id == "no-getenv"
        service.set_policy(config.approval.model_copy(update={"rules": []}))
        [(_, verdict)] = service.explain(ToolCall("edge", "getenv", {}, {}))
        assert verdict.decision == "ask" and service.policy.rules == []


async def test_an_approver_sees_a_pending_ask_answers_it_and_is_counted_present_while_connected(
    served: tuple[AsksService, Path],
) -> None:
    service, socket = served
    ask = service.board.open(
        edge_call(),
        Verdict("ask", "ask-slow", "the rule asks"),
        asked_of="terminal",
        routes=("terminal",),
        timeout=30,
    )
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as http,
        http.ws_connect("http://localhost/approvers", params={"who": "alice"}) as ws,
    ):
        opened = await receive(ws)
        assert isinstance(opened, AskOpenedMessage) and opened.ask.id == ask.id
        await until(lambda: service.board.people("terminal") == 1)
        await ws.send_str(AnswerMessage(id=ask.id, accept=True).to_json())
        replies = [await receive(ws), await receive(ws)]
        result = next(reply for reply in replies if isinstance(reply, AnswerResult))
        closed = next(reply for reply in replies if isinstance(reply, AskClosedMessage))
        assert result.ok and closed.answer is not None and closed.answer.accept
        assert closed.answer.by == "terminal (alice)"
    await until(lambda: service.board.people("terminal") == 0)  # it left: nobody at the terminal


async def test_an_asker_that_leaves_withdraws_its_question(served: tuple[AsksService, Path]) -> None:
    service, socket = served
    question = AskQuestion(server="ipybox", tool="register_mcp_server", args={"name": "x"}, elicitation=True)
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as http:
        async with http.ws_connect("http://localhost/asks") as ws:
            await ws.send_str(question.to_json())
            opened = await receive(ws)
            assert isinstance(opened, AskOpenedMessage)
            assert [ask.id for ask in service.board.pending] == [opened.ask.id]
        await until(lambda: not service.board.pending)


async def test_an_askers_elicitation_answer_closes_its_question_with_that_answer(
    served: tuple[AsksService, Path],
) -> None:
    service, socket = served
    question = AskQuestion(server="ipybox", tool="register_mcp_server", args={"name": "x"}, elicitation=True)
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as http,
        http.ws_connect("http://localhost/asks") as ws,
    ):
        await ws.send_str(question.to_json())
        opened = await receive(ws)
        assert isinstance(opened, AskOpenedMessage) and opened.ask.asked_of == "elicitation"
        await ws.send_str(AnswerMessage(id=opened.ask.id, accept=False).to_json())
        closed = await receive(ws)
        assert isinstance(closed, AskClosedMessage) and closed.answer is not None
        assert closed.answer.accept is False and closed.answer.by == "the MCP client"
    assert not service.board.pending
