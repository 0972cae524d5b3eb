"""`ipybox approve` and `ipybox console`: what the approver shows and what each key does (no processes),
then the command in a real terminal (tmux) answering a running workspace's asks raised by a kernel."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ipybox import CodeExecutor
from ipybox.approval.ask_events import (
    AnswerResult,
    AnswerView,
    AskClosedMessage,
    AskOpenedMessage,
    AskView,
)
from ipybox.approval.asks import Scope
from ipybox.cli.approve import (
    CLEAR_BELOW,
    CLEAR_LINE,
    HELP,
    MAX_ARG_LINES,
    SCREEN_HOME,
    SETTLE_S,
    Approvals,
    Output,
    Send,
    format_args,
    rule_preview,
    short_id,
    time_left,
)
from ipybox.display_text import printable
from ipybox.running.approvers import ApproverConnection
from ipybox.running.state import read_state
from tests.cli.test_main import IPYBOX, ipybox
from tests.running.test_approvers import make_terminal_workspace, next_opened, slow_call

NOW = datetime(2026, 11, 24, 7, 0, 0, tzinfo=UTC)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def view(serial: int, tool: str = "slow", *, timeout: float | None = 45, **fields: Any) -> AskView:
    values: dict[str, Any] = {
        "id": f"{serial}-secretpart{serial}",
        "server": "edge",
        "tool": tool,
        "args": {"seconds": 0},
        "rule_id": "ask-slow",
        "reason": "rule 'ask-slow' applies",
        "session": "1f2e3d4c",
        "routes": ["terminal"],
        "asked_at": iso(NOW),
        "expires_at": iso(NOW + timedelta(seconds=timeout)) if timeout is not None else None,
    }
    values.update(fields)
    return AskView(**values)


def opened(approvals: Approvals, *asks: AskView) -> None:
    for ask in asks:
        approvals.opened(AskOpenedMessage(ask=ask), NOW)


def approvals_with(*asks: AskView) -> Approvals:
    """Approvals whose keys answer at once (the settle time has its own tests)."""
    approvals = Approvals("/ws", "alice on /dev/pts/3", settle_s=0)
    opened(approvals, *asks)
    return approvals


def screen_text(approvals: Approvals, height: int = 50) -> str:
    return "\n".join(approvals.screen(NOW, height))


# -- keys


def test_each_answer_key_answers_the_oldest_ask_with_its_scope() -> None:
    expected: dict[str, tuple[bool, Scope]] = {
        "y": (True, "once"),
        "s": (True, "session"),
        "n": (False, "once"),
        "d": (False, "session"),
    }
    for key, (accept, scope) in expected.items():
        approvals = approvals_with(view(1), view(2))
        reaction = approvals.key(key, NOW)
        assert reaction.send == Send("1-secretpart1", accept, scope)
        assert not reaction.quit


def test_always_answers_wait_for_the_same_key_again() -> None:
    for key, accept in (("a", True), ("D", False)):
        approvals = approvals_with(view(1))
        first = approvals.key(key, NOW)
        assert first.send is None
        assert "adds a rule to ipybox.toml" in first.log[0] and f"Press {key} again" in first.log[0]
        assert approvals.key(key, NOW).send == Send("1-secretpart1", accept, "always")


def test_always_previews_the_rule_from_the_workspaces_file_and_star_switches_to_any_arguments(
    tmp_path: Path,
) -> None:
    (tmp_path / "ipybox.toml").write_text(
        '[[approval.rules]]\nid = "ask-slow"\nserver = "edge"\ntool = "slow"\ndecision = "ask"\n'
    )
    approvals = Approvals("/ws", "alice", settle_s=0, preview=rule_preview(tmp_path, "alice"))
    opened(approvals, view(1))
    first = "\n".join(approvals.key("a", NOW).log)
    assert "always allow edge.slow? This adds to ipybox.toml a rule that matches calls whose" in first
    assert "  args = { seconds = 0 }" in first and "* switches to any value for every argument" in first
    widened = "\n".join(approvals.key("*", NOW).log)
    assert (
        "a rule that matches calls with ANY arguments" in widened
        and "args = {" not in widened.split("match")[0]
    )
    back = "\n".join(approvals.key("*", NOW).log)
    assert "  args = { seconds = 0 }" in back
    assert approvals.key("a", NOW).send == Send("1-secretpart1", True, "always", {"seconds": "exact"})
    assert (tmp_path / "ipybox.toml").read_text().count("[[approval.rules]]") == 1, "a preview writes nothing"


def test_an_always_answer_that_cannot_be_written_says_why_before_asking_to_confirm(tmp_path: Path) -> None:
    approvals = Approvals("/ws", "alice", settle_s=0, preview=rule_preview(tmp_path, "alice"))
    opened(approvals, view(1))
    reaction = approvals.key("a", NOW)
    assert reaction.log[0].startswith("always allow edge.slow: no rule was written into ")
    assert "there is no such file" in reaction.log[0] and approvals.confirming is None


def test_any_other_key_cancels_an_always_answer() -> None:
    approvals = approvals_with(view(1))
    approvals.key("a", NOW)
    cancelled = approvals.key("y", NOW)
    assert cancelled.send is None and cancelled.log == ["cancelled: nothing was answered"]
    assert approvals.key("a", NOW).send is None  # asks to confirm again, from the start


def test_q_quits_and_question_mark_shows_the_keys() -> None:
    approvals = approvals_with(view(1))
    assert approvals.key("q", NOW).quit
    help_shown = approvals.key("?", NOW)
    assert help_shown.log == list(HELP) and help_shown.send is None
    assert "always allow" in screen_text(approvals)


def test_an_unknown_key_says_which_keys_answer() -> None:
    approvals = approvals_with(view(1))
    reaction = approvals.key("x", NOW)
    assert reaction.send is None
    assert reaction.log == ["unknown key x: one of y s a n d D answers, v views, ? helps, q quits"]
    assert "one of y s a n d D" in approvals.key("yes", NOW).log[0]  # line mode: one key per line


def test_answer_keys_without_an_ask_say_none_is_waiting() -> None:
    approvals = approvals_with()
    assert approvals.key("y", NOW).log == ["no ask is waiting"]
    assert "no ask is waiting" in screen_text(approvals)
    assert approvals.prompt(NOW) == "waiting for asks (q quits)"


def test_keys_wait_while_an_answer_is_on_its_way() -> None:
    approvals = approvals_with(view(1), view(2))
    approvals.key("y", NOW)
    again = approvals.key("n", NOW)
    assert again.send is None and "still waiting for the workspace" in again.log[0]
    assert approvals.prompt(NOW) == "answering #1..."


class Clock:
    """Monotonic seconds that a test moves on."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_within_half_a_second_of_a_new_ask_answers_nothing_and_says_it_changed() -> None:
    clock = Clock()
    approvals = Approvals("/ws", "alice", clock=clock)
    assert approvals.settle_s == SETTLE_S == 0.5
    opened(approvals, view(1))
    clock.now += 5  # ask #1 has been read
    assert approvals.settling() == 0
    # The kernel withdraws #1 and puts up #2; the person's `y` (meant for #1) lands 150 ms later.
    approvals.closed(AskClosedMessage(id="1-secretpart1", why="the calling code went away"), NOW)
    opened(approvals, view(2, "write_file", args={"path": "/root/.bashrc"}))
    clock.now += 0.15
    late = approvals.key("y", NOW)
    assert late.send is None
    assert late.log[0].startswith("the ask changed: look again")
    assert "the ask changed: look again" in screen_text(approvals)
    assert screen_text(approvals).splitlines()[-1].startswith("read #2 first")
    clock.now += 0.35
    assert approvals.settling() == 0 and approvals.prompt(NOW).startswith("answer #2 [")
    assert approvals.key("n", NOW).send == Send("2-secretpart2", False, "once")


