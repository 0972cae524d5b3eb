"""Progress of long operations drawn on a terminal (`ipybox up`, `ipybox server add`).

Contract: `progress_on_terminal()` yields a `Progress` listener that draws each part's current step on
standard error while it is a terminal, and `None` otherwise (`--json`, pipes, files, CI logs), so scripts
see only the command's result. Drawing never raises into the operation.

How it draws (`TerminalProgress`):

- One line per part (`gateway`, `server time`, ...), in the order the parts first reported. A running
  part's line is redrawn in place (a spinner and the seconds it has run); a finished part's line stays as
  its last state: `✓ server time   ready, 2 tools  0.8 s` or `✗ server x      failed: reason`.
- Plain ANSI only: the cursor goes up over the lines still running and each is cleared and written
  again (`ESC[nA`, `ESC[2K`). Finished lines above the first running one are never touched again, so
  the region redrawn is only as tall as what still runs (a terminal shorter than all parts still works).
  Lines being redrawn are cut to the terminal's width (a wrapped line would throw the count off); a line
  left for good is written whole.
- A part still running when the drawing ends (the operation failed in another part) is left with `-` in
  place of its spinner.
- `TERM=dumb` (or unset): no cursor movement at all; each part's final line is printed once.
- Everything from outside (a server's name, its error message) is sanitised first
  (`ipybox.display_text.one_line`): control and format characters (escape sequences, carriage returns,
  bidi overrides, zero-width characters) are shown escaped (`\\x1b`) and whitespace collapsed, so a
  hostile MCP server cannot move the cursor, recolour or rewrite the terminal.
- Log records (WARNING and up) made while drawing are printed above the drawing, sanitised the same way,
  not through it: a handler on the root logger takes them while the drawing lasts. Being there, it also
  makes a library's `logging.basicConfig` a no-op meanwhile: the MCP SDK's server calls it when the
  workspace's MCP endpoint is made, and would otherwise put a second writer (rich, at INFO) on the
  terminal in the middle of the drawing. After the drawing, Python's last-resort handler prints WARNING
  and up on standard error (the whole log is `ipybox logs`).
- Redraws are throttled to one per `interval` (0.1 s): events mark the drawing stale and a small thread
  redraws at most ten times a second, also advancing the spinners while nothing is reported (a gateway
  start is 1.4-2.9 s of silence). Events arrive on the event loop's thread (or, for a detached `up`, the
  waiting command's): a lock keeps the two apart.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from ipybox.display_text import one_line
from ipybox.progress import Progress, ProgressEvent

INTERVAL = 0.1
"""Seconds between redraws, at most (about ten a second)."""

_UNICODE_MARKS = ("✓", "✗", "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏", "…")
_ASCII_MARKS = ("+", "x", "|/-\\", "...")
_NAME_WIDTH = 12  # parts' names are padded to this, so the common ones line up
_MAX_TEXT = 500  # characters of a part's line kept in the dumb fallback (an error can be long)


@contextmanager
def progress_on_terminal(stream: TextIO | None = None, *, quiet: bool = False) -> Iterator[Progress | None]:
    """A listener drawing on `stream` (default: standard error) if it is a terminal and not `quiet`; else
    `None`. Leaves the terminal with every part's last line drawn and the cursor on a fresh line."""
    out = stream if stream is not None else sys.stderr
    if quiet or not _is_terminal(out):
        yield None
        return
    term = os.environ.get("TERM", "")
    progress = TerminalProgress(out, dumb=term in ("", "dumb"))
    logs = _LogAbove(progress)
    root = logging.getLogger()
    root.addHandler(logs)
    progress.start()
    try:
        yield progress
    finally:
        root.removeHandler(logs)
        progress.close()


