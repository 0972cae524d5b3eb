"""`ApprovalChannel`, the interactive approver: asks in process or over its websocket, and only an explicit
accept approves; nobody to ask, no answer in time, a client that leaves or garbles its answer never do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from starlette.websockets import WebSocket

from ipybox.approval import (
    ApprovalChannel,
    ApprovalClient,
    ApprovalRequest,
    Approved,
    NoOneToAsk,
    Rejected,
    TimedOut,
)
from ipybox.approval.channel import CLIENT_LEFT, NO_CLIENT
from ipybox.approval.wire import (
    INVALID_PARAMS,
    PARSE_ERROR,
    ApprovalAsk,
    ApprovalError,
    CallParams,
    parse_reply,
)
from ipybox.rules import ToolCall
from tests.approval.conftest import serving

CALL = ToolCall("fs", "write_file", {"path": "a"}, {"destructiveHint": True, "title": "Write"}, caller="k1")


def error_of(frame: str) -> ApprovalError:
    reply = parse_reply(frame)
    assert isinstance(reply, ApprovalError), reply
    return reply


class Clock:
    """Records how `pause` was used: each pause must be resumed exactly once."""

    def __init__(self) -> None:
        self.paused = 0
        self.resumed = 0

    def pause(self) -> Callable[[], None]:
        self.paused += 1

        def resume() -> None:
            self.resumed += 1

        return resume


async def test_a_channel_that_requires_no_approval_approves_without_asking() -> None:
    asked: list[ApprovalRequest] = []

    async def handler(request: ApprovalRequest) -> None:
        asked.append(request)

    assert await ApprovalChannel(False, handler=handler).decide(CALL) == Approved()
    assert asked == []


async def test_with_nobody_connected_the_outcome_is_no_one_to_ask_and_no_clock_stops() -> None:
    clock = Clock()
    channel = ApprovalChannel(True, pause=clock.pause)
    assert not channel.open
    assert await channel.decide(CALL) == NoOneToAsk(NO_CLIENT)
    assert clock.paused == 0


@pytest.mark.parametrize(("accept", "outcome"), [(True, Approved()), (False, Rejected())])
async def test_the_handler_decides_on_the_call_it_is_shown(accept: bool, outcome: object) -> None:
    seen: list[ApprovalRequest] = []

    async def handler(request: ApprovalRequest) -> None:
        seen.append(request)
        await (request.accept() if accept else request.reject())

    assert await ApprovalChannel(True, handler=handler).decide(CALL) == outcome
    [request] = seen
    assert (request.server_name, request.tool_name, request.tool_args) == ("fs", "write_file", {"path": "a"})
    assert request.annotations == {"destructiveHint": True, "title": "Write"}
    assert request.call.caller == ""  # an application is not told which kernel called


async def test_a_later_decision_is_waited_for_with_the_clock_paused() -> None:
    clock = Clock()
    pending: list[ApprovalRequest] = []

    async def handler(request: ApprovalRequest) -> None:
        pending.append(request)  # decided later, as `stream()` does

    channel = ApprovalChannel(True, 5, handler=handler, pause=clock.pause)
    decision = asyncio.create_task(channel.decide(CALL))
    while not pending:
        await asyncio.sleep(0.01)
    assert (clock.paused, clock.resumed) == (1, 0)
    await pending[0].accept()
    assert await decision == Approved()
    assert (clock.paused, clock.resumed) == (1, 1)


async def test_an_undecided_call_times_out_and_the_clock_resumes() -> None:
    clock = Clock()
    pending: list[ApprovalRequest] = []

    async def handler(request: ApprovalRequest) -> None:
        pending.append(request)

    channel = ApprovalChannel(True, 60, handler=handler, pause=clock.pause)
    assert await channel.decide(CALL, timeout=0.1) == TimedOut(0.1)
    assert (clock.paused, clock.resumed) == (1, 1)
    await pending[0].accept()  # too late: harmless, and nothing runs


async def test_without_an_approval_timeout_a_call_waits_for_its_decision() -> None:
    pending: list[ApprovalRequest] = []

    async def handler(request: ApprovalRequest) -> None:
        pending.append(request)

    channel = ApprovalChannel(True, None, handler=handler)  # ipybox 0.9.2's default: no limit
    decision = asyncio.create_task(channel.decide(CALL))
    while not pending:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    assert not decision.done()
    await pending[0].accept()
    assert await decision == Approved()


async def test_a_failing_handler_is_a_bug_not_a_decision() -> None:
    clock = Clock()

    async def handler(request: ApprovalRequest) -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await ApprovalChannel(True, handler=handler, pause=clock.pause).decide(CALL)
    assert (clock.paused, clock.resumed) == (1, 1)


async def test_the_earlier_request_method_keeps_its_bool_and_exceptions() -> None:
    async def reject(request: ApprovalRequest) -> None:
        await request.reject()

    assert await ApprovalChannel(True, handler=reject).request("s", "t", {}) is False
    with pytest.raises(RuntimeError, match="no approval client"):
        await ApprovalChannel(True).request("s", "t", {})
    with pytest.raises(TimeoutError):
        await ApprovalChannel(True, 0.05, handler=lambda request: asyncio.sleep(0)).request("s", "t", {})


# --- over the websocket ------------------------------------------------------------------------------------


@pytest.fixture
async def channel() -> AsyncIterator[tuple[ApprovalChannel, str]]:
    channel = ApprovalChannel(True, 5)
    async with serving({"/approval": channel.connect}) as address:
        yield channel, address
        await channel.disconnect()


async def wait_open(channel: ApprovalChannel) -> None:
    while not channel.open:
        await asyncio.sleep(0.01)


async def test_an_approval_client_decides_each_call(channel: tuple[ApprovalChannel, str]) -> None:
    approvals, address = channel
    seen: list[ToolCall] = []

    async def decide(request: ApprovalRequest) -> None:
        seen.append(request.call)
        await (request.accept() if request.tool_args["path"] == "a" else request.reject())

    async with ApprovalClient(decide, address=address):
        await wait_open(approvals)
        assert await approvals.decide(CALL) == Approved()
        assert await approvals.decide(ToolCall("fs", "write_file", {"path": "b"})) == Rejected()
    assert seen[0] == ToolCall(CALL.server, CALL.tool, CALL.args, CALL.annotations)


async def test_a_second_client_is_refused_while_one_is_connected(
    channel: tuple[ApprovalChannel, str],
) -> None:
    approvals, address = channel
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{address}/approval") as first:
        await wait_open(approvals)
        # Refused before the handshake completes, which the server sends as 403.
        with pytest.raises(aiohttp.WSServerHandshakeError, match="403"):
            await http.ws_connect(f"{address}/approval")
        assert not first.closed


async def test_a_client_leaving_mid_question_leaves_no_one_to_ask(
    channel: tuple[ApprovalChannel, str],
) -> None:
    approvals, address = channel
    arrived = asyncio.Event()

    async def hold(request: ApprovalRequest) -> None:
        arrived.set()

    client = ApprovalClient(hold, address=address)
    await client.connect()
    await wait_open(approvals)
    decision = asyncio.create_task(approvals.decide(CALL))
    await asyncio.wait_for(arrived.wait(), 5)
    await client.disconnect()
    assert await decision == NoOneToAsk(CLIENT_LEFT)


async def test_a_malformed_answer_rejects_its_call_and_tells_the_client(
    channel: tuple[ApprovalChannel, str],
) -> None:
    approvals, address = channel
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{address}/approval") as ws:
        await wait_open(approvals)
        decision = asyncio.create_task(approvals.decide(CALL))
        ask = ApprovalAsk.model_validate_json((await ws.receive()).data)
        await ws.send_str(f'{{"id": {ask.id}, "result": {{"accept": "yes"}}}}')
        outcome = await decision
        assert (
            isinstance(outcome, Rejected)
            and "result.accept: Input should be a valid boolean" in outcome.reason
        )
        error = error_of((await ws.receive()).data)
        assert error.id == ask.id and "result.accept" in error.error.message


async def test_garbage_is_answered_with_an_error_and_the_connection_stays_usable(
    channel: tuple[ApprovalChannel, str],
) -> None:
    approvals, address = channel
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{address}/approval") as ws:
        await wait_open(approvals)
        await ws.send_str("not json")
        await ws.send_bytes(b"\xff\x00")
        for _ in range(2):
            error = error_of((await ws.receive()).data)
            assert error.id is None and error.error.code == PARSE_ERROR
        decision = asyncio.create_task(approvals.decide(CALL))
        ask = ApprovalAsk.model_validate_json((await ws.receive()).data)
        assert ask.params == CallParams.of(CALL)
        await ws.send_str(f'{{"jsonrpc": "2.0", "id": {ask.id}, "result": {{"accept": true}}}}')
        assert await decision == Approved()


async def test_a_client_that_cannot_read_a_request_rejects_its_call(
    channel: tuple[ApprovalChannel, str],
) -> None:
    approvals, address = channel
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{address}/approval") as ws:
        await wait_open(approvals)
        decision = asyncio.create_task(approvals.decide(CALL))
        ask = ApprovalAsk.model_validate_json((await ws.receive()).data)
        error = {"code": INVALID_PARAMS, "message": "unknown tool"}
        await ws.send_json({"jsonrpc": "2.0", "id": ask.id, "error": error})
        assert await decision == Rejected("the approval client could not decide: unknown tool")


async def test_an_approval_client_answers_a_malformed_request_with_an_error() -> None:
    # The client's end of the contract: a request it can't read never reaches its callback.
    received: asyncio.Queue[str] = asyncio.Queue()
    called: list[ApprovalRequest] = []

    async def fake_server(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(
            '{"jsonrpc": "2.0", "id": 4, "method": "approve", "params": {"tool_args": 1}}'
        )
        await received.put(await websocket.receive_text())
        await websocket.close()

    async def callback(request: ApprovalRequest) -> None:
        called.append(request)

    async with serving({"/approval": fake_server}) as address, ApprovalClient(callback, address=address):
        error = error_of(await asyncio.wait_for(received.get(), 5))
    assert error.id == 4 and error.error.code == INVALID_PARAMS
    assert "params.server_name: Field required" in error.error.message
    assert called == []
