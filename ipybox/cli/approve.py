"""`ipybox approve [DIR]` and `ipybox console [DIR]`: a person answers a running workspace's `ask`s in a
terminal, or gets a link to the web console.

`ipybox approve` connects to the workspace as an approver (`ApproverConnection`), which makes the
terminal a route that can answer (`terminal` in `[approval] ask`), and shows the oldest pending ask: the
call (`server.tool`, or the shell command), its arguments (long values folded), the tool's annotations,
the rule that asked and why, the session, the time left. One key answers it:

    y allow once     s allow for this session     a always allow (writes a rule into ipybox.toml)
    n deny once      d deny for this session      D always deny  (writes a rule into ipybox.toml)
    v view the arguments in full     ? help     q quit

A key answers only the ask that has been on the screen for `SETTLE_S` (0.5 s): a kernel can withdraw the
ask being read and put up another just before the key lands, and that key answers nothing (a notice says
"the ask changed: look again"). The answer sent carries the id of the ask shown, and the workspace refuses
an answer whose ask is no longer pending. `v` shows the current ask's arguments whole in `$PAGER` (default
`less`; escaped, so `less -R` in `$LESS` can't interpret anything), or printed whole when no pager runs;
the screen, which folds long values, says so when it folded something.

`a` and `D` edit `ipybox.toml`, so they wait for the same key again to confirm (any other key cancels).
An ask answered elsewhere (the console, the application, an MCP client, another terminal) or timed out
is taken off the screen, and a line says who answered. A refused answer (an `always` rule that would not
load, ...) is shown and the ask stays.

Two modes, chosen by whether standard input is a terminal:

- Terminal: single keys (cbreak mode, no echo), and a screen redrawn on every change and once a second
  (the time left) in the terminal's alternate screen, so an ask withdrawn is gone from it. The terminal's
  settings and screen are restored on every way out (q, Ctrl-C, SIGTERM, SIGHUP, the workspace stopping,
  an error).
- Otherwise (a pipe, a file): one answer per line (`y`, `s`, ...), and a log of lines: each ask's
  description when it becomes the one to answer, each close, each refusal. End of input quits.

Everything shown of an ask (arguments come from code in a kernel, names from MCP servers) is printed with
control and format characters escaped (`ipybox.display_text.printable`), so a value can't move the cursor,
recolour or retitle the terminal, write its clipboard, or reorder or hide text (bidi, zero-width).

The pure part (`Approvals`: state, keys, rendering) works without processes or a terminal; `approve()`
drives it with the connection, the keyboard and a ticker.

Exit status: 0 on `q`, Ctrl-C or end of input; 1 with one line when the workspace is not running or
stops (`ipybox in DIR stopped`).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import io
import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TextIO

from ipybox.approval.ask_events import AnswerResult, AskClosedMessage, AskOpenedMessage, AskView
from ipybox.approval.asks import Scope
from ipybox.display_text import printable
from ipybox.rules.calls import is_untrusted, origin_text

EXIT_ERROR = 1

ANSWERS: Final[dict[str, tuple[bool, Scope]]] = {
    "y": (True, "once"),
    "s": (True, "session"),
    "a": (True, "always"),
    "n": (False, "once"),
    "d": (False, "session"),
    "D": (False, "always"),
}
"""The keys that answer, and what each answers."""

SETTLE_S: Final = 0.5
"""Seconds an ask must have been shown before a key answers it: a key that lands sooner (the ask shown
was replaced while the person read the one before: a kernel can withdraw an ask and open another at any
moment) answers nothing, and a notice says the ask changed. A person reads a new ask, and the time to
react to a change on a screen is 0.2-0.3 s, so 0.5 s covers a key already on its way when the screen
changed, and it is short enough not to slow down anyone answering an ask they have read."""

KEY_LINES: Final = (
    "y allow once     s allow for this session     a always allow (adds a rule to ipybox.toml)",
    "n deny once      d deny for this session      D always deny  (adds a rule to ipybox.toml)",
    "v view the arguments in full     ? help     q quit",
)
KEYS: Final = "[y s a n d D v ? q]"
"""The keys, as the prompt lists them."""
VIEW: Final = "v"
"""The key that shows the current ask's arguments in full (in a pager on a terminal)."""