class TerminalProgress:
    """Draws `ProgressEvent`s on a terminal (see the module docstring). Call it with each event; `close()`
    draws the last state of every part.

    Args:
        stream: Where to draw (a terminal).
        dumb: Print each part's final line once, without moving the cursor.
        interval: Seconds between redraws, at most.
        clock: Seconds, monotonic (tests pass their own).
        width: Columns to fit lines into (default: the terminal's, asked at each redraw).
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        dumb: bool = False,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
    ) -> None:
        self.stream = stream
        self.dumb = dumb
        self.interval = interval
        self.clock = clock
        self.width = width
        self._parts: dict[str, _Part] = {}
        self._order: list[str] = []
        self._frozen = 0  # parts (from the top) whose lines are written for good
        self._live_lines = 0  # lines drawn below them, to be redrawn
        self._stale = False
        self._last_draw = float("-inf")
        self._frame = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._marks = _UNICODE_MARKS if _can_encode(stream, "".join(_UNICODE_MARKS)) else _ASCII_MARKS

    def __call__(self, event: ProgressEvent) -> None:
        with self._lock:
            now = self.clock()
            what = one_line(event.what) or "?"
            part = self._parts.get(what)
            if part is None:
                part = self._parts[what] = _Part(what)
                self._order.append(what)
            part.update(event, now)
            if self.dumb:
                self._print_done()
                return
            self._stale = True
            if now - self._last_draw >= self.interval:
                self._draw(now)

    def start(self) -> None:
        """Redraw in the background (spinners, elapsed seconds) until `close()`."""
        if self.dumb or self._ticker is not None:
            return
        self._ticker = threading.Thread(target=self._tick, name="ipybox-progress", daemon=True)
        self._ticker.start()

    def close(self) -> None:
        """Stop redrawing and leave every part's last line on the terminal (idempotent)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            if self.dumb:
                self._print_done(everything=True)
            elif self._order:
                self._draw(self.clock(), final=True)

    def write_above(self, text: str) -> None:
        """Print `text` (sanitised, line by line) above the parts still being drawn, which are drawn again
        below it."""
        lines = [cleaned for line in text.splitlines() if (cleaned := _clip(one_line(line), _MAX_TEXT))]
        if not lines:
            return
        with self._lock:
            if self.dumb:
                self._write("".join(f"{line}\n" for line in lines))
                return
            # Over the live lines, from their top: each row written is cleared first, and the live lines
            # drawn again below cover whatever rows of theirs the text did not.
            up = f"\r\x1b[{self._live_lines}A" if self._live_lines else ""
            self._write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
            self._live_lines = 0
            if self._frozen < len(self._order):
                self._draw(self.clock())

    def tick(self) -> None:
        """Redraw now if the drawing is stale or a part is running (what the background thread does)."""
        with self._lock:
            if self._stale or any(not self._parts[w].done for w in self._order[self._frozen :]):
                self._draw(self.clock())

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception:  # a terminal that went away: the operation carries on without drawing
                return

    def _draw(self, now: float, *, final: bool = False) -> None:
        self._frame += 1
        width = self._columns()
        out: list[str] = []
        if self._live_lines:
            out.append(f"\r\x1b[{self._live_lines}A")
        live = 0
        for index in range(self._frozen, len(self._order)):
            part = self._parts[self._order[index]]
            line = self._line(part, now, final=final)
            if (part.done or final) and index == self._frozen:
                self._frozen += 1  # written for good: whole (wrapping is harmless now)
            else:
                line = _fit(line, width, self._marks[3])
                live += 1
            out.append(f"\x1b[2K{line}\n")
        self._live_lines = live
        self._stale = False
        self._last_draw = now
        self._write("".join(out))

    def _print_done(self, *, everything: bool = False) -> None:
        lines = []
        for what in self._order:
            part = self._parts[what]
            if not part.printed and (part.done or everything):
                part.printed = True
                lines.append(_clip(self._line(part, self.clock(), final=True), _MAX_TEXT) + "\n")
        if lines:
            self._write("".join(lines))

    def _line(self, part: _Part, now: float, *, final: bool = False) -> str:
        ok, failed, spinner, _ = self._marks
        name = part.what.ljust(_NAME_WIDTH)
        if part.failed:
            return f"{failed} {name}  failed: {part.detail or 'no reason given'}"
        seconds = f"{part.elapsed(now):.1f} s"
        if part.done:
            detail = f", {part.detail}" if part.detail else ""
            return f"{ok} {name}  {part.step}{detail}  {seconds}"
        # A part still running when the drawing ends (the operation failed elsewhere) keeps no spinner.
        mark = "-" if self.dumb or final else spinner[self._frame % len(spinner)]
        detail = f" {part.detail}" if part.detail else ""
        return f"{mark} {name}  {part.step}{detail}  {seconds}"

    def _columns(self) -> int:
        if self.width is not None:
            return self.width
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = 0
        # 0: a terminal whose size was never set (a fresh pty): `COLUMNS`, else 80.
        return columns if columns > 0 else shutil.get_terminal_size().columns

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal closed (or the stream did): nothing to draw on
            pass


class _LogAbove(logging.Handler):
    """Prints log records (WARNING and up) above the drawing of `progress`."""

    def __init__(self, progress: TerminalProgress) -> None:
        super().__init__(logging.WARNING)
        self.progress = progress
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.progress.write_above(self.format(record))
        except Exception:
            self.handleError(record)


@dataclass
class _Part:
    """What is known of one part: its last event, and when (by the drawing clock) it arrived."""

    what: str
    step: str = ""
    detail: str = ""
    done: bool = False
    failed: bool = False
    first_seen: float = 0.0
    elapsed_s: float | None = None  # the emitter's, with the last event
    received: float = 0.0
    printed: bool = False

    def update(self, event: ProgressEvent, now: float) -> None:
        if not self.step:
            self.first_seen = now
        if self.done and not event.done:  # it starts again (a restart): timed afresh
            self.first_seen = now
        self.step = event.step
        self.detail = one_line(event.detail or "")
        self.done, self.failed = event.done, event.failed
        self.elapsed_s, self.received = event.elapsed_s, now

    def elapsed(self, now: float) -> float:
        """Seconds the part has run: the emitter's count (it may have run in another process, reported
        late), plus the time since that report while it still runs."""
        if self.elapsed_s is None:
            return now - self.first_seen
        return self.elapsed_s + (0.0 if self.done else now - self.received)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False


def _can_encode(stream: TextIO, text: str) -> bool:
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _fit(line: str, width: int, ellipsis: str) -> str:
    """`line` cut to fit `width - 1` columns (the last column is left free: writing into it makes some
    terminals wrap)."""
    room = max(width - 1, 8)
    if sum(_char_width(c) for c in line) <= room:
        return line
    room -= len(ellipsis)
    used, cut = 0, []
    for char in line:
        used += _char_width(char)
        if used > room:
            break
        cut.append(char)
    return "".join(cut) + ellipsis


def _clip(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."