def test_every_change_of_the_ask_shown_restarts_the_settle_time() -> None:
    clock = Clock()
    approvals = Approvals("/ws", "alice", clock=clock)
    opened(approvals, view(1), view(2))
    assert approvals.key("y", NOW).send is None  # #1 just appeared
    clock.now += 0.5
    assert approvals.key("y", NOW).send == Send("1-secretpart1", True, "once")
    approvals.result(AnswerResult(id="1-secretpart1", ok=True), NOW)  # #2 is shown now
    clock.now += 0.1
    assert approvals.key("y", NOW).send is None  # a double press does not answer #2 unread
    clock.now += 0.5
    approvals.key("a", NOW)  # always: pressed twice; #2 replaced between the two presses
    approvals.closed(AskClosedMessage(id="2-secretpart2", why="timed out"), NOW)
    opened(approvals, view(3))
    assert approvals.key("a", NOW).send is None
    clock.now += 0.5
    approvals.shown_again()  # back from the pager: read afresh
    assert approvals.key("y", NOW).send is None
    opened(approvals, view(4))  # another ask waiting behind the one shown changes nothing
    clock.now += 0.5
    assert approvals.key("y", NOW).send == Send("3-secretpart3", True, "once")


def test_v_shows_every_argument_whole_and_the_folded_screen_says_so() -> None:
    content = "\n".join(f"line {i} of the file" for i in range(1, 175))
    ask = view(1, "write_file", args={"path": "a" * 400, "content": content})
    approvals = approvals_with(ask)
    shown = screen_text(approvals)
    assert "line 174 of the file" not in shown
    assert "(folded: v shows the arguments in full)" in shown
    reaction = approvals.key("v", NOW)
    assert reaction.send is None and reaction.view is not None
    assert reaction.view[0] == "ask #1: edge.write_file, all arguments:"
    assert f'path: "{"a" * 400}"' in reaction.view
    assert [line for line in reaction.view if line.startswith("  | ")] == [
        f"  | line {i} of the file" for i in range(1, 175)
    ]
    short = approvals_with(view(2, args={"seconds": 0}))
    assert "folded" not in screen_text(short)
    assert approvals_with().key("v", NOW).log == ["no ask is waiting"]


