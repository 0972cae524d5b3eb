"""An application attached to a workspace that runs cells with `execute()` answers no `ask` itself: a call a
rule asks about goes to the people `[approval] ask` lists (here `ipybox approve`), or is denied at once when
none is there, and the audit log says who answered. Only `CodeExecutor(execute_accepts_asks=True)` has
`execute()` accept them, as an embedded executor's `execute()` accepts every call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ipybox import CodeExecutor
from ipybox.approval.ask_events import AskOpenedMessage
from ipybox.running.approvers import ApproverConnection
from ipybox.supervisor import Supervisor, read_state
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    # Sandboxed, so that it also runs as a user that can't enforce an unsandboxed kernel's limits.
    workspace = make_workspace(tmp_path_factory.mktemp("unattended"), "unattended-asks", sandbox=True)
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


# `edge.slow` is asked about: the workspace's default decision is "ask" (tests/supervisor/workspaces.py).
ASKED = (
    "from mcptools.edge import slow\n"
    "from ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
    "try:\n    print(slow.run(slow.Params(seconds=0)))\n"
    "except ApprovalRejectedError as e:\n    print('rejected:', e)"
)


def last_audit(supervisor: Supervisor) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(supervisor.paths.audit.read_text().splitlines()[-1])
    return entry


async def test_execute_does_not_run_a_call_a_rule_asks_about_when_nobody_can_answer(
    supervisor: Supervisor,
) -> None:
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        text = (await executor.execute(ASKED)).text or ""
    assert text.startswith("rejected: ") and "slept" not in text, text
    assert "the application does not answer it (execute() answers no asks" in text
    assert "execute_accepts_asks=True" in text and "add an allow rule for edge.slow" in text
    entry = last_audit(supervisor)
    assert (entry["tool"], entry["decision"], entry["decided_by"]) == ("slow", "deny", "timeout")
    assert "the application does not answer it" in entry["reason"]


async def test_an_ask_from_execute_goes_to_the_person_at_ipybox_approve(supervisor: Supervisor) -> None:
    async with (
        ApproverConnection(read_state(supervisor.workspace), "alice on /dev/pts/7") as approver,
        CodeExecutor(workspace=supervisor.workspace) as executor,
    ):
        running = asyncio.create_task(executor.execute(ASKED))
        async for message in approver:
            if isinstance(message, AskOpenedMessage):
                assert (message.ask.server, message.ask.tool) == ("edge", "slow")
                assert (await approver.answer(message.ask.id, accept=False)).ok
                break
        text = (await asyncio.wait_for(running, 30)).text or ""
    assert text.startswith("rejected: ") and "slept" not in text, text
    entry = last_audit(supervisor)
    assert (entry["tool"], entry["decision"], entry["decided_by"], entry["by"]) == (
        "slow", "deny", "terminal", "terminal (alice on /dev/pts/7)",
    )  # fmt: skip


async def test_execute_accepts_asks_only_when_the_application_opts_in(supervisor: Supervisor) -> None:
    async with CodeExecutor(workspace=supervisor.workspace, execute_accepts_asks=True) as executor:
        assert (await executor.execute(ASKED)).text == "slept 0.0"
    entry = last_audit(supervisor)
    assert (entry["tool"], entry["decision"], entry["decided_by"]) == ("slow", "allow", "application")
