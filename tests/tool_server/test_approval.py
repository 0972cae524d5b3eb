"""The tool server's one approver: each outcome reaches the calling code as its error, and the interactive
one (ApprovalChannel) answers through an ApprovalClient on the tool server's websocket."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from ipybox.approval import (
    Approval,
    ApprovalChannel,
    ApprovalClient,
    ApprovalRequest,
    ApproveAll,
    FunctionApprover,
    NoOneToAsk,
    Rejected,
    TimedOut,
)
from ipybox.in_kernel.tool_runner import (
    ApprovalRejectedError,
    ApprovalTimeoutError,
    ToolRunner,
    ToolRunnerError,
)
from ipybox.rules import ToolCall
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params


async def call(server: ToolServer, message: str) -> object:
    runner = ToolRunner("everything", address=server.calls_address, token=server.call_token)
    return await asyncio.to_thread(runner.run_sync, "echo", {"message": message})


# For the tests that start no server: parameters that need nothing installed (the fast tier needs nothing),
# under the name the calls use.
NEVER_STARTED = {"everything": params.edge()}


@pytest.fixture(scope="module")
async def server() -> object:
    async with ToolServer(
        servers={"everything": params.everything()}, approval_required=True, approval_timeout=2
    ) as s:
        yield s


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
async def test_undecided_call_times_out(server: ToolServer) -> None:
    async def ignore(request: ApprovalRequest) -> None:
        pass

    async with ApprovalClient(ignore, address=server.address, token=server.token):
        with pytest.raises(ApprovalTimeoutError, match="within 2 s"):
            await call(server, "late")


@pytest.mark.integration
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


@pytest.mark.integration
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


def test_the_approver_is_the_channel_when_approval_is_required_else_approve_all() -> None:
    required = ToolServer(approval_required=True)
    assert isinstance(required.approver, ApprovalChannel) and required.approver is required.approval
    assert isinstance(ToolServer().approver, ApproveAll)


@pytest.mark.parametrize(
    ("outcome", "error", "message"),
    [
        (Rejected(), ApprovalRejectedError, r"^everything\.echo was rejected$"),
        (Rejected("not today"), ApprovalRejectedError, r"^everything\.echo was rejected: not today$"),
        (
            NoOneToAsk("nobody home"),
            ApprovalRejectedError,
            r"^everything\.echo was not approved: nobody home$",
        ),
        (TimedOut(1.5), ApprovalTimeoutError, r"^no decision on everything\.echo within 1\.5 s$"),
    ],
)
async def test_each_outcome_but_approved_reaches_the_calling_code_as_its_error_and_starts_nothing(
    outcome: Approval, error: type[Exception], message: str
) -> None:
    seen: list[ToolCall] = []

    async def decide(call: ToolCall) -> Approval:
        seen.append(call)
        return outcome

    async with ToolServer(servers=NEVER_STARTED, approver=FunctionApprover(decide)) as server:
        with pytest.raises(error, match=message):
            await call(server, "x")
        assert server.servers.started("everything") is None
    assert seen == [ToolCall("everything", "echo", {"message": "x"})]  # asked once, as the shared caller ""


async def test_an_approver_that_raises_is_reported_as_a_bug_not_taken_for_a_decision() -> None:
    async def broken(call: ToolCall) -> Approval:
        raise KeyError("bug in the approver")

    async with ToolServer(servers=NEVER_STARTED, approver=FunctionApprover(broken)) as server:
        with pytest.raises(ToolRunnerError, match="the tool server failed: KeyError") as info:
            await call(server, "x")
        assert not isinstance(info.value, ApprovalRejectedError)
        assert server.servers.started("everything") is None


def test_the_published_approver_names_still_import() -> None:
    from ipybox.tool_exec.server import Approver, ToolCallRequest

    assert ToolCallRequest is ToolCall
    assert isinstance(Approver, type)


def client_tasks(others: Collection[asyncio.Task[object]] = ()) -> list[asyncio.Task[object]]:
    """The approval clients' tasks still running in this loop (their group's host, reader and handlers);
    but `others` (those of clients the worker's other tests hold on the shared loop)."""
    return [
        task
        for task in asyncio.all_tasks()
        if task.get_name().startswith("ipybox-approval") and task not in others
    ]


async def test_disconnecting_cancels_a_callback_still_deciding_and_waits_until_it_ended() -> None:
    entered = asyncio.Event()
    ended: list[str] = []

    async def slow(request: ApprovalRequest) -> None:
        entered.set()
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append(request.tool_args["message"])

    others = client_tasks()
    async with ToolServer(servers=NEVER_STARTED, approval_required=True, approval_timeout=30) as server:
        client = ApprovalClient(slow, address=server.address, token=server.token)
        await client.connect()
        pending = asyncio.create_task(call(server, "x"))
        await asyncio.wait_for(entered.wait(), 5)
        assert len(client_tasks(others)) == 3  # the group's host, the reader and the one handler
        await client.disconnect()
        assert ended == ["x"] and client_tasks(others) == []
        with pytest.raises(ApprovalRejectedError):
            await pending
        assert server.servers.started("everything") is None


async def test_a_client_refuses_a_second_connect_and_connects_again_after_disconnecting() -> None:
    async def reject(request: ApprovalRequest) -> None:
        await request.reject()

    others = client_tasks()
    async with ToolServer(servers=NEVER_STARTED, approval_required=True, approval_timeout=5) as server:
        client = ApprovalClient(reject, address=server.address, token=server.token)
        await client.connect()
        with pytest.raises(RuntimeError, match="connected already: disconnect"):
            await client.connect()
        await client.disconnect()
        await client.disconnect()  # idempotent
        await client.connect()
        try:
            with pytest.raises(ApprovalRejectedError):
                await call(server, "again")
        finally:
            await client.disconnect()
        assert client_tasks(others) == []