# -- the workspace's events


def test_an_accepted_answer_moves_on_to_the_next_ask() -> None:
    approvals = approvals_with(view(1), view(2))
    approvals.key("y", NOW)
    approvals.result(AnswerResult(id="1-secretpart1", ok=True), NOW)
    current = approvals.current
    assert current is not None and current.id == "2-secretpart2"
    closed = approvals.closed(
        AskClosedMessage(
            id="1-secretpart1",
            answer=AnswerView(accept=True, scope="once", route="terminal", by="terminal (alice)"),
        ),
        NOW,
    )
    assert closed.log[0].endswith("#1 edge.slow: allowed once by terminal (alice)")
    assert "ask #2: edge.slow" in closed.log[1]
    assert approvals.key("y", NOW).send == Send("2-secretpart2", True, "once")


def test_an_ask_answered_elsewhere_leaves_the_screen_with_who_answered() -> None:
    approvals = approvals_with(view(1, args={"path": "out/a.md"}), view(2, "echo"))
    assert "out/a.md" in screen_text(approvals)
    approvals.key("a", NOW)  # a confirmation pending for the ask withdrawn is dropped with it
    answer = AnswerView(accept=False, scope="session", route="console", by="console (root)")
    approvals.closed(AskClosedMessage(id="1-secretpart1", answer=answer), NOW)
    shown = screen_text(approvals)
    assert "out/a.md" not in shown and "ask #1" not in shown
    assert "#1 edge.slow: denied for this session by console (root)" in shown
    assert "ask #2: edge.echo" in shown
    assert approvals.confirming is None
    assert approvals.key("a", NOW).send is None  # the first `a` for the new ask asks to confirm


def test_a_withdrawn_ask_says_why() -> None:
    approvals = approvals_with(view(1))
    reaction = approvals.closed(AskClosedMessage(id="1-secretpart1", why="no answer within 60 s"), NOW)
    assert reaction.log[0].endswith("#1 edge.slow: withdrawn (no answer within 60 s)")
    assert approvals.current is None


def test_a_refused_answer_is_shown_and_the_ask_stays() -> None:
    approvals = approvals_with(view(1))
    approvals.key("a", NOW)
    assert approvals.key("a", NOW).send is not None
    error = "the rule would not load: ipybox.toml:12:1: duplicate rule id 'ask-slow'"
    reaction = approvals.result(AnswerResult(id="1-secretpart1", ok=False, error=error), NOW)
    assert reaction.log == [f"#1 was not answered: {error} (it is still waiting)"]
    assert error in screen_text(approvals)
    assert approvals.current is not None and approvals.key("y", NOW).send is not None


def test_events_for_asks_never_seen_are_ignored() -> None:
    approvals = approvals_with(view(1))
    assert approvals.closed(AskClosedMessage(id="9-unknown"), NOW).log == []
    assert approvals.result(AnswerResult(id="9-unknown", ok=False, error="gone"), NOW).log == [
        "#9 was not answered: gone"
    ]


# -- what is shown


def test_the_screen_shows_the_call_why_it_asks_and_the_time_left() -> None:
    ask = view(
        3,
        "write_file",
        server="filesystem",
        args={"path": "out/a.md", "content": "hello"},
        annotations={"destructiveHint": True},
        asked_of="application",
        routes=["application", "terminal"],
    )
    shown = screen_text(approvals_with(ask, view(4), view(5)))
    assert "ask #3: filesystem.write_file" in shown
    assert "session 1f2e3d4c" in shown and "45 s left, then it is denied" in shown
    assert "asked by rule 'ask-slow': rule 'ask-slow' applies" in shown
    assert "also asked of the application: the first answer counts" in shown
    assert "annotations: destructiveHint=true" in shown
    assert 'path: "out/a.md"' in shown and 'content: "hello"' in shown
    assert "also waiting (2):" in shown and "#4 edge.slow" in shown
    assert shown.splitlines()[-1] == "answer #3 [y s a n d D v ? q] (45 s left, 2 more waiting)"
    assert "secretpart" not in shown  # the ids' unguessable part is not shown