HELP: Final = (
    "Keys answer the ask shown (the oldest waiting):",
    "  y  allow this call once",
    "  s  allow it, and every call of the same tool from the same session until the session ends",
    "  a  always allow: adds an allow rule to ipybox.toml with this call as its example (asks to confirm)",
    "  n  deny this call once",
    "  d  deny it, and every call of the same tool from the same session until the session ends",
    "  D  always deny: adds a deny rule to ipybox.toml (asks to confirm)",
    "  v  view the arguments in full ($PAGER, else less; q there comes back here)",
    "  ?  this help        q  quit (the asks stay for the other approvers, or time out)",
    f"Keys answer an ask only once it has been on the screen for {SETTLE_S:g} s: a key pressed sooner,",
    "as another ask replaces the one being read, answers nothing.",
)

SCREEN_HOME: Final = "\x1b[H"
CLEAR_LINE: Final = "\x1b[K"
CLEAR_BELOW: Final = "\x1b[J"
"""The only escape sequences a screen holds (besides entering and leaving the alternate screen)."""

FOLD_AT: Final = 160
"""A string argument longer than this many characters is folded: its start and its length are shown."""
MAX_TEXT_LINES: Final = 6
"""Lines shown of a multi-line string argument."""
MAX_ARG_LINES: Final = 30
"""Lines shown of all the arguments (the rest are counted)."""
RECENT: Final = 5
"""Closed asks listed on the screen."""
TICK_S: Final = 1.0
"""How often the screen is redrawn for the time left."""


# -- arguments


def fold(text: str, limit: int | None = FOLD_AT) -> str:
    """`text`, or its first `limit` characters and how long it is (`None`: never folded)."""
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def _folded(value: Any, limit: int | None = FOLD_AT) -> Any:
    """`value` with every long string in it folded (for `json.dumps`)."""
    if isinstance(value, str):
        return fold(value, limit)
    if isinstance(value, dict):
        return {str(key): _folded(item, limit) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_folded(item, limit) for item in value]
    return value


def format_args(
    args: dict[str, Any], max_lines: int | None = MAX_ARG_LINES, *, full: bool = False
) -> list[str]:
    """The arguments, one `name: value` per argument (JSON values; a multi-line string as its lines; nested
    values indented), long strings folded, at most `max_lines` lines; `full`: nothing folded or left out
    (what `v` shows)."""
    limit = None if full else FOLD_AT
    text_lines_shown = None if full else MAX_TEXT_LINES
    lines: list[str] = []
    for name, value in args.items():
        key = json.dumps(str(name), ensure_ascii=False)[1:-1]
        if isinstance(value, str) and "\n" in value:
            text_lines = value.split("\n")
            lines.append(f"{key}: ({len(text_lines)} lines, {len(value):,} characters)")
            lines.extend(f"  | {fold(line, limit)}" for line in text_lines[:text_lines_shown])
            if text_lines_shown is not None and len(text_lines) > text_lines_shown:
                lines.append(f"  | ... ({len(text_lines) - text_lines_shown} more lines)")
            continue
        shown = json.dumps(_folded(value, limit), ensure_ascii=False, indent=2, default=str).split("\n")
        lines.append(f"{key}: {shown[0]}")
        lines.extend(f"  {line}" for line in shown[1:])
    if not lines:
        return ["(no arguments)"]
    if not full and max_lines is not None and len(lines) > max_lines:
        hidden = len(lines) - (max_lines - 1)
        lines = [*lines[: max_lines - 1], f"... ({hidden} more lines)"]
    return lines


