"""`WorkspaceApprover.ask_host`: the proxy's question about a host no `allowedDomains` entry covers goes to
the people on the board (console, `ipybox approve`) as the call `ipybox.network` with a subject; nobody
present refuses at once; no answer in `ask_timeout` refuses; "for this session" needs no lease; `always`
goes to `write_domain`; every decision is audited."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from ipybox.approval.asks import AskAnswer, AskBoard, PendingAsk
from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.rules import ApprovalPolicy, AuditLog
from ipybox.sandbox.host_asks import HostQuestion

QUESTION = HostQuestion("api.example.com", 443, "CONNECT")


def approver(
    tmp_path: Path, written: list[tuple[str, bool, str]], ask_timeout: float = 5
) -> WorkspaceApprover:
    async def write_domain(host: str, accept: bool, by: str) -> None:
        written.append((host, accept, by))

    return WorkspaceApprover(
        ApprovalPolicy.model_validate({"ask_timeout": ask_timeout}),
        AuditLog(tmp_path / "audit.jsonl"),
        lambda caller: None,
        board=AskBoard(),
        write_domain=write_domain,
        console=lambda: "http://127.0.0.1:1234/",
    )


def audited(approver: WorkspaceApprover) -> list[dict[str, Any]]:
    return [json.loads(line) for line in approver.audit.path.read_text().splitlines()]


async def next_ask(board: AskBoard) -> PendingAsk:
    for _ in range(500):
        if board.pending:
            return board.pending[0]
        await asyncio.sleep(0.01)
    raise AssertionError("no ask reached the board")


async def test_with_nobody_present_the_host_is_refused_at_once(tmp_path: Path) -> None:
    workspace = approver(tmp_path, [])
    started = time.monotonic()
    answer = await workspace.ask_host(QUESTION)
    assert time.monotonic() - started < 1 and not answer.allow
    assert "nobody is connected to answer" in answer.why and "http://127.0.0.1:1234/" in answer.why
    assert workspace.board.pending == [] and audited(workspace)[-1]["decision"] == "deny"


async def test_a_person_answers_for_the_session_without_a_lease_and_always_writes_the_host(
    tmp_path: Path,
) -> None:
    written: list[tuple[str, bool, str]] = []
    workspace = approver(tmp_path, written)
    with workspace.board.present("terminal"):
        asking = asyncio.ensure_future(workspace.ask_host(QUESTION))
        ask = await next_ask(workspace.board)
        assert (ask.call.server, ask.call.tool) == ("ipybox", "network")
        assert ask.call.args == {"host": "api.example.com", "port": 443, "method": "CONNECT"}
        assert ask.subject == "connect to api.example.com:443" and ask.session is None
        assert (
            await workspace.answer(ask.id, AskAnswer(True, "session", "terminal", "terminal (alice)")) is None
        )
        answer = await asking
        assert answer.allow and answer.scope == "session" and "terminal (alice)" in answer.why

        asking = asyncio.ensure_future(workspace.ask_host(QUESTION))
        ask = await next_ask(workspace.board)
        assert (
            await workspace.answer(ask.id, AskAnswer(False, "always", "terminal", "terminal (alice)")) is None
        )
        answer = await asking
        assert not answer.allow and answer.scope == "always"
    assert written == [("api.example.com", False, "terminal (alice)")]
    entries = audited(workspace)
    assert [entry["decision"] for entry in entries] == ["allow", "deny"]


async def test_no_answer_within_the_ask_timeout_refuses(tmp_path: Path) -> None:
    workspace = approver(tmp_path, [], ask_timeout=0.3)
    with workspace.board.present("console"):
        answer = await workspace.ask_host(QUESTION)
    assert not answer.allow and answer.why == "nobody answered within 0.3 s"
    assert workspace.board.pending == []