def test_a_shell_command_is_shown_as_the_command() -> None:
    ask = view(1, "run", server="shell", subject="rm -rf build", rule_id=None, reason="no rule applies")
    shown = screen_text(approvals_with(ask))
    assert "ask #1: rm -rf build  (a shell command, run by shell.run)" in shown
    assert "asked by the default decision: no rule applies" in shown


def test_an_ask_the_terminal_cannot_answer_says_so() -> None:
    shown = screen_text(approvals_with(view(1, routes=["console"])))
    assert '[approval] ask in ipybox.toml does not list "terminal"' in shown


def test_time_left_counts_down_to_zero_or_is_unlimited() -> None:
    ask = view(1, timeout=150)
    assert time_left(ask, NOW) == 150
    assert time_left(ask, NOW + timedelta(seconds=200)) == 0
    assert time_left(view(2, timeout=None), NOW) is None
    assert "2 min 30 s left" in screen_text(approvals_with(ask))
    assert "60 s left" in screen_text(approvals_with(view(3, timeout=60)))
    assert "no time limit" in screen_text(approvals_with(view(2, timeout=None)))


def test_the_screen_fits_the_terminal_and_keeps_the_prompt() -> None:
    many = {f"arg{i}": i for i in range(100)}
    approvals = approvals_with(view(1, args=many))
    for height in (50, 24, 12, 5):
        lines = approvals.screen(NOW, height)
        assert len(lines) <= height
        assert lines[-1].startswith("answer #1")
    tall = "\n".join(approvals.screen(NOW, 50))
    assert "more lines)" in tall and "y allow once" in tall


def test_line_mode_describes_each_ask_once_when_it_is_next() -> None:
    approvals = Approvals("/ws", "alice")
    first = approvals.opened(AskOpenedMessage(ask=view(1)), NOW)
    assert first.log[0] == "ask #1: edge.slow" and first.log[-1] == "  answer #1: [y s a n d D v ? q]"
    assert approvals.opened(AskOpenedMessage(ask=view(2)), NOW).log == []  # shown when it is next
    closed = approvals.closed(AskClosedMessage(id="1-secretpart1", why="timed out"), NOW)
    assert closed.log[1] == "ask #2: edge.slow"


def test_short_ids_are_the_boards_serial() -> None:
    assert short_id("12-Yc9Zx") == "#12"


# -- arguments


def test_long_string_values_are_folded_with_their_length() -> None:
    lines = format_args({"text": "x" * 1000, "nested": {"deep": ["y" * 500]}})
    assert lines[0] == 'text: "' + "x" * 160 + '... (1,000 characters)"'
    assert any(line.strip() == '"' + "y" * 160 + '... (500 characters)"' for line in lines)


def test_multi_line_strings_show_their_first_lines() -> None:
    lines = format_args({"code": "\n".join(f"line {i}" for i in range(20))})
    assert lines[0] == "code: (20 lines, 149 characters)"
    assert lines[1:3] == ["  | line 0", "  | line 1"]
    assert lines[-1] == "  | ... (14 more lines)"


def test_arguments_beyond_the_limit_are_counted() -> None:
    lines = format_args({f"a{i}": i for i in range(100)})
    assert len(lines) == MAX_ARG_LINES
    assert lines[-1] == f"... ({100 - MAX_ARG_LINES + 1} more lines)"
    assert format_args({}) == ["(no arguments)"]


def test_control_and_bidi_characters_are_escaped() -> None:
    assert printable("a\x1b[31mb\rc\x07d\x9b2J\u202eevil\u2028x\tz") == (
        "a\\x1b[31mb\\x0dc\\x07d\\x9b2J\\u202eevil\\u2028x\\x09z"
    )
    assert printable("Grüße, 東京 ✓") == "Grüße, 東京 ✓"