def full_lines(ask: AskView) -> list[str]:
    """Everything `v` shows of `ask`: the call and every argument whole (escaped when printed)."""
    return [f"ask {short_id(ask.id)}: {ask.call_text}, all arguments:", *format_args(ask.args, full=True)]


# -- time


def _moment(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def time_left(ask: AskView, now: datetime) -> float | None:
    """Seconds until the ask times out (0 when past), `None` when it has no limit."""
    if ask.expires_at is None:
        return None
    return max(0.0, (_moment(ask.expires_at) - now).total_seconds())


def _duration(seconds: float) -> str:
    whole = int(seconds + 0.5)
    if whole < 100:  # "60 s" reads better than "1 min 00 s"
        return f"{whole} s"
    return f"{whole // 60} min {whole % 60:02d} s"


def _clock(iso: str) -> str:
    return _moment(iso).astimezone().strftime("%H:%M:%S")


# -- the approver's state


def short_id(ask_id: str) -> str:
    """`#3` for the board's ask `3-Yc...` (its serial; the rest is the unguessable part)."""
    return "#" + ask_id.split("-", 1)[0]


def ask_lines(ask: AskView, now: datetime, *, max_arg_lines: int = MAX_ARG_LINES) -> list[str]:
    """How one ask is shown: the call, where it comes from, why it asks, the time left, the arguments."""
    head = f"ask {short_id(ask.id)}: {ask.call_text}"
    if ask.subject is not None and (ask.server, ask.tool) == ("ipybox", "network"):
        head += "  (a sandboxed kernel's connection to a host not in allowedDomains)"
    elif ask.subject is not None:
        head += f"  (a shell command, run by {ask.server}.{ask.tool})"
    lines = [head]
    where = f"session {ask.session}" if ask.session is not None else "no session"
    left = time_left(ask, now)
    when = f"asked {_clock(ask.asked_at)}, " + (
        "no time limit" if left is None else f"{_duration(left)} left, then it is denied"
    )
    lines.append(f"  {where}; {when}")
    rule = f"rule '{ask.rule_id}'" if ask.rule_id is not None else "the default decision"
    lines.append(f"  asked by {rule}" + (f": {ask.reason}" if ask.reason else ""))
    if ask.asked_of is not None and ask.asked_of != "terminal":
        lines.append(f"  also asked of the {ask.asked_of}: the first answer counts")
    if "terminal" not in ask.routes:
        lines.append('  (not answerable here: [approval] ask in ipybox.toml does not list "terminal")')
    if ask.annotations:
        notes = ", ".join(f"{key}={json.dumps(value, default=str)}" for key, value in ask.annotations.items())
        lines.append(f"  annotations: {fold(notes)}")
    lines.append("  arguments:")
    shown = format_args(ask.args, max_arg_lines)
    lines.extend(f"    {line}" for line in shown)
    if shown != format_args(ask.args, full=True):
        lines.append(f"    (folded: {VIEW} shows the arguments in full)")
    if ask.provenance:
        # Where argument values came from, matched on the host (`ipybox.rules.provenance`).
        lines.extend(
            f"    {'UNTRUSTED: ' if is_untrusted(origins) else 'origin: '}{fold(origin_text(path, origins))}"
            for path, origins in ask.provenance.items()
        )
    if ask.links:
        # Where a path argument leads when a link is on its way (resolved by the host, not the kernel).
        lines.append("  links (where these paths lead):")
        lines.extend(f"    {fold(name)} {fold(link.describe())}" for name, link in ask.links.items())
    return lines


@dataclass(frozen=True)
class Send:
    """Answer `ask_id` (`Approvals.key` asks the driver to)."""

    ask_id: str
    accept: bool
    scope: Scope


@dataclass
class Reaction:
    """What the driver does after an event: print `log` (line mode), send an answer, show `view` (the
    current ask in full: in a pager on a terminal, in the log otherwise), quit."""

    log: list[str]
    send: Send | None = None
    quit: bool = False
    view: list[str] | None = None


class Approvals:
    """The pending asks as `ipybox approve` shows them, and what each key does. Pure: no I/O.

    A key answers only the ask that has been shown for `settle_s` (see `SETTLE_S`): the answer it sends
    carries that ask's id, which the workspace refuses once that ask is no longer pending.

    Args:
        workspace: Shown in the header.
        who: Who answers (shown in the header).
        settle_s: Seconds an ask is shown before keys answer it (0: at once).
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        workspace: str,
        who: str,
        *,
        settle_s: float = SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workspace = workspace
        self.who = who
        self.settle_s = settle_s
        self.clock = clock
        self._on_screen: str | None = None  # the ask shown since `_shown_at` (`None`: none)
        self._shown_at = float("-inf")
        self.pending: OrderedDict[str, AskView] = OrderedDict()
        self.recent: deque[str] = deque(maxlen=RECENT)
        self.notice: list[str] = []  # the answer to the last key (help, a refusal, a confirmation)
        self.confirming: tuple[str, str] | None = None  # (ask id, `a` or `D`): pressed once for that ask
        self.sending: str | None = None  # the ask whose answer the workspace has not replied to yet
        self._taken: set[str] = set()  # answered from here and accepted: their `closed` is on its way
        self._shown: str | None = None  # the ask last described in the log (line mode)

    @property
    def current(self) -> AskView | None:
        """The ask to answer: the oldest pending one not answered from here already."""
        for ask in self.pending.values():
            if ask.id not in self._taken:
                return ask
        return None

    @property
    def waiting(self) -> int:
        """Asks waiting besides the current one."""
        return max(0, sum(1 for ask_id in self.pending if ask_id not in self._taken) - 1)

    def header(self) -> list[str]:
        return [f"ipybox approve: answering asks of {self.workspace} as {self.who} (? help, q quit)"]

    # -- events from the workspace

    def opened(self, message: AskOpenedMessage, now: datetime) -> Reaction:
        self.pending[message.ask.id] = message.ask
        self._track()
        return Reaction(self._describe_current(now))

    def closed(self, message: AskClosedMessage, now: datetime) -> Reaction:
        ask = self.pending.pop(message.id, None)
        self._taken.discard(message.id)
        if ask is None:
            return Reaction([])
        if message.answer is not None:
            what = message.answer.describe()
        else:
            what = "withdrawn" + (f" ({message.why})" if message.why else "")
        line = f"{_clock_now(now)} {short_id(ask.id)} {ask.call_text}: {what}"
        self.recent.append(line)
        if self.confirming is not None and self.confirming[0] == ask.id:
            self.confirming = None
            self.notice = []
        if self._shown == ask.id:
            self._shown = None
        self._track()
        return Reaction([line, *self._describe_current(now)])

    def result(self, result: AnswerResult, now: datetime) -> Reaction:
        """The workspace's reply to our answer."""
        if self.sending == result.id:
            self.sending = None
        if result.ok:
            # Its `closed` (which says who answered, and shows the next ask) is on its way, if not here yet.
            if result.id in self.pending:
                self._taken.add(result.id)
            self._track()
            return Reaction([])
        refused = f"{short_id(result.id)} was not answered: {result.error or 'refused'}"
        self.notice = [refused]
        still = " (it is still waiting)" if result.id in self.pending else ""
        return Reaction([refused + still])

    # -- keys

    def key(self, key: str, now: datetime) -> Reaction:
        """React to one key (or one line of input, in line mode)."""
        confirming, self.confirming = self.confirming, None
        self.notice = []
        ask = self.current
        if confirming is not None:
            if ask is not None and (ask.id, key) == confirming:
                if self.settling() > 0:
                    return self._too_soon(ask)
                return self._answer(ask, key)
            self.notice = ["cancelled: nothing was answered"]
            return Reaction(list(self.notice))
        if key == "q":
            return Reaction([], quit=True)
        if key == "?":
            self.notice = list(HELP)
            return Reaction(list(HELP))
        if key == VIEW:
            if ask is None:
                self.notice = ["no ask is waiting"]
                return Reaction(list(self.notice))
            return Reaction([], view=full_lines(ask))
        if key not in ANSWERS:
            shown = printable(key) if key.strip() else repr(key)
            self.notice = [f"unknown key {shown}: one of y s a n d D answers, v views, ? helps, q quits"]
            return Reaction(list(self.notice))
        if ask is None:
            self.notice = ["no ask is waiting"]
            return Reaction(list(self.notice))
        if self.settling() > 0:
            return self._too_soon(ask)
        if self.sending is not None:
            self.notice = [f"still waiting for the workspace to take the answer to {short_id(self.sending)}"]
            return Reaction(list(self.notice))
        accept, scope = ANSWERS[key]
        if scope == "always":
            self.confirming = (ask.id, key)
            verb = "allow" if accept else "deny"
            self.notice = [
                f"always {verb} {ask.call_text}? This adds a rule to ipybox.toml. "
                f"Press {key} again to confirm, any other key cancels."
            ]
            return Reaction(list(self.notice))
        return self._answer(ask, key)

    def settling(self) -> float:
        """Seconds until keys answer the ask shown (0: they do now, or no ask is shown)."""
        self._track()
        if self._on_screen is None:
            return 0.0
        return max(0.0, self._shown_at + self.settle_s - self.clock())

    def shown_again(self) -> None:
        """The screen is back after something covered it (the pager): the ask shown is read afresh."""
        self._on_screen = None
        self._track()

    def _track(self) -> None:
        """Note when the ask shown changes (a new one, another after an answer or a withdrawal)."""
        ask = self.current
        shown = ask.id if ask is not None else None
        if shown != self._on_screen:
            self._on_screen = shown
            self._shown_at = self.clock()

    def _too_soon(self, ask: AskView) -> Reaction:
        self.notice = [
            f"the ask changed: look again. {short_id(ask.id)} has been on the screen for less than "
            f"{self.settle_s:g} s, so that key answered nothing."
        ]
        return Reaction(list(self.notice))

    def _answer(self, ask: AskView, key: str) -> Reaction:
        accept, scope = ANSWERS[key]
        self.sending = ask.id
        return Reaction([], send=Send(ask.id, accept, scope))

    def _describe_current(self, now: datetime) -> list[str]:
        """Line mode: the current ask's description, when it was not shown yet."""
        ask = self.current
        if ask is None or ask.id == self._shown:
            return []
        self._shown = ask.id
        more = f" ({self.waiting} more waiting)" if self.waiting else ""
        return [*ask_lines(ask, now), f"  answer {short_id(ask.id)}{more}: {KEYS}"]

    # -- the terminal's screen

    def prompt(self, now: datetime) -> str:
        ask = self.current
        if ask is None:
            return "waiting for asks (q quits)"
        if self.sending is not None:
            return f"answering {short_id(self.sending)}..."
        if self.settling() > 0:
            return f"read {short_id(ask.id)} first: keys answer it once it has been shown for {self.settle_s:g} s"
        left = time_left(ask, now)
        parts = [
            f"{_duration(left)} left" if left is not None else "",
            f"{self.waiting} more waiting" if self.waiting else "",
        ]
        extra = ", ".join(part for part in parts if part)
        return f"answer {short_id(ask.id)} {KEYS}" + (f" ({extra})" if extra else "")

    def screen(self, now: datetime, height: int) -> list[str]:
        """The whole screen (terminal mode), at most `height` lines: a header, the current ask with the
        keys, the others waiting, the last asks closed, the notice, the prompt (last line)."""
        ask = self.current
        top = [*self.header(), ""]
        tail: list[str] = []
        others = [
            other for other in self.pending.values() if other is not ask and other.id not in self._taken
        ]
        if others:
            tail += ["", f"also waiting ({len(others)}):"]
            tail += [f"  {short_id(other.id)} {other.call_text}" for other in others[:5]]
            if len(others) > 5:
                tail.append(f"  ... and {len(others) - 5} more")
        if self.recent:
            tail += ["", "answered or withdrawn:", *(f"  {line}" for line in self.recent)]
        if self.notice:
            tail += ["", *self.notice]
        tail += ["", self.prompt(now)]
        if ask is None:
            body = ["no ask is waiting."]
        else:
            fixed = ask_lines(ask, now, max_arg_lines=1)
            room = height - len(top) - len(tail) - len(fixed) - len(KEY_LINES) - 1
            body = [*ask_lines(ask, now, max_arg_lines=max(1, room + 1)), "", *KEY_LINES]
        lines = [*top, *body, *tail]
        if len(lines) > height:  # a very small terminal: keep the prompt
            lines = [*lines[: height - 1], lines[-1]]
        return lines


def _clock_now(now: datetime) -> str:
    return now.astimezone().strftime("%H:%M:%S")


# -- the terminal


class Output:
    """Where `ipybox approve` writes: a redrawn screen (`live`) or a log of lines."""

    def __init__(self, stream: TextIO, live: bool) -> None:
        self.stream = stream
        self.live = live
        self._last_prompt: str | None = None

    @contextlib.contextmanager
    def screen(self) -> Iterator[None]:
        """In live mode, the terminal's alternate screen (left again however this ends)."""
        if not self.live:
            yield
            return
        self.enter()
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                self.leave()

    def enter(self) -> None:
        self.stream.write("\x1b[?1049h\x1b[?25l")  # alternate screen, cursor hidden
        self.stream.flush()

    def leave(self) -> None:
        self.stream.write("\x1b[?25h\x1b[?1049l")  # cursor shown, main screen
        self.stream.flush()

    def draw(self, approvals: Approvals, now: datetime) -> None:
        # The terminal's own size, read at every draw (it may have been resized): `COLUMNS` and `LINES`
        # in the environment, which `shutil.get_terminal_size` prefers, are often stale or inherited.
        try:
            size = os.get_terminal_size(self.stream.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            size = shutil.get_terminal_size()
        lines = approvals.screen(now, size.lines)
        width = max(20, size.columns)
        shown = [_clip(printable(line), width) for line in lines]
        # Over the old screen, each line cleared to its end and the rest below: no flicker once a second.
        self.stream.write(SCREEN_HOME + (CLEAR_LINE + "\r\n").join(shown) + CLEAR_LINE + CLEAR_BELOW)
        self.stream.flush()

    def log(self, lines: list[str]) -> None:
        for line in lines:
            self.stream.write(printable(line) + "\n")
        self.stream.flush()


def _clip(line: str, width: int) -> str:
    return line if len(line) < width else line[: width - 4] + "..."


async def view(lines: list[str], out: Output, fd: int) -> None:
    """Show `lines` (escaped) in full on the terminal: in `$PAGER` (split into words as a shell would, not
    run by one; default `less`), which reads its keys from the terminal, or, when no pager runs, printed
    whole on the terminal's main screen until a key is pressed. Ctrl-C meanwhile is the pager's."""
    text = "".join(printable(line) + "\n" for line in lines)
    data = text.encode(getattr(out.stream, "encoding", None) or "utf-8", errors="backslashreplace")
    try:
        command = shlex.split(os.environ.get("PAGER", "")) or ["less"]
    except ValueError:
        command = []
    # A Python handler, not SIG_IGN: the pager starts with the default and handles Ctrl-C itself.
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    out.leave()
    try:
        problem = await _page(command, data) if command else f"$PAGER can't be read: {os.environ['PAGER']!r}"
        if problem is not None:
            out.stream.write(f"{text}\n({printable(problem)}; press any key to go back to the ask)\n")
            out.stream.flush()
            await _one_key(fd)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        out.enter()


async def _page(command: list[str], data: bytes) -> str | None:
    """Run the pager `command` on `data`; why it did not show it, if it did not."""
    try:
        process = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE)
    except OSError as e:
        return f"the pager {command[0]} could not start: {e.strerror or e}"
    try:
        await process.communicate(data)
    except BaseException:  # cancelled: `ipybox approve` quits, and takes the pager with it
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise
    return None if process.returncode == 0 else f"the pager {command[0]} exited with {process.returncode}"


async def _one_key(fd: int) -> None:
    """Wait for a key on the terminal `fd`, and take it (it answers nothing)."""
    loop = asyncio.get_running_loop()
    pressed: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not pressed.done():
            pressed.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await pressed
    finally:
        loop.remove_reader(fd)
    with contextlib.suppress(OSError):
        os.read(fd, 64)


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """The terminal `fd` in cbreak mode (single keys, no echo; Ctrl-C still interrupts), restored after."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield
    finally:
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


END_OF_INPUT: Final = ""


def read_keys(fd: int, live: bool, put: Callable[[str], None]) -> Callable[[], None]:
    """Call `put` with each key (live: a terminal in cbreak mode; escape sequences such as arrow keys are
    dropped) or each line stripped (otherwise), and `END_OF_INPUT` at the end; returns how to stop."""
    loop = asyncio.get_running_loop()
    if live:

        def readable() -> None:
            try:
                data = os.read(fd, 64)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(fd)
                put(END_OF_INPUT)
                return
            text = data.decode(errors="replace")
            if text.startswith("\x1b"):
                return
            for char in text:
                put(char)

        loop.add_reader(fd, readable)

        def stop() -> None:
            loop.remove_reader(fd)

        return stop

    # A thread, since a regular file can't be waited on with epoll. `os.read`, not `sys.stdin`: a daemon
    # thread blocked in a buffered read holds its lock and can abort the interpreter's shutdown.
    def lines() -> None:
        pending = b""
        while True:
            try:
                data = os.read(fd, 4096)
            except OSError:
                data = b""
            if not data:
                break
            pending += data
            *complete, pending = pending.split(b"\n")
            for line in complete:
                if line.strip():
                    loop.call_soon_threadsafe(put, line.decode(errors="replace").strip())
        if pending.strip():
            loop.call_soon_threadsafe(put, pending.decode(errors="replace").strip())
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(put, END_OF_INPUT)

    threading.Thread(target=lines, name="ipybox-approve-input", daemon=True).start()
    return lambda: None


def who_am_i() -> str:
    """`alice on /dev/pts/3`: the user and the terminal answering, for the audit log."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if stream.isatty():
                return f"{user} on {os.ttyname(stream.fileno())}"
    return f"{user} on no terminal (pid {os.getpid()})"


# -- driving it


class _Quit:
    pass


class _Tick:
    pass


class _Viewed:
    """The pager (`v`) has ended."""


_Event = AskOpenedMessage | AskClosedMessage | AnswerResult | str | _Quit | _Tick | _Viewed | BaseException


async def _approve(workspace: Path, live: bool, out: Output) -> int:
    from ipybox.lifecycle import task_scope
    from ipybox.running.approvers import ApproverConnection
    from ipybox.running.state import NotRunningError, read_state

    state = read_state(workspace)
    who = who_am_i()
    approvals = Approvals(str(workspace), who)
    events: asyncio.Queue[_Event] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[Any]] = set()

    # The reader, the ticks, answers and the pager are tasks of this call's group, inside the connection
    # they use: each reports its error as an event, and leaving cancels the rest and waits for them.
    async with ApproverConnection(state, who) as connection, task_scope() as group:

        def spawn(coroutine: Any) -> None:
            task = group.create_task(coroutine)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        async def messages() -> None:
            try:
                async for message in connection:
                    events.put_nowait(message)
                # It ends without an error only when we close it: never while this loop reads it.
                events.put_nowait(NotRunningError(f"ipybox in {workspace} stopped"))
            except Exception as e:
                events.put_nowait(e)

        async def answer(send: Send) -> None:
            try:
                events.put_nowait(await connection.answer(send.ask_id, send.accept, send.scope))
            except Exception as e:
                events.put_nowait(e)

        async def ticks() -> None:
            while True:
                await asyncio.sleep(TICK_S)
                events.put_nowait(_Tick())

        async def viewing(lines: list[str]) -> None:
            try:
                await view(lines, out, sys.stdin.fileno())
                events.put_nowait(_Viewed())
            except Exception as e:
                events.put_nowait(e)

        spawn(messages())
        if live:
            spawn(ticks())
        for signum in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, events.put_nowait, _Quit())
        stop_keys = read_keys(sys.stdin.fileno(), live, events.put_nowait)
        paging = False  # the pager has the terminal: nothing is drawn, and its keys are its own
        settled: asyncio.TimerHandle | None = None  # redraws the prompt once the ask shown has settled
        try:
            now = datetime.now(UTC)
            if live:
                out.draw(approvals, now)
            else:
                out.log(approvals.header())
            while True:
                event = await events.get()
                now = datetime.now(UTC)
                if isinstance(event, BaseException):
                    raise event
                if isinstance(event, _Quit):
                    return 0
                if isinstance(event, _Tick):
                    reaction = Reaction([])
                elif isinstance(event, _Viewed):
                    paging = False
                    stop_keys = read_keys(sys.stdin.fileno(), live, events.put_nowait)
                    approvals.shown_again()  # the ask on the screen now is read afresh
                    reaction = Reaction([])
                elif isinstance(event, AskOpenedMessage):
                    reaction = approvals.opened(event, now)
                elif isinstance(event, AskClosedMessage):
                    reaction = approvals.closed(event, now)
                elif isinstance(event, AnswerResult):
                    reaction = approvals.result(event, now)
                elif event == END_OF_INPUT:
                    return 0
                else:
                    reaction = approvals.key(event, now)
                if reaction.send is not None:
                    spawn(answer(reaction.send))
                if reaction.view is not None and live and not paging:
                    paging = True
                    stop_keys()
                    spawn(viewing(reaction.view))
                if live and not paging:
                    out.draw(approvals, now)
                    if (wait := approvals.settling()) > 0:
                        if settled is not None:
                            settled.cancel()
                        settled = loop.call_later(wait + 0.01, events.put_nowait, _Tick())
                elif not live:
                    out.log(reaction.view if reaction.view is not None else reaction.log)
                if reaction.quit:
                    return 0
        finally:
            stop_keys()
            if settled is not None:
                settled.cancel()
            for signum in (signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(signum)
            for task in list(tasks):
                task.cancel()  # the group waits for them as it ends


def approve(workspace: Path) -> int:
    """Run `ipybox approve` on the running workspace `workspace` until `q`, Ctrl-C or end of input (0);
    raises `NotRunningError` when it is not running or stops (printed by `main`, exit 1)."""
    from ipybox.running.state import read_state

    read_state(workspace)  # not running: one line, before the terminal is touched
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    live = sys.stdin.isatty() and sys.stdout.isatty()
    out = Output(sys.stdout, live)
    modes = cbreak(sys.stdin.fileno()) if live else contextlib.nullcontext()
    try:
        with modes, out.screen():
            return asyncio.run(_approve(workspace, live, out))
    except KeyboardInterrupt:
        return 0


def console(workspace: Path, as_json: bool) -> int:
    """Print a new one-time login link for the workspace's web console."""
    from ipybox.running.control_client import ControlClient

    async def login() -> str:
        async with ControlClient.of(workspace) as control:
            return (await control.console_login()).url

    url = asyncio.run(login())
    if as_json:
        print(json.dumps({"url": url}))
    else:
        print(f"One-time login link for the web console (`ipybox console` prints a new one):\n  {url}")
    return 0
