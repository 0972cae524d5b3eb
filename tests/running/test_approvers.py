"""`ApproverConnection` against a real workspace: a kernel's tool call asks, the approver sees it, answers
it, and hears of answers given elsewhere; refusals and a workspace that goes away are one clear error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ipybox import CodeExecutor
from ipybox.approval.ask_events import AskClosedMessage, AskOpenedMessage
from ipybox.running.approvers import ApproverConnection, ApproverMessage
from ipybox.running.control_client import ControlRequestError
from ipybox.running.state import NotRunningError, SupervisorState, read_state
from tests.supervisor.workspaces import make_workspace

if TYPE_CHECKING:  # imported where used: tests/cli/test_approve.py imports this module's helpers
    from ipybox.supervisor import Supervisor

pytestmark = pytest.mark.integration

TAG = "running-approvers"

ASK_RULE = """
[[approval.rules]]
id = "ask-slow"
server = "edge"
tool = "slow"
decision = "ask"
"""


def make_terminal_workspace(directory: Path, tag: str, *, ask_timeout: float = 60) -> Path:
    """A workspace whose `ask`s go to `ipybox approve` only (`[approval] ask = ["terminal"]`), so an
    attached application is not asked; `edge.slow` is asked by the rule `ask-slow`."""
    make_workspace(directory, tag, ask_timeout=ask_timeout)
    config = directory / "ipybox.toml"
    text = config.read_text().replace("[approval]\n", '[approval]\nask = ["terminal"]\n', 1)
    config.write_text(text + ASK_RULE)
    return directory


def slow_call(seconds: float = 0) -> str:
    """Kernel code calling `edge.slow` that prints its result, or the rejection."""
    return (
        "from mcptools.edge import slow\n"
        "from ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
        f"try:\n    print(slow.run(slow.Params(seconds={seconds})))\n"
        "except ApprovalRejectedError as e:\n    print('rejected:', e)"
    )


async def next_message(approver: ApproverConnection) -> ApproverMessage:
    async for message in approver:
        return message
    raise AssertionError("the approver's messages ended")


async def next_opened(approver: ApproverConnection) -> AskOpenedMessage:
    while not isinstance(message := await next_message(approver), AskOpenedMessage):
        pass
    return message


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    from ipybox.supervisor import Supervisor

    supervisor = Supervisor(make_terminal_workspace(tmp_path_factory.mktemp("approvers"), TAG))
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


@pytest.fixture
def state(supervisor: Supervisor) -> SupervisorState:
    return read_state(supervisor.workspace)


@pytest.fixture(scope="module")
async def kernel(supervisor: Supervisor) -> AsyncIterator[CodeExecutor]:
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        yield executor


async def test_an_approver_sees_a_kernels_ask_and_its_answer_lets_the_call_run(
    state: SupervisorState, kernel: CodeExecutor, supervisor: Supervisor
) -> None:
    async with ApproverConnection(state, "alice on /dev/pts/9") as approver:
        call = asyncio.create_task(kernel.execute(slow_call()))
        opened = await next_opened(approver)
        assert (opened.ask.server, opened.ask.tool, opened.ask.args) == ("edge", "slow", {"seconds": 0})
        assert opened.ask.rule_id == "ask-slow" and "terminal" in opened.ask.routes
        result = await approver.answer(opened.ask.id, accept=True, scope="once")
        assert result.ok and result.error is None
        closed = await next_message(approver)
        assert isinstance(closed, AskClosedMessage) and closed.id == opened.ask.id
        assert closed.answer is not None
        assert closed.answer.describe() == "allowed once by terminal (alice on /dev/pts/9)"
        assert (await call).text == "slept 0.0"
    last = json.loads(supervisor.paths.audit.read_text().splitlines()[-1])
    assert (last["tool"], last["decision"], last["decided_by"], last["scope"]) == (
        "slow",
        "allow",
        "terminal",
        "once",
    )
    assert last["by"] == "terminal (alice on /dev/pts/9)"


async def test_a_denial_reaches_the_kernel_as_a_rejection(
    state: SupervisorState, kernel: CodeExecutor
) -> None:
    async with ApproverConnection(state, "alice") as approver:
        call = asyncio.create_task(kernel.execute(slow_call()))
        opened = await next_opened(approver)
        assert (await approver.answer(opened.ask.id, accept=False)).ok
        text = (await call).text
        assert text is not None and text.startswith("rejected: edge.slow was rejected")


async def test_asks_pending_when_an_approver_connects_come_first_and_answers_reach_everyone(
    state: SupervisorState, kernel: CodeExecutor
) -> None:
    async with ApproverConnection(state, "first") as first:
        call = asyncio.create_task(kernel.execute(slow_call()))
        opened = await next_opened(first)
        async with ApproverConnection(state, "second") as second:
            pending = await next_message(second)
            assert isinstance(pending, AskOpenedMessage) and pending.ask.id == opened.ask.id
            assert (await second.answer(opened.ask.id, accept=True)).ok
            late = await first.answer(opened.ask.id, accept=False)
            assert not late.ok and late.error is not None
            for approver in (first, second):
                closed = await next_message(approver)
                assert isinstance(closed, AskClosedMessage) and closed.answer is not None
                assert closed.answer.by == "terminal (second)"
        assert (await call).text == "slept 0.0"


async def test_an_ask_about_a_kernel_made_link_shows_where_it_leads(
    state: SupervisorState, kernel: CodeExecutor, supervisor: Supervisor
) -> None:
    # The attack: a harmless-looking path that is a link to ipybox.toml, asked about as if it were a file.
    from ipybox.cli.approve import ask_lines

    code = (
        "import os\nos.makedirs('gentools-x', exist_ok=True)\n"
        "os.path.lexists('gentools-x/notes.md') or os.symlink('../ipybox.toml', 'gentools-x/notes.md')\n"
        "from mcptools.edge import fail\n"
        "from ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
        "try:\n    fail.run(fail.Params(message='gentools-x/notes.md'))\n"
        "except ApprovalRejectedError as e:\n    print('rejected')"
    )
    async with ApproverConnection(state, "alice") as approver:
        call = asyncio.create_task(kernel.execute(code))
        opened = await next_opened(approver)
        target = str(supervisor.workspace / "ipybox.toml")
        link = opened.ask.links["message"]
        assert (link.target, link.flag) == (target, "protected")
        assert f"    message → {target} (protected)" in ask_lines(opened.ask, datetime.now(UTC))
        assert (await approver.answer(opened.ask.id, accept=False)).ok
        assert (await call).text == "rejected"


async def test_answering_an_unknown_ask_is_refused_with_a_reason(state: SupervisorState) -> None:
    async with ApproverConnection(state, "alice") as approver:
        result = await approver.answer("999-nothing", accept=True)
        assert not result.ok and result.error


async def test_a_wrong_token_is_refused(state: SupervisorState) -> None:
    wrong = state.model_copy(update={"control_token": "not-the-token"})
    with pytest.raises(ControlRequestError, match="refused the approver connection"):
        async with ApproverConnection(wrong, "mallory"):
            pass


async def test_a_workspace_that_is_not_there_is_not_running(state: SupervisorState, tmp_path: Path) -> None:
    gone = state.model_copy(update={"control_socket": str(tmp_path / "no.sock")})
    with pytest.raises(NotRunningError, match="cannot reach ipybox in"):
        async with ApproverConnection(gone, "alice"):
            pass


async def test_the_workspace_stopping_ends_the_messages_with_not_running(tmp_path: Path) -> None:
    from ipybox.supervisor import Supervisor

    supervisor = Supervisor(make_terminal_workspace(tmp_path, f"{TAG}-stop"))
    await supervisor.start()
    try:
        async with ApproverConnection(read_state(tmp_path), "alice") as approver:
            await supervisor.stop()
            with pytest.raises(NotRunningError, match=f"ipybox in {tmp_path} stopped"):
                await next_message(approver)
            with pytest.raises(NotRunningError):
                await approver.answer("1-x", accept=True)
    finally:
        await supervisor.stop()