def test_nothing_in_an_ask_reaches_the_terminal_as_an_escape_sequence() -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J\u202e\x9b31m"
    ask = view(
        1,
        server="srv\x1b[5m",
        tool="t\r",
        args={hostile: hostile, "lines": f"a\n{hostile}\nb"},
        annotations={"x\x1b": hostile},
        rule_id=hostile,
        reason=hostile,
        subject=None,
    )
    approvals = approvals_with(ask)
    approvals.result(AnswerResult(id="1-secretpart1", ok=False, error=hostile), NOW)
    for live in (True, False):
        stream = io.StringIO()
        output = Output(stream, live=live)
        if live:
            output.draw(approvals, NOW)
        else:
            output.log(approvals.screen(NOW, 80))
        written = stream.getvalue()
        if live:  # only our own sequences: home, clear to the end of a line, clear below
            assert written.startswith(SCREEN_HOME) and written.endswith(CLEAR_LINE + CLEAR_BELOW)
            for ours in (SCREEN_HOME, CLEAR_LINE, CLEAR_BELOW, "\r\n"):
                written = written.replace(ours, "\n")
        assert not any(char in written for char in "\x1b\x07\x9b\u202e\r")
        assert "\\x1b]0;owned\\x07" in written


# -- the command, in a real terminal, against a running workspace


TAG = "cli-approve"


