"""ApprovalChannel and ApprovalClient over the tool server's websocket."""

from __future__ import annotations

import asyncio

import pytest

from ipybox.approval import ApprovalClient, ApprovalRequest
from ipybox.in_kernel.tool_runner import ApprovalRejectedError, ApprovalTimeoutError, ToolRunner
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params


async def call(server: ToolServer, message: str) -> object:
    runner = ToolRunner("everything", address=server.calls_address, token=server.call_token)
    return await asyncio.to_thread(runner.run_sync, "echo", {"message": message})


@pytest.fixture(scope="module")
async def server() -> object:
    async with ToolServer(
        servers={"everything": params.everything()}, approval_required=True, approval_timeout=2
    ) as s:
        yield s


async def test_accept_and_reject(server: ToolServer) -> None:
    seen: list[ApprovalRequest] = []

    async def decide(request: ApprovalRequest) -> None:
        seen.append(request)
        await (request.accept() if request.tool_args["message"] == "yes" else request.reject())

    async with ApprovalClient(decide, address=server.address, token=server.token):
        assert await call(server, "yes") == "Echo: yes"
        with pytest.raises(ApprovalRejectedError, match=r"everything\.echo was rejected"):
            await call(server, "no")
    assert [(r.server_name, r.tool_name, r.tool_args) for r in seen] == [
        ("everything", "echo", {"message": "yes"}),
        ("everything", "echo", {"message": "no"}),
    ]
    # Known once the server listed its tools (the accepted first call started it); a call is decided before
    # its server starts, so a first call may carry none (see test_attacks).
    assert seen[1].annotations.get("readOnlyHint") is True
    assert str(seen[0]) == "everything.echo(message='yes')"


async def test_pending_calls_are_decided_independently(server: ToolServer) -> None:
    pending: list[ApprovalRequest] = []
    all_arrived = asyncio.Event()

    async def collect(request: ApprovalRequest) -> None:
        pending.append(request)
        if len(pending) == 3:
            all_arrived.set()

    async with ApprovalClient(collect, address=server.address, token=server.token):
        calls = [asyncio.create_task(call(server, str(i))) for i in range(3)]
        await asyncio.wait_for(all_arrived.wait(), 5)
        by_message = {r.tool_args["message"]: r for r in pending}
        await by_message["2"].accept()
        await by_message["1"].reject()
        await by_message["0"].accept()
        results = await asyncio.gather(*calls, return_exceptions=True)
    assert results[0] == "Echo: 0"
    assert isinstance(results[1], ApprovalRejectedError)
    assert results[2] == "Echo: 2"


async def test_undecided_call_times_out(server: ToolServer) -> None:
    async def ignore(request: ApprovalRequest) -> None:
        pass

    async with ApprovalClient(ignore, address=server.address, token=server.token):
        with pytest.raises(ApprovalTimeoutError, match="within 2 s"):
            await call(server, "late")


async def test_disconnecting_rejects_pending_calls(server: ToolServer) -> None:
    arrived = asyncio.Event()

    async def hold(request: ApprovalRequest) -> None:
        arrived.set()

    client = ApprovalClient(hold, address=server.address, token=server.token)
    await client.connect()
    pending = asyncio.create_task(call(server, "orphan"))
    await asyncio.wait_for(arrived.wait(), 5)
    await client.disconnect()
    with pytest.raises(ApprovalRejectedError):
        await pending


async def test_a_failing_callback_rejects(server: ToolServer) -> None:
    async def broken(request: ApprovalRequest) -> None:
        raise ValueError("bug in the application")

    async with ApprovalClient(broken, address=server.address, token=server.token):
        with pytest.raises(ApprovalRejectedError):
            await call(server, "x")


async def test_request_cannot_be_decided_twice_differently() -> None:
    decisions: list[bool] = []

    async def respond(accepted: bool) -> None:
        decisions.append(accepted)

    request = ApprovalRequest("s", "t", {}, respond)
    await request.accept()
    await request.accept()
    with pytest.raises(RuntimeError, match="already accepted"):
        await request.reject()
    assert decisions == [True]
