"""`AskBoard`: pending asks, answered at most once, their events for every subscriber, and who is present."""

from __future__ import annotations

import pytest

from ipybox.approval import asks
from ipybox.approval.ask_events import AskClosedMessage, AskOpenedMessage, message_of, parse_server_message
from ipybox.approval.asks import AskAnswer, AskBoard, AskClosed, AskOpened
from ipybox.rules import ToolCall, Verdict

CALL = ToolCall("fs", "write_file", {"path": "out/a.md"}, {"destructiveHint": True}, caller="k1")
VERDICT = Verdict("ask", "writes", "rule 'writes' applies")


def open_ask(board: AskBoard) -> asks.PendingAsk:
    return board.open(
        CALL, VERDICT, asked_of="console", routes=("console", "terminal"), session="L1", timeout=60
    )


async def test_an_ask_is_answered_once_and_a_late_answer_learns_who_was_first() -> None:
    board = AskBoard()
    ask = open_ask(board)
    first = AskAnswer(True, "session", "console", "console (root)")
    assert board.answer(ask.id, first)
    assert not board.answer(ask.id, AskAnswer(False, "once", "terminal", "t"))
    assert ask.answered.result() == first and board.pending == []
    assert board.closed_answer(ask.id) == (True, first)
    assert first.describe() == "allowed for this session by console (root)"


async def test_a_route_that_may_not_answer_is_refused() -> None:
    board = AskBoard()
    ask = board.open(CALL, VERDICT, asked_of="terminal", routes=("terminal",))
    assert not board.answer(ask.id, AskAnswer(True, "once", "console", "c"))
    assert board.get(ask.id) is ask


async def test_ask_ids_are_unguessable_and_distinct() -> None:
    board = AskBoard()
    ids = {open_ask(board).id for _ in range(100)}
    assert len(ids) == 100 and all(len(i.split("-", 1)[1]) >= 16 for i in ids)


async def test_a_subscriber_gets_what_was_pending_then_every_event_in_order() -> None:
    board = AskBoard()
    before = open_ask(board)
    with board.subscribe() as subscription:
        assert subscription.pending == [before]
        after = open_ask(board)
        board.close(before, why="no answer within 60 s")
        board.answer(after.id, AskAnswer(False, "once", "console", "console (root)"))
        events = [subscription.events.get_nowait() for _ in range(3)]
    assert [type(e) for e in events] == [AskOpened, AskClosed, AskClosed]
    assert isinstance(events[1], AskClosed) and events[1].why == "no answer within 60 s"
    assert isinstance(events[2], AskClosed) and events[2].answer is not None


async def test_a_subscriber_that_does_not_read_is_cut_off_instead_of_holding_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(asks, "MAX_QUEUED", 3)
    board = AskBoard()
    with board.subscribe() as subscription:
        for _ in range(10):
            open_ask(board)
        assert subscription.events.qsize() == 4  # three events, then the cut-off marker
        assert [subscription.events.get_nowait() for _ in range(4)][-1] is None


async def test_people_are_counted_while_present() -> None:
    board = AskBoard()
    with board.present("console"), board.present("console"):
        assert board.people("console") == 2 and board.people("terminal") == 0
    assert board.people("console") == 0


async def test_board_events_become_the_messages_approvers_parse_back() -> None:
    board = AskBoard()
    with board.subscribe() as subscription:
        ask = open_ask(board)
        board.answer(ask.id, AskAnswer(True, "always", "terminal", "terminal (alice)"))
        opened, closed = (message_of(subscription.events.get_nowait()) for _ in range(2))  # type: ignore[arg-type]
    parsed = parse_server_message(opened.to_json())
    assert isinstance(parsed, AskOpenedMessage)
    assert (parsed.ask.server, parsed.ask.tool, parsed.ask.args, parsed.ask.session) == (
        "fs", "write_file", {"path": "out/a.md"}, "L1"
    )  # fmt: skip
    assert parsed.ask.expires_at is not None and parsed.ask.call_text == "fs.write_file"
    closed_back = parse_server_message(closed.to_json())
    assert isinstance(closed_back, AskClosedMessage) and closed_back.answer is not None
    assert closed_back.answer.describe() == "allowed always by terminal (alice)"
