"""`WorkspaceApprover` routing an `ask`: to the first route of `[approval] ask` that can answer, with the
people present (console, terminal) able to answer first; answers once, for the session, or always; the
first answer wins and the others are withdrawn (the application's request included, over its websocket)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.websockets import WebSocket

from ipybox.approval import Approval, ApprovalClient, ApprovalRequest, Approved, NoOneToAsk, Rejected
from ipybox.approval.ask_events import AskView
from ipybox.approval.asks import AskAnswer, AskBoard, AskClosed, AskOpened, PendingAsk
from ipybox.approval.channel import ApprovalChannel
from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall
from tests.approval.conftest import serving

RULES = [
    {"id": "writes", "server": "fs", "tool": "write_*", "decision": "ask", "priority": 5},
    {"id": "pip", "server": "shell", "tool": "pip", "decision": "ask"},
    {"id": "ls", "server": "shell", "tool": "ls", "decision": "allow"},
]
CALL = ToolCall("fs", "write_file", {"path": "out/a.md"}, caller="k1")
ROOT = AskAnswer(True, "once", "console", "console (root)")


def policy(ask: list[str] | None = None, ask_timeout: float = 5) -> ApprovalPolicy:
    table: dict[str, Any] = {"default": "deny", "ask_timeout": ask_timeout, "rules": RULES}
    if ask is not None:
        table["ask"] = ask
    return ApprovalPolicy.model_validate(table)


def audited(approver: WorkspaceApprover) -> list[dict[str, Any]]:
    return [json.loads(line) for line in approver.audit.path.read_text().splitlines()]


class Workspace:
    """An approver as a supervisor wires it: one lease `L1` holding caller k1, an optional application
    channel for it, and a rule writer that records what it was asked to write."""

    def __init__(self, tmp_path: Path, rules: ApprovalPolicy) -> None:
        self.channel: ApprovalChannel | None = None
        self.written: list[tuple[str, bool, str]] = []
        self.refuse_rule: str | None = None
        self.approver = WorkspaceApprover(
            rules,
            AuditLog(tmp_path / "audit.jsonl"),
            lambda caller: self.channel if caller == "k1" and self.channel and self.channel.open else None,
            board=AskBoard(),
            session_of=lambda caller: "L1" if caller == "k1" else None,
            write_rule=self.write_rule,
            console=lambda: "http://127.0.0.1:1234/",
        )
        self.board = self.approver.board

    async def write_rule(
        self, ask: PendingAsk, accept: bool, by: str, choices: Mapping[str, str] | None
    ) -> None:
        if self.refuse_rule is not None:
            raise ValueError(self.refuse_rule)
        self.written.append((ask.call.tool, accept, by))

    async def next_ask(self) -> PendingAsk:
        for _ in range(500):
            if self.board.pending:
                return self.board.pending[0]
            await asyncio.sleep(0.01)
        raise AssertionError("no ask reached the board")


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path, policy())


async def test_an_ask_goes_to_a_console_that_is_open_and_its_answer_is_audited_with_who_and_scope(
    workspace: Workspace,
) -> None:
    with workspace.board.present("console"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        assert (ask.asked_of, ask.routes, ask.rule_id, ask.session) == (
            "console",
            ("console", "terminal"),
            "writes",
            "L1",
        )
        assert await workspace.approver.answer(ask.id, ROOT) is None
        assert await decision == Approved()
    entry = audited(workspace.approver)[-1]
    assert (entry["decision"], entry["decided_by"], entry["scope"], entry["by"]) == (
        "allow", "console", "once", "console (root)"
    )  # fmt: skip
    assert workspace.board.pending == []


async def test_a_refusal_from_a_person_says_who_refused_it(workspace: Workspace) -> None:
    with workspace.board.present("terminal"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        answer = AskAnswer(False, "once", "terminal", "terminal (alice on /dev/pts/3)")
        assert await workspace.approver.answer(ask.id, answer) is None
        outcome = await decision
    assert outcome == Rejected("the call fs.write_file was denied once by terminal (alice on /dev/pts/3)")


async def test_with_nobody_connected_the_refusal_lists_every_route_and_the_console(
    workspace: Workspace,
) -> None:
    outcome = await workspace.approver.decide(CALL)
    assert isinstance(outcome, NoOneToAsk)
    assert "nobody is connected to answer (no attached application, no MCP client with elicitation, " in (
        outcome.reason
    )
    assert "no open web console (http://127.0.0.1:1234/), no `ipybox approve`" in outcome.reason
    assert workspace.board.pending == []


async def test_a_session_answer_lets_later_calls_of_the_tool_run_without_asking_until_the_session_ends(
    workspace: Workspace,
) -> None:
    with workspace.board.present("console"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        await workspace.approver.answer(ask.id, AskAnswer(True, "session", "console", "console (root)"))
        assert await decision == Approved()
    # Nobody is present any more, and the same tool with other arguments runs: the session's grant.
    other = ToolCall("fs", "write_file", {"path": "out/b.md"}, caller="k1")
    assert await workspace.approver.decide(other) == Approved()
    entry = audited(workspace.approver)[-1]
    assert (entry["decided_by"], entry["scope"], entry["args"]) == (
        "session",
        "session",
        {"path": "out/b.md"},
    )
    # Another tool is asked again, and so is the same tool once the session ended.
    assert isinstance(await workspace.approver.decide(ToolCall("fs", "write_bytes", caller="k1")), NoOneToAsk)
    workspace.approver.forget_session("L1")
    assert isinstance(await workspace.approver.decide(other), NoOneToAsk)


async def test_a_session_answer_settles_every_waiting_ask_it_covers_at_once_and_says_how_many(
    tmp_path: Path,
) -> None:
    sessions = {"k1": "L1", "k2": "L1", "k3": "L2"}  # two kernels of one session, one of another
    approver = WorkspaceApprover(
        policy(), AuditLog(tmp_path / "audit.jsonl"), lambda caller: None, session_of=sessions.get
    )
    board = approver.board
    calls = [
        ToolCall("fs", "write_file", {"path": "a"}, caller="k1"),
        ToolCall("fs", "write_file", {"path": "b"}, caller="k1"),
        ToolCall("fs", "write_file", {"path": "c"}, caller="k2"),
        ToolCall("fs", "write_other", {"path": "d"}, caller="k1"),  # another tool: not covered
        ToolCall("fs", "write_file", {"path": "e"}, caller="k3"),  # another session: not covered
        ToolCall("shell", "pip", {"cmd": "pip install x"}, caller="k1"),
    ]
    with board.present("console"):
        decisions = [asyncio.create_task(approver.decide(call)) for call in calls]
        for _ in range(500):
            if len(board.pending) == len(calls):
                break
            await asyncio.sleep(0.01)
        first = board.pending[0]
        assert first.client is not None and first.client.session == "L1"
        answer = AskAnswer(True, "session", "console", "console (root)")
        assert await approver.answer(first.id, answer) is None
        assert board.settled_with(first.id) == 3
        assert [await decision for decision in decisions[:3]] == [Approved()] * 3
        waiting = {ask.call.args.get("path", ask.call.tool) for ask in board.pending}
        assert waiting == {"d", "e", "pip"}
        # The history the next ask shows counts the three, and names the session's answer.
        later = next(ask for ask in board.pending if ask.call.tool == "pip")
        pip_answer = AskAnswer(False, "once", "console", "console (root)")
        assert later.client is not None and (later.client.allowed, later.client.grants) == (0, [])
        assert await approver.answer(later.id, pip_answer) is None
        assert board.settled_with(later.id) == 1
        for ask in board.pending:
            board.close(ask, why="the test ends")
        await asyncio.gather(*decisions, return_exceptions=True)
    assert approver.grants.calls("L1") == (3, 2)
    ask = board.open(calls[0], approver.policy.decide(calls[0]), asked_of="console", routes=("console",))
    assert ask.client is None  # opened by hand: the approver builds it in `_ask`
    entries = audited(approver)
    assert [(e["args"].get("path"), e["scope"], e["by"]) for e in entries if e["decision"] == "allow"] == [
        ("a", "session", "console (root)"),
        ("b", "session", "console (root)"),
        ("c", "session", "console (root)"),
    ]


async def test_the_ask_of_a_session_names_its_client_and_shows_the_cell_the_host_registered(
    tmp_path: Path,
) -> None:
    started = datetime(2026, 12, 7, 23, 0, tzinfo=UTC)
    code = "# write the summary\nimport mcptools\nmcptools.fs.write_file.run(path='a')\n"
    sha = hashlib.sha256(code.encode()).hexdigest()
    approver = WorkspaceApprover(
        policy(),
        AuditLog(tmp_path / "audit.jsonl"),
        lambda caller: None,
        session_of=lambda caller: "L1",
        session_info=lambda session: ("Claude Code 2.1", started),
        cell_text_of=lambda session, digest: code if (session, digest) == ("L1", sha) else None,
    )
    reported = ToolCall("fs", "write_file", {"path": "a"}, caller="k1", cell=4, code=sha, line=3)
    lying = dataclasses.replace(reported, code="0" * 64, cell_text="print('harmless')\n", line=1)
    with approver.board.present("console"):
        decisions = [asyncio.create_task(approver.decide(call)) for call in (reported, lying)]
        for _ in range(500):
            if len(approver.board.pending) == 2:
                break
            await asyncio.sleep(0.01)
        verified, claimed = (AskView.of(ask) for ask in approver.board.pending)
        for decision in decisions:
            decision.cancel()
        await asyncio.gather(*decisions, return_exceptions=True)
    assert verified.client is not None and verified.client.title == "Claude Code 2.1"
    assert verified.client.started_at == "2026-12-07T23:00:00Z" and verified.session == "L1"
    assert verified.cell is not None and verified.cell.verified and verified.cell.line == 3
    assert [line.text for line in verified.cell.lines() if line.call] == [
        "mcptools.fs.write_file.run(path='a')"
    ]
    assert verified.rule_text == "rule 'writes': rule 'writes' applies"
    assert "Asked by Claude Code 2.1" in verified.text() and ">    3 | mcptools.fs" in verified.text()
    assert claimed.cell is not None and not claimed.cell.verified
    assert claimed.cell.source == "as reported by the kernel" and claimed.cell.partial


async def test_a_session_denial_refuses_later_calls_without_asking(workspace: Workspace) -> None:
    with workspace.board.present("console"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        await workspace.approver.answer(ask.id, AskAnswer(False, "session", "console", "console (root)"))
        await decision
    outcome = await workspace.approver.decide(CALL)
    assert outcome == Rejected("the call fs.write_file was denied for this session by console (root)")


async def test_an_always_answer_writes_the_rule_before_the_call_runs(workspace: Workspace) -> None:
    with workspace.board.present("console"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        assert (
            await workspace.approver.answer(ask.id, AskAnswer(True, "always", "console", "console (root)"))
            is None
        )
        assert await decision == Approved()
    assert workspace.written == [("write_file", True, "console (root)")]
    assert audited(workspace.approver)[-1]["scope"] == "always"


async def test_an_always_rule_that_would_not_load_is_refused_with_the_reason_and_the_ask_stays(
    workspace: Workspace,
) -> None:
    workspace.refuse_rule = "ipybox.toml:3:1: the rule would not load"
    with workspace.board.present("console"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        why = await workspace.approver.answer(ask.id, AskAnswer(True, "always", "console", "console (root)"))
        assert why == "ipybox.toml:3:1: the rule would not load"
        assert workspace.board.get(ask.id) is ask and not decision.done()
        assert await workspace.approver.answer(ask.id, ROOT) is None
        assert await decision == Approved()


async def test_the_first_answer_wins_and_a_late_one_is_told_who_answered(workspace: Workspace) -> None:
    with workspace.board.present("console"), workspace.board.present("terminal"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        assert await workspace.approver.answer(ask.id, ROOT) is None
        late = AskAnswer(False, "once", "terminal", "terminal (bob)")
        assert await workspace.approver.answer(ask.id, late) == "already allowed once by console (root)"
        assert await decision == Approved()


async def test_people_not_listed_in_ask_cannot_answer(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path, policy(ask=["terminal"]))
    with workspace.board.present("console"), workspace.board.present("terminal"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        assert ask.routes == ("terminal",)
        why = await workspace.approver.answer(ask.id, ROOT)
        assert why == 'the console does not answer this question ([approval] ask = ["terminal"])'
        await workspace.approver.answer(ask.id, AskAnswer(True, "once", "terminal", "t"))
        assert await decision == Approved()


async def test_an_unanswered_ask_times_out_denied_and_leaves_the_board_saying_so(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path, policy(ask_timeout=0.2))
    with workspace.board.present("console"), workspace.board.subscribe() as events:
        outcome = await workspace.approver.decide(CALL)
        assert outcome == Rejected("no answer within 0.2 s (rule 'writes' asks)")
        opened, closed = events.events.get_nowait(), events.events.get_nowait()
    assert isinstance(opened, AskOpened) and isinstance(closed, AskClosed)
    assert closed.answer is None and closed.why == "no answer within 0.2 s"
    assert audited(workspace.approver)[-1]["decided_by"] == "timeout"


async def test_a_call_that_goes_away_takes_its_ask_off_the_board(workspace: Workspace) -> None:
    with workspace.board.present("console"), workspace.board.subscribe() as events:
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        await workspace.next_ask()
        decision.cancel()
        with pytest.raises(asyncio.CancelledError):
            await decision
        assert workspace.board.pending == []
        events.events.get_nowait()
        closed = events.events.get_nowait()
    assert isinstance(closed, AskClosed) and closed.why == "the calling code went away"


async def test_each_command_of_a_shell_line_is_asked_with_the_command_as_its_subject(
    workspace: Workspace,
) -> None:
    line = ToolCall("ipybox", "shell", {"cmd": "ls && pip install a"}, caller="k1")
    with workspace.board.present("console"):
        decision = asyncio.create_task(workspace.approver.decide(line))
        ask = await workspace.next_ask()
        assert (ask.call.server, ask.call.tool, ask.subject) == ("shell", "pip", "`pip install a`")
        await workspace.approver.answer(ask.id, ROOT)
        assert await decision == Approved()


def test_explain_shows_the_deciding_rule_for_a_call_and_for_each_command_of_a_shell_line(
    workspace: Workspace,
) -> None:
    [(_call, verdict)] = workspace.approver.explain(ToolCall("fs", "write_file"))
    assert (verdict.decision, verdict.rule_id) == ("ask", "writes")
    parts = workspace.approver.explain(ToolCall("shell", "", {"cmd": "ls -l | pip install x"}))
    assert [(part.tool, verdict.decision, verdict.rule_id) for part, verdict in parts] == [
        ("ls", "allow", "ls"),
        ("pip", "ask", "pip"),
    ]


# --- the application asked, and a person answering first ---------------------------------------------


Decide = Callable[[ApprovalRequest], Awaitable[None]]


@pytest.fixture
async def attached(workspace: Workspace) -> AsyncIterator[Callable[[Decide, str], Awaitable[ApprovalClient]]]:
    """Attach an application to lease L1 over a real websocket, as `WorkspaceSession` does."""
    clients: list[ApprovalClient] = []

    async def serve(websocket: WebSocket) -> None:
        answers = websocket.query_params.get("answers", "application")
        channel = ApprovalChannel(True, 5, answers=answers)  # type: ignore[arg-type]
        workspace.channel = channel
        await channel.connect(websocket)

    async with serving({"/approval": serve}) as address:

        async def attach(decide: Decide, answers: str = "application") -> ApprovalClient:
            pauses: list[str] = []

            def pause() -> Callable[[], None]:
                pauses.append("paused")
                return lambda: pauses.append("resumed")

            client = ApprovalClient(decide, address=address, answers=answers, on_waiting=pause)  # type: ignore[arg-type]
            client.pauses = pauses  # type: ignore[attr-defined]
            await client.connect()
            clients.append(client)
            while workspace.channel is None or not workspace.channel.open:
                await asyncio.sleep(0.01)
            return client

        yield attach
        for client in clients:
            await client.disconnect()


async def test_the_attached_application_is_asked_first_and_its_answer_is_audited(
    workspace: Workspace, attached: Callable[[Decide, str], Awaitable[ApprovalClient]]
) -> None:
    async def accept(request: ApprovalRequest) -> None:
        await request.accept()

    await attached(accept, "application")
    assert await workspace.approver.decide(CALL) == Approved()
    entry = audited(workspace.approver)[-1]
    assert (entry["decided_by"], entry["scope"], entry["by"]) == ("application", "once", "the application")


async def test_a_person_answering_first_withdraws_the_applications_request(
    workspace: Workspace, attached: Callable[[Decide, str], Awaitable[ApprovalClient]]
) -> None:
    held: list[ApprovalRequest] = []
    settled = asyncio.Event()

    async def hold(request: ApprovalRequest) -> None:
        held.append(request)
        request.add_done_callback(lambda accepted: settled.set())

    await attached(hold, "application")
    with workspace.board.present("console"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        assert ask.asked_of == "application" and ask.routes == ("application", "console", "terminal")
        assert (
            await workspace.approver.answer(ask.id, AskAnswer(False, "once", "console", "console (root)"))
            is None
        )
        assert isinstance(await decision, Rejected)
        await asyncio.wait_for(settled.wait(), 5)
    [request] = held
    assert (request.decision, request.withdrawn_by) == (False, "console (root)")
    await request.accept()  # too late: the person's answer stands, and accepting does nothing
    assert request.decision is False


async def test_a_client_that_cannot_elicit_is_not_asked_but_its_clock_stops_while_a_person_decides(
    workspace: Workspace, attached: Callable[[Decide, str], Awaitable[ApprovalClient]]
) -> None:
    async def never(request: ApprovalRequest) -> None:
        raise AssertionError("a client that answers `none` gets no requests")

    client = await attached(never, "none")
    with workspace.board.present("console"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        assert ask.asked_of == "console"
        for _ in range(500):
            if client.pauses:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.01)
        assert client.pauses == ["paused"]  # type: ignore[attr-defined]
        await workspace.approver.answer(ask.id, ROOT)
        assert await decision == Approved()
        for _ in range(500):
            if len(client.pauses) == 2:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.01)
    assert client.pauses == ["paused", "resumed"]  # type: ignore[attr-defined]


async def test_the_console_listed_first_is_asked_before_the_application(
    tmp_path: Path,
) -> None:
    workspace = Workspace(tmp_path, policy(ask=["console", "application"]))
    workspace.channel = ApprovalChannel(True, 5, handler=_never_answers)
    with workspace.board.present("console"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        assert ask.asked_of == "console" and ask.routes == ("console",)
        await workspace.approver.answer(ask.id, ROOT)
        assert await decision == Approved()


async def _never_answers(request: ApprovalRequest) -> None:
    raise AssertionError("the application is not asked while the console, listed first, is open")


async def test_a_call_that_goes_away_while_the_application_is_asked_withdraws_the_applications_request(
    workspace: Workspace,
) -> None:
    held: list[ApprovalRequest] = []

    async def hold(request: ApprovalRequest) -> None:
        held.append(request)

    workspace.channel = ApprovalChannel(True, 5, handler=hold)
    decision = asyncio.create_task(workspace.approver.decide(CALL))
    ask = await workspace.next_ask()
    assert ask.asked_of == "application" and len(held) == 1
    decision.cancel()
    with pytest.raises(asyncio.CancelledError):
        await decision
    # Told before the call's cancellation reached its caller: nobody is left holding a question that is gone.
    [request] = held
    assert (request.decision, request.withdrawn_by) == (False, "")
    assert workspace.board.pending == []


async def test_asking_the_application_that_fails_leaves_the_ask_to_the_people_present(
    workspace: Workspace, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenChannel(ApprovalChannel):
        async def decide(self, call: ToolCall, **kwargs: Any) -> Approval:
            raise RuntimeError("a bug in asking the application")

    workspace.channel = BrokenChannel(True, 5, handler=_never_answers)
    with workspace.board.present("console"), caplog.at_level(logging.ERROR, logger="ipybox.approval"):
        decision = asyncio.create_task(workspace.approver.decide(CALL))
        ask = await workspace.next_ask()
        assert ask.asked_of == "application"
        assert await workspace.approver.answer(ask.id, ROOT) is None
        assert await decision == Approved()
    assert any(
        "asking the application about a call of fs.write_file failed" in record.getMessage()
        and record.exc_info is not None
        and "a bug in asking the application" in str(record.exc_info[1])
        for record in caplog.records
    )