class Pane:
    """`ipybox approve` (or any command) in a detached 160x50 tmux session on a private tmux server."""

    def __init__(self, command: str) -> None:
        # A private server on a socket of our own (removed with it), not the user's tmux.
        self.socket_dir = Path(tempfile.mkdtemp(prefix="ipybox-tmux-"))
        self.socket = self.socket_dir / "tmux.sock"
        # The pane stays after the command ends (`remain-on-exit`), so its last words can be read.
        self.tmux("new-session", "-d", "-x", "160", "-y", "50", "-s", "t", command)
        self.tmux("set-option", "-t", "t", "remain-on-exit", "on")

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", str(self.socket), "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    async def text(self, history: bool = False) -> str:
        """What the pane shows (`history`: with the lines scrolled off its top: a terminal resized while
        in the alternate screen may scroll the command's last words up)."""
        scrolled = ("-S", "-") if history else ()
        return await asyncio.to_thread(self.tmux, "capture-pane", "-p", *scrolled, "-t", "t")

    async def wait_for(self, condition: Callable[[str], bool], what: str, timeout: float = 60) -> str:
        """The pane's text once `condition` holds for it (the loop keeps running: a kernel's call may be
        what the pane waits for)."""
        deadline = time.monotonic() + timeout
        while True:
            text = await self.text()
            if condition(text):
                return text
            assert time.monotonic() < deadline, f"the pane never showed {what}:\n{text}"
            await asyncio.sleep(0.02)

    async def shows(self, needle: str, timeout: float = 60) -> str:
        return await self.wait_for(lambda text: needle in text, repr(needle), timeout)

    async def last_words(self, timeout: float = 60) -> str:
        """Everything the pane showed, once its command has ended."""
        deadline = time.monotonic() + timeout
        while await asyncio.to_thread(self.tmux, "display-message", "-p", "-t", "t", "#{pane_dead}") != "1\n":
            assert time.monotonic() < deadline, f"the command never ended:\n{await self.text()}"
            await asyncio.sleep(0.02)
        return await self.text(history=True)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def kill(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.tmux("kill-server")
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def approve_command(workspace: Path) -> str:
    # After it exits: its status, and whether the terminal is back in canonical mode with echo.
    return (
        f'{shlex.quote(str(IPYBOX))} approve {shlex.quote(str(workspace))}; echo "exit $?"; '
        "stty -a | tr ' ' '\\n' | grep -x -e '-\\?icanon' -e '-\\?echo' | tr '\\n' ' '"
    )


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    workspace = make_terminal_workspace(tmp_path_factory.mktemp("approve"), TAG)
    up = ipybox("up", "-d", str(workspace))
    assert up.returncode == 0, up.stderr
    yield workspace
    ipybox("down", str(workspace))


@pytest.fixture
async def pane(running: Path) -> AsyncIterator[Pane]:
    pane = Pane(approve_command(running))
    try:
        await pane.shows("waiting for asks (q quits)")
        yield pane
    finally:
        pane.kill()


def audit(workspace: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (workspace / ".ipybox" / "audit.jsonl").read_text().splitlines()]


async def answerable(pane: Pane, number: str | None = None) -> str:
    """The pane once the ask shown (`#N`, if given) takes keys: its prompt `answer #N [...]` appears when
    it has been on the screen for the settle time."""
    pattern = re.compile(rf"^answer {re.escape(number) if number else '#[0-9]+'} \[", re.M)
    return await pane.wait_for(
        lambda text: pattern.search(text) is not None, f"ask {number or ''} taking keys"
    )


def ask_on_screen(text: str) -> str | None:
    """The `#N` of the ask the pane shows, if any."""
    for line in text.splitlines():
        if line.startswith("ask #"):
            return line.split(":", 1)[0].removeprefix("ask ")
    return None


@pytest.mark.integration
async def test_y_lets_a_kernels_call_run_and_n_rejects_it(running: Path, pane: Pane) -> None:
    async with CodeExecutor(workspace=running) as kernel:
        for key, expected in (("y", "slept 0.0"), ("n", "rejected: edge.slow was rejected")):
            call = asyncio.create_task(kernel.execute(slow_call()))
            text = await pane.shows("ask #")
            assert "edge.slow" in text and "asked by rule 'ask-slow'" in text and "seconds: 0" in text
            assert "y allow once" in text
            await answerable(pane, ask_on_screen(text))
            pane.keys(key)
            result = await call
            assert result.text is not None and result.text.startswith(expected)
            number = ask_on_screen(text)
            verb = "allowed" if key == "y" else "denied"
            await pane.shows(f"{number} edge.slow: {verb} once by terminal (")
    last = audit(running)[-1]
    assert (last["decision"], last["decided_by"], last["scope"]) == ("deny", "terminal", "once")


THREE_CALLS = """\
# three calls of edge.slow at once, from threads of this cell
from concurrent.futures import ThreadPoolExecutor
from mcptools.edge import slow
with ThreadPoolExecutor(3) as pool:
    results = list(pool.map(lambda s: slow.run(slow.Params(seconds=s)), [0.0, 0.0, 0.0]))
print(results)"""


@pytest.mark.integration
async def test_s_allows_the_tools_next_calls_in_the_session_without_asking(running: Path, pane: Pane) -> None:
    async with CodeExecutor(workspace=running, client="report-writer 1.0") as kernel:
        # Three concurrent calls of the tool in one session: the screen shows the client, its history and
        # the cell with the call's line; one `s` settles all three, and says so.
        call = asyncio.create_task(kernel.execute(THREE_CALLS))
        text = await pane.shows("2 more waiting")
        assert "from report-writer 1.0 (session " in text
        assert "history: started " in text and "0 calls so far" in text
        assert re.search(
            r"code of cell \d+ \(verified: submitted through ipybox\), the call on line 5:", text
        )
        assert ">    5 |     results = list(pool.map(lambda s: slow.run(" in text
        assert "     1 | # three calls of edge.slow at once, from threads of this cell" in text
        await answerable(pane)
        pane.keys("s")
        assert (await call).text == "['slept 0.0', 'slept 0.0', 'slept 0.0']"
        text = await pane.shows("Allowed for this session: settled 3 waiting calls")
        text = await pane.shows("allowed for this session by terminal (")
        again = await kernel.execute(slow_call(0.01))
        assert again.text == "slept 0.01"
        assert ask_on_screen(await pane.text()) is None and "no ask is waiting" in text
    last = audit(running)[-1]
    assert (last["tool"], last["args"], last["decision"], last["decided_by"]) == (
        "slow",
        {"seconds": 0.01},
        "allow",
        "session",
    )


@pytest.mark.integration
async def test_an_ask_answered_elsewhere_leaves_the_pane_with_who_answered(running: Path, pane: Pane) -> None:
    async with CodeExecutor(workspace=running) as kernel:
        async with ApproverConnection(read_state(running), "someone else") as elsewhere:
            call = asyncio.create_task(kernel.execute(slow_call()))
            opened = await next_opened(elsewhere)
            text = await pane.shows("ask #")
            number = ask_on_screen(text)
            assert (await elsewhere.answer(opened.ask.id, accept=True)).ok
            assert (await call).text == "slept 0.0"
        text = await pane.wait_for(lambda text: ask_on_screen(text) is None, "the ask withdrawn")
        assert f"{number} edge.slow: allowed once by terminal (someone else)" in text
        assert "no ask is waiting" in text


@pytest.mark.integration
async def test_several_asks_are_answered_oldest_first(running: Path, pane: Pane) -> None:
    async with CodeExecutor(workspace=running) as one, CodeExecutor(workspace=running) as two:
        first = asyncio.create_task(one.execute(slow_call(0.01)))
        await pane.shows("ask #")
        second = asyncio.create_task(two.execute(slow_call(0.02)))
        text = await pane.shows("1 more waiting")
        assert "seconds: 0.01" in text
        await answerable(pane, ask_on_screen(text))
        pane.keys("y")
        assert (await first).text == "slept 0.01"
        text = await pane.shows("seconds: 0.02")
        await answerable(pane, ask_on_screen(text))
        pane.keys("n")
        assert (await second).text is not None and (await second).text.startswith("rejected:")  # type: ignore[union-attr]


@pytest.mark.integration
@pytest.mark.parametrize("key", ["q", "C-c"])
async def test_q_and_ctrl_c_quit_with_0_and_give_the_terminal_back(running: Path, key: str) -> None:
    pane = Pane(approve_command(running))
    try:
        await pane.shows("waiting for asks")
        pane.keys(key)
        text = await pane.last_words()
        assert "exit 0" in text
        assert "icanon echo" in text  # not -icanon / -echo: cbreak mode was undone
        assert "waiting for asks" not in text  # the alternate screen was left
    finally:
        pane.kill()


@pytest.mark.integration
def test_line_mode_answers_from_standard_input(running: Path) -> None:
    approve = subprocess.Popen(
        [str(IPYBOX), "approve", str(running)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert approve.stdin is not None and approve.stdout is not None
        assert "ipybox approve: answering asks of" in approve.stdout.readline()

        async def call() -> str | None:
            async with CodeExecutor(workspace=running) as kernel:
                task = asyncio.create_task(kernel.execute(slow_call()))
                while "answer #" not in await asyncio.to_thread(approve.stdout.readline):  # type: ignore[union-attr]
                    pass
                await asyncio.sleep(SETTLE_S)  # read before answered: a line sooner answers nothing
                approve.stdin.write("?\ny\n")  # type: ignore[union-attr]
                approve.stdin.flush()  # type: ignore[union-attr]
                return (await task).text

        assert asyncio.run(call()) == "slept 0.0"
        approve.stdin.close()  # end of input quits
        assert approve.wait(30) == 0
        assert "allowed once by terminal (" in approve.stdout.read()
    finally:
        approve.kill()
        approve.wait()


@pytest.mark.integration
def test_approve_and_console_on_a_workspace_that_is_not_running_say_so_in_one_line(tmp_path: Path) -> None:
    workspace = make_terminal_workspace(tmp_path, f"{TAG}-idle")
    for command in ("approve", "console"):
        done = ipybox(command, str(workspace))
        assert done.returncode == 1
        assert done.stderr == f"ipybox: ipybox is not running in {workspace} (start it with `ipybox up`)\n"


@pytest.mark.integration
def test_console_prints_a_new_one_time_login_link_each_time(running: Path) -> None:
    first = ipybox("console", str(running))
    assert first.returncode == 0, first.stderr
    url = first.stdout.split()[-1]
    assert url.startswith("http://127.0.0.1:")
    second = ipybox("console", "--json", str(running))
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)["url"]
    assert again.startswith("http://127.0.0.1:") and again != url


@pytest.mark.integration
async def test_the_approver_exits_1_when_the_workspace_stops(tmp_path: Path) -> None:
    workspace = make_terminal_workspace(tmp_path, f"{TAG}-stops")
    config = workspace / "ipybox.toml"
    config.write_text("[endpoints]\nconsole = false\n\n" + config.read_text())
    assert ipybox("up", "-d", str(workspace)).returncode == 0
    pane = Pane(approve_command(workspace))
    try:
        off = ipybox("console", str(workspace))
        assert off.returncode == 1 and len(off.stderr.splitlines()) == 1
        assert "console = false" in off.stderr
        await pane.shows("waiting for asks")
        assert (await asyncio.to_thread(ipybox, "down", str(workspace))).returncode == 0
        text = await pane.last_words()
        assert "exit 1" in text
        assert f"ipybox: ipybox in {workspace} stopped" in text and "icanon echo" in text
    finally:
        pane.kill()
        ipybox("down", str(workspace))


@pytest.mark.integration
async def test_always_is_confirmed_then_written_into_ipybox_toml_and_a_refusal_keeps_the_ask(
    running: Path, pane: Pane
) -> None:
    config = running / "ipybox.toml"
    weather = "from mcptools.edge import weather\nprint(weather.run(weather.Params(city='Vienna')).city)"
    original = config.read_text()
    # A symlinked ipybox.toml is not written through: the answer is refused, and the ask stays.
    real = running / "real-ipybox.toml"
    real.write_text(original)
    config.unlink()
    config.symlink_to(real.name)
    async with CodeExecutor(workspace=running) as kernel:
        call = asyncio.create_task(kernel.execute(weather))
        text = await pane.shows("ask #")
        number = ask_on_screen(text)
        assert "edge.weather" in text and "asked by the default decision" in text
        await answerable(pane, number)
        pane.keys("D")
        # The preview of the rule: the default asked, so it requires the call's exact arguments.
        text = await pane.shows("Press D again to save it")
        assert 'args = { city = "Vienna" }' in text and "always deny edge.weather?" in text
        pane.keys("D")
        text = await pane.shows("was not answered:")
        assert ask_on_screen(text) == number and "symlink" in text
        config.unlink()
        config.write_text(original)
        pane.keys("a")
        await pane.shows("Press a again to save it")
        pane.keys("a")
        assert (await call).text == "Vienna"
        await pane.shows(f"{number} edge.weather: allowed always by terminal (")
    written = config.read_text()
    assert written.startswith(original)
    assert "# Added by terminal (" in written and 'id = "always-allow-edge-weather"' in written
    last = audit(running)[-1]
    assert (last["tool"], last["decided_by"], last["scope"]) == ("weather", "terminal", "always")


# -- from the attacker's side: a key answers only what the person saw

# Ask A: `edge.slow`, called by a process the kernel started, so the kernel can withdraw A at the moment
# it chooses (killing the process: "the calling code went away").
START_ASK_A = (
    "import subprocess, sys\n"
    "a = subprocess.Popen([sys.executable, '-c', "
    "'from mcptools.edge import slow; slow.run(slow.Params(seconds=0))'])"
)
# ... and replaces it with ask B at once.
SWAP_TO_ASK_B = (
    "a.kill(); a.wait()\n"
    "from mcptools.edge import log_and_echo\n"
    "from ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
    "try:\n    print(log_and_echo.run(log_and_echo.Params(text='write_file /root/.bashrc')))\n"
    "except ApprovalRejectedError as e:\n    print('rejected:', e)"
)


@pytest.mark.integration
async def test_an_ask_swapped_in_150_ms_before_a_key_is_not_answered_by_that_key(
    running: Path, pane: Pane
) -> None:
    async with CodeExecutor(workspace=running) as kernel:
        await kernel.execute(START_ASK_A)
        text = await answerable(pane)  # A has been on the screen for a while: the person reads it
        first = ask_on_screen(text)
        assert "edge.slow" in text
        swap = asyncio.create_task(kernel.execute(SWAP_TO_ASK_B))
        text = await pane.wait_for(
            lambda text: "edge.log_and_echo" in text and ask_on_screen(text) not in (None, first), "ask B"
        )
        second = ask_on_screen(text)
        assert f"{first} edge.slow: withdrawn (the calling code went away)" in text
        await asyncio.sleep(0.15)
        pane.keys("y")  # meant for A, lands 150 ms after B took its place
        text = await pane.shows("the ask changed: look again", timeout=10)
        assert ask_on_screen(text) == second and not swap.done()
        await answerable(pane, second)
        pane.keys("n")
        result = await swap
        assert result.text is not None and result.text.startswith("rejected:")
    last = audit(running)[-1]
    assert (last["tool"], last["decision"], last["decided_by"]) == ("log_and_echo", "deny", "terminal")


@pytest.mark.integration
async def test_v_shows_all_174_lines_of_an_argument_in_less_and_comes_back(running: Path) -> None:
    pane = Pane("env -u PAGER " + approve_command(running))  # plain `less`, whatever the test's PAGER
    content = "\n".join(f"line {i:03d} of the script" for i in range(1, 175))
    call_code = (
        "from mcptools.edge import log_and_echo\n"
        "from ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
        f"try:\n    print(len(log_and_echo.run(log_and_echo.Params(text={content!r}))))\n"
        "except ApprovalRejectedError as e:\n    print('rejected:', e)"
    )
    try:
        await pane.shows("waiting for asks")
        async with CodeExecutor(workspace=running) as kernel:
            call = asyncio.create_task(kernel.execute(call_code))
            text = await answerable(pane)
            number = ask_on_screen(text)
            assert "line 006 of the script" in text and "line 007 of the script" not in text
            assert "(folded: v shows the arguments in full)" in text
            pane.keys("v")
            seen: set[int] = set()
            for _ in range(20):  # a page at a time, to the end
                text = await pane.wait_for(
                    lambda text: "of the script" in text and "y allow once" not in text, "the pager"
                )
                seen.update(int(n) for n in re.findall(r"^  \| line (\d{3}) of the script$", text, re.M))
                if "(END)" in text:
                    break
                pane.keys("Space")
                await pane.wait_for(lambda now, before=text: now != before, "the next page")  # type: ignore[misc]
            assert seen == set(range(1, 175))
            pane.keys("q")
            await answerable(pane, number)  # the ask is back, read afresh before keys answer it
            pane.keys("n")
            result = await call
            assert result.text is not None and result.text.startswith("rejected:")
    finally:
        pane.kill()
