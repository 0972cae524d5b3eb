"""What a person asked about a call sees of its code and its client (`ipybox.approval.ask_context`), the
kernel's side of it (`cell_window_text`) and the host's checks of what the kernel sends (`run_call`): pure."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from ipybox.approval.ask_context import (
    MAX_CLIENT_NAME,
    MAX_GRANTS_SHOWN,
    WINDOW_AFTER,
    WINDOW_BEFORE,
    ClientView,
    cell_view,
    client_name,
)
from ipybox.approval.ask_events import AskView, settled_text
from ipybox.approval.asks import AskBoard
from ipybox.approval.grants import Grant, SessionGrants
from ipybox.in_kernel.tool_runner import cell_window_text
from ipybox.rules.calls import MAX_CELL_TEXT, ToolCall, Verdict
from ipybox.tool_server.call_channel import run_call


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


LONG = "\n".join(f"line_{number} = {number}" for number in range(1, 41))  # 40 lines


def test_a_short_cell_is_shown_whole_with_the_calls_line_marked_as_the_kernel_reported_it() -> None:
    text = "# ask before writing\nfs.write_file.run(path='a')"
    view = cell_view(ToolCall("fs", "write_file", cell=2, code=sha(text), line=2, cell_text=text))
    assert view is not None and view.window is None and not view.verified and not view.partial
    assert [(line.number, line.call) for line in view.lines(all_lines=False)] == [(1, False), (2, True)]
    assert view.source == "as reported by the kernel"


def test_a_long_cell_shows_a_window_around_the_call_and_everything_on_request() -> None:
    view = cell_view(ToolCall("fs", "w", code=sha(LONG), line=20, cell_text=LONG))
    assert view is not None and view.window == (20 - WINDOW_BEFORE, 20 + WINDOW_AFTER)
    shown = view.lines(all_lines=False)
    assert [line.number for line in shown] == list(range(20 - WINDOW_BEFORE, 20 + WINDOW_AFTER + 1))
    assert len(view.lines()) == 40
    near_end = cell_view(ToolCall("fs", "w", line=39, cell_text=LONG))
    assert near_end is not None and near_end.window == (39 - WINDOW_BEFORE, 40)


def test_the_hosts_own_text_is_verified_and_wins_over_the_kernels() -> None:
    view = cell_view(ToolCall("fs", "w", code=sha("real()"), line=1, cell_text="fake()"), known="real()")
    assert view is not None and view.verified and view.text == "real()"
    assert view.source == "verified: submitted through ipybox"


def test_a_line_outside_the_text_is_dropped_and_a_text_not_matching_its_hash_is_partial() -> None:
    view = cell_view(ToolCall("fs", "w", code=sha("a\nb"), line=7, cell_text="a\nb"))
    assert view is not None and view.line is None and view.window is None and not view.partial
    lied = cell_view(ToolCall("fs", "w", code=sha("other"), line=1, cell_text="a\nb"))
    assert lied is not None and lied.partial
    part = cell_view(ToolCall("fs", "w", line=12, cell_text="x\ny", cell_text_from=11))
    assert part is not None and part.partial and [line.number for line in part.lines()] == [11, 12]
    assert cell_view(ToolCall("fs", "w", line=3)) is None  # no text: no code to show


def test_the_kernel_sends_the_lines_around_the_call_of_a_cell_longer_than_the_cap() -> None:
    text = "\n".join(f"x{number} = '{'y' * 90}'" for number in range(1, 401))  # ~39 KB
    first, part = cell_window_text(text, 200, MAX_CELL_TEXT)
    lines = part.split("\n")
    assert len(part) <= MAX_CELL_TEXT and lines[200 - first].startswith("x200 =")
    assert first < 200 < first + len(lines) - 1  # lines on both sides of the call
    assert cell_window_text("short\ncell", 2, MAX_CELL_TEXT) == (1, "short\ncell")
    assert cell_window_text("z" * 100, 1, 10) == (1, "z" * 10)  # one line longer than the cap is cut


def test_the_host_keeps_only_well_formed_bounded_code_context_from_the_kernel() -> None:
    request = {"server": "fs", "tool": "w", "args": {}, "line": 3, "cell_text": "a", "cell_text_from": 2}
    call = run_call(request)
    assert (call.line, call.cell_text, call.cell_text_from) == (3, "a", 2)
    bad = run_call({**request, "line": True, "cell_text": "a" * (MAX_CELL_TEXT + 1), "cell_text_from": -1})
    assert (bad.line, bad.cell_text, bad.cell_text_from) == (None, None, 1)
    assert run_call({**request, "line": 2**40, "cell_text": 5}).line is None


def test_a_clients_name_is_one_printable_bounded_line() -> None:
    assert client_name("Claude\x1b[31m Code\n2.1") == "Claude [31m Code 2.1"
    assert client_name("n" * 500) == "n" * MAX_CLIENT_NAME
    assert client_name(" \x00 ") is None and client_name(None) is None


def test_a_clients_history_says_when_it_started_its_calls_and_its_session_answers() -> None:
    at = datetime(2026, 12, 7, 23, 0, tzinfo=UTC)
    grants = {("fs", f"t{n}"): Grant(n % 2 == 0, "console (root)", at) for n in range(MAX_GRANTS_SHOWN + 2)}
    view = ClientView.of("0123456789abcdef", "Cursor 1.0", at, (4, 1), grants)
    assert view.session == "01234567" and view.title == "Cursor 1.0"
    history = view.history()
    assert history.startswith("started 2026-12-07 23:00:00 UTC; 5 calls so far (4 allowed, 1 denied); ")
    assert "for this session: allowed fs.t0 (by console (root)); denied fs.t1" in history
    assert history.endswith(", and 2 more")
    unnamed = ClientView.of("feed", None, None, (0, 0), {})
    assert unnamed.title == "session feed" and unnamed.history() == "0 calls so far"


def test_grants_cover_the_same_tool_of_the_same_session_and_count_its_calls() -> None:
    call = ToolCall("shell", "pip", {"cmd": "pip install a"})
    assert SessionGrants.covers("L1", call, "L1", ToolCall("shell", "pip", {"cmd": "pip list"}))
    assert not SessionGrants.covers("L1", call, "L2", call)
    assert not SessionGrants.covers("L1", call, "L1", ToolCall("shell", "npm"))
    grants = SessionGrants()
    grants.tally("L1", True)
    grants.tally("L1", False)
    grants.tally(None, True)
    assert grants.calls("L1") == (1, 1) and grants.calls("L2") == (0, 0)
    grants.forget("L1")
    assert grants.calls("L1") == (0, 0)


async def test_the_board_says_how_many_asks_an_answer_settled() -> None:
    board = AskBoard()
    verdict = Verdict("ask", "r", "rule 'r' applies", tier="system", explanation="writes need a person")
    ask = board.open(ToolCall("fs", "w"), verdict, asked_of="console", routes=("console",))
    view = AskView.of(ask)
    assert (view.tier, view.explanation, view.provenance) == ("system", "writes need a person", {})
    assert view.rule_text == "rule 'r' (system admin policy): writes need a person (rule 'r' applies)"
    assert board.settled_with(ask.id) == 0
    board.close(ask, why="gone")
    assert board.settled_with(ask.id) == 0  # withdrawn, not answered
    assert settled_text(True, 3) == "Allowed for this session: settled 3 waiting calls"
    assert settled_text(False, 1) == "Denied for this session: settled 1 waiting call"


def test_the_kernel_sends_a_cells_text_with_its_first_call_and_each_calls_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    import ipybox.in_kernel.tool_runner as runner

    shell = InteractiveShell()
    for name, value in (("_shell", shell), ("_cell_seen", None), ("_cell_text", None), ("_text_sent", None)):
        monkeypatch.setattr(runner, name, value)
    monkeypatch.setattr(runner, "install", lambda shell: None, raising=False)
    code = (
        "import ipybox.in_kernel.tool_runner as runner\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "def context():\n"
        "    runner._cell()\n"
        "    return runner._cell_context()\n"
        "first, second = context(), context()\n"
        "with ThreadPoolExecutor(1) as pool:\n"
        "    threaded = pool.submit(lambda: context()).result()\n"
    )
    result = shell.run_cell(code, store_history=True)
    assert result.error_in_exec is None
    first, second, threaded = (shell.user_ns[name] for name in ("first", "second", "threaded"))
    assert first == {"line": 5, "cell_text": code.rstrip("\n")}  # as IPython's history keeps it
    assert second == {"line": 5} and threaded == {"line": 5}  # the text went with the first call
