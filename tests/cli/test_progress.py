"""`ipybox.cli.progress`: events drawn on a terminal, one line per part, redrawn in place while running
and left as their final state; nothing at all when the stream is not a terminal; nothing a server sends
reaches the terminal as a control character.

The output is played back on a small terminal model (`screen`) that knows only the sequences the
renderer may use (cursor up, clear line, carriage return, newline) and fails on any other escape."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ipybox.cli.progress import TerminalProgress, progress_on_terminal
from ipybox.cli.workspace import PROGRESS_ENV
from ipybox.progress import ProgressEvent
from tests.cli.test_main import IPYBOX, ipybox
from tests.servers.params import EDGE_SERVER
from tests.servers.processes import pids_anywhere
from tests.supervisor.workspaces import make_workspace

HOSTILE = "boom\x1b[2J\x1b]0;pwned\x07\r\x1b[31mred\u202eevil\u2028next\x9b1A\x00end"


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def __init__(self, encoding: str = "utf-8") -> None:
        super().__init__()
        self._encoding = encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ev(what: str, step: str, detail: str | None = None, elapsed: float | None = None) -> ProgressEvent:
    done = step in ("ready", "failed")
    return ProgressEvent.from_dict(
        {
            "what": what,
            "step": step,
            "detail": detail,
            "done": done,
            "failed": step == "failed",
            "elapsed_s": elapsed,
        }
    )


_TOKEN = re.compile(r"\x1b\[(\d+)A|\x1b\[2K|\r|\n|[^\x1b\r\n]+|\x1b")


def screen(output: str) -> list[str]:
    """The lines a terminal shows after `output` (trailing empty line dropped)."""
    lines = [""]
    row = col = 0
    for match in _TOKEN.finditer(output):
        token = match.group(0)
        if match.group(1) is not None:
            row -= int(match.group(1))
            assert row >= 0, "the cursor went above the lines drawn"
        elif token == "\x1b[2K":
            lines[row] = ""
        elif token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif token == "\x1b":
            raise AssertionError(
                f"an escape sequence the renderer must not write: {output[match.start() :]!r}"
            )
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token) :]
            col += len(token)
    return lines[:-1] if lines[-1] == "" else lines


def renderer(stream: io.StringIO, **kwargs: object) -> tuple[TerminalProgress, Clock]:
    clock = Clock()
    return TerminalProgress(stream, clock=clock, width=100, **kwargs), clock  # type: ignore[arg-type]


def test_nothing_is_drawn_when_the_stream_is_not_a_terminal() -> None:
    stream = io.StringIO()
    with progress_on_terminal(stream) as progress:
        assert progress is None
    assert stream.getvalue() == ""


def test_nothing_is_drawn_when_quiet() -> None:
    stream = Terminal()
    with progress_on_terminal(stream, quiet=True) as progress:
        assert progress is None
    assert stream.getvalue() == ""


def test_each_part_ends_as_one_line_with_its_final_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    stream = Terminal()
    with progress_on_terminal(stream) as progress:
        assert progress is not None
        progress(ev("gateway", "starting"))
        progress(ev("server time", "connecting"))
        progress(ev("server x", "connecting"))
        progress(ev("gateway", "ready", "pid 42", elapsed=1.93))
        progress(ev("server time", "listing tools", "2 tools"))
        progress(ev("server x", "failed", "exited with code 3", elapsed=0.2))
        progress(ev("server time", "generating"))
        progress(ev("server time", "ready", "2 tools", elapsed=0.81))
    shown = screen(stream.getvalue())
    assert shown == [
        "✓ gateway       ready, pid 42  1.9 s",
        "✓ server time   ready, 2 tools  0.8 s",
        "✗ server x      failed: exited with code 3",
    ]


def test_a_running_part_is_redrawn_in_place_with_its_step_and_seconds() -> None:
    stream = Terminal()
    progress, clock = renderer(stream)
    progress(ev("server time", "connecting"))
    clock.now += 0.5
    progress(ev("server time", "generating", elapsed=0.5))
    clock.now += 0.7
    progress.tick()
    shown = screen(stream.getvalue())
    assert len(shown) == 1
    assert re.fullmatch(r". server time   generating  1\.2 s", shown[0]), shown
    progress.close()  # left as it stands, still generating, without a spinner
    assert screen(stream.getvalue()) == ["- server time   generating  1.2 s"]


def test_finished_parts_above_the_running_ones_are_never_redrawn() -> None:
    stream = Terminal()
    progress, clock = renderer(stream)
    progress(ev("tool server", "starting"))
    clock.now += 1
    progress(ev("tool server", "ready", elapsed=0.1))
    clock.now += 1
    progress(ev("gateway", "starting"))
    clock.now += 1
    before = len(stream.getvalue())
    progress(ev("gateway", "starting"))
    redraw = stream.getvalue()[before:]
    # Only the gateway's line is gone over again: the cursor goes up one line, not two.
    assert redraw.startswith("\r\x1b[1A\x1b[2K") and "tool server" not in redraw
    progress.close()
    assert [line.split()[1:3] for line in screen(stream.getvalue())] == [
        ["tool", "server"],
        ["gateway", "starting"],
    ]


def test_a_hostile_detail_reaches_the_terminal_without_control_characters() -> None:
    stream = Terminal()
    progress, clock = renderer(stream)
    progress(ev("server x\x1b[2J", "connecting", HOSTILE))
    clock.now += 1
    progress(ev("server x\x1b[2J", "failed", HOSTILE))
    progress.close()
    output = stream.getvalue()
    theirs = re.sub(r"\r\x1b\[\d+A|\x1b\[2K", "", output)  # what is left once the renderer's own are gone
    for forbidden in ("\x1b", "\x07", "\x00", "\x9b", "\r", "\u202e", "\u2028"):
        assert forbidden not in theirs
    shown = screen(output)
    assert shown == [
        "✗ server x\\x1b[2J  failed: boom\\x1b[2J\\x1b]0;pwned\\x07\\x0d\\x1b[31mred\\u202eevil\\u2028next\\x9b1A\\x00end"
    ]


def test_a_log_record_made_while_drawing_is_printed_above_the_parts_sanitised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TERM", "xterm")
    stream = Terminal()
    with progress_on_terminal(stream) as progress:
        assert progress is not None
        progress(ev("gateway", "ready", "pid 1", elapsed=1.0))
        progress(ev("server a", "connecting"))
        progress(ev("server b", "connecting"))
        logging.getLogger("ipybox.test").warning("server said %s", "hi\x1b[2J\nthere")
        logging.getLogger("ipybox.test").info("not shown: below WARNING")
        progress(ev("server a", "ready", "1 tool", elapsed=0.5))
        progress(ev("server b", "ready", "2 tools", elapsed=0.6))
    shown = screen(stream.getvalue())
    assert shown == [
        "✓ gateway       ready, pid 1  1.0 s",
        "WARNING ipybox.test: server said hi\\x1b[2J",
        "there",
        "✓ server a      ready, 1 tool  0.5 s",
        "✓ server b      ready, 2 tools  0.6 s",
    ]
    assert all(type(h).__name__ != "_LogAbove" for h in logging.getLogger().handlers)  # removed again


def test_lines_being_redrawn_are_cut_to_the_terminal_width_and_final_lines_are_whole() -> None:
    stream = Terminal()
    clock = Clock()
    progress = TerminalProgress(stream, clock=clock, width=40)
    progress(ev("server slow", "connecting"))
    clock.now += 1
    long_reason = "the server wrote a very long error message " * 3
    progress(ev("server x", "failed", long_reason))  # below a running part: still redrawn, so cut
    clock.now += 1
    progress.tick()
    shown = screen(stream.getvalue())
    assert all(len(line) <= 39 for line in shown) and shown[1].endswith("…")
    progress(ev("server slow", "ready", "1 tool"))
    progress.close()
    assert screen(stream.getvalue())[1] == f"✗ server x      failed: {long_reason.strip()}"


def test_redraws_are_throttled_to_the_interval() -> None:
    stream = Terminal()
    progress, clock = renderer(stream)
    progress(ev("kernels", "starting", "0 of 3"))
    drawn = stream.getvalue()
    for idle in (1, 2):
        clock.now += 0.01
        progress(ev("kernels", "starting", f"{idle} of 3"))
    assert stream.getvalue() == drawn  # within 0.1 s of the last draw: only marked stale
    clock.now += 0.1
    progress.tick()
    assert re.fullmatch(r". kernels       starting 2 of 3  0\.1 s", screen(stream.getvalue())[0])


def test_a_dumb_terminal_gets_each_final_line_once_and_no_escape_sequences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TERM", "dumb")
    stream = Terminal()
    with progress_on_terminal(stream) as progress:
        assert progress is not None
        progress(ev("gateway", "starting"))
        progress(ev("gateway", "ready", "pid 7", elapsed=2.0))
        progress(ev("server x", "connecting"))
        progress(ev("server x", "failed", HOSTILE))
        progress(ev("kernels", "starting", "0 of 1"))
    output = stream.getvalue()
    assert "\x1b" not in output and "\r" not in output
    assert output.splitlines() == [
        "✓ gateway       ready, pid 7  2.0 s",
        "✗ server x      failed: boom\\x1b[2J\\x1b]0;pwned\\x07\\x0d\\x1b[31mred\\u202eevil\\u2028next\\x9b1A\\x00end",
        output.splitlines()[2],
    ]
    assert output.splitlines()[2].startswith("- kernels       starting 0 of 1")


def test_a_terminal_that_cannot_encode_the_marks_gets_ascii() -> None:
    stream = Terminal(encoding="ascii")
    progress, _ = renderer(stream)
    progress(ev("gateway", "ready", "pid 1", elapsed=1.0))
    progress(ev("server x", "failed", "no"))
    progress.close()
    assert screen(stream.getvalue()) == ["+ gateway       ready, pid 1  1.0 s", "x server x      failed: no"]


def test_closing_without_events_draws_nothing() -> None:
    stream = Terminal()
    progress, _ = renderer(stream)
    progress.start()
    progress.close()
    progress.close()
    assert stream.getvalue() == ""


def failing_server(tag: str) -> str:
    """A `[servers.bad]` table of our edge server told to exit at once (after writing why to stderr)."""
    return (
        f"\n[servers.bad]\ncommand = {json.dumps(sys.executable)}\n"
        f'args = [{json.dumps(str(EDGE_SERVER))}, "--exit-at-once"]\nenv = {{ IPYBOX_TEST_TAG = "{tag}" }}\n'
    )


def run_in_pty(
    *args: str, columns: int = 200, on_output: Callable[[bytes], None] | None = None
) -> tuple[int, str]:
    """Run `ipybox *args` with a terminal (`columns` wide) as its stdin, stdout and stderr; returns its
    exit code and everything it wrote. `on_output` is called with the output so far as it grows."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    process = subprocess.Popen(
        [str(IPYBOX), *args], stdin=slave, stdout=slave, stderr=slave, env={**env, "TERM": "xterm-256color"}
    )
    os.close(slave)
    output = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # the child's side closed: all of it was read
                break
            if not data:
                break
            output += data
            if on_output is not None:
                on_output(output)
    finally:
        os.close(master)
    return process.wait(timeout=120), output.decode()


@pytest.mark.integration
def test_up_detached_on_a_terminal_shows_each_parts_progress_then_the_endpoints(tmp_path: Path) -> None:
    tag = "cli-progress"
    workspace = make_workspace(tmp_path, tag)
    with (workspace / "ipybox.toml").open("a") as config:
        config.write(failing_server(tag))
    try:
        code, output = run_in_pty("up", "-d", "-w", str(workspace))
        assert code == 1, output  # a declared server failed: a script learns that not all of it is up
        shown = screen(output.replace("\r\n", "\n"))
        summary = next(
            i for i, line in enumerate(shown) if line.startswith(f"ipybox is up in {workspace} (pid ")
        )
        parts = shown[:summary]
        failure = shown.index("`ipybox down` stops it.") + 1
        assert (
            shown[failure]
            == "ipybox: 1 of 2 declared servers failed to start (bad); the workspace runs without it:"
        )
        assert shown[failure + 1].startswith("  bad: failed (ipybox.toml:") and shown[-1].startswith(
            "fix ipybox.toml"
        )
        assert "  servers:  2 (1 ready, 1 failed)" in shown
        [bad] = [line for line in shown[summary:] if line.startswith("    bad   failed (ipybox.toml:")]
        assert "before completing the MCP handshake" in bad
        assert any(re.fullmatch(r"    edge  ready, \d+ tools", line) for line in shown[summary:])
        starts = {line.split("  ")[0]: line for line in parts}
        assert set(starts) == {
            "✓ tool server",
            "✓ gateway",
            "✓ endpoints",
            "✓ kernels",
            "✓ server edge",
            "✗ server bad",
        }, parts
        assert re.fullmatch(r"✓ gateway       ready, pid \d+  \d+\.\d s", starts["✓ gateway"])
        assert starts["✓ endpoints"].startswith("✓ endpoints     ready, control, console http://127.0.0.1:")
        assert re.fullmatch(r"✓ server edge   ready, \d+ tools  \d+\.\d s", starts["✓ server edge"])
        assert (
            "exited" in starts["✗ server bad"]
            and "before completing the MCP handshake" in starts["✗ server bad"]
        )
        assert "✓ kernels       ready, " in starts["✓ kernels"]
        # The child was told to write its events as JSON lines: nothing it started inherited that.
        for pid in pids_anywhere(tag):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert not any(entry.startswith(PROGRESS_ENV.encode()) for entry in environ), pid
    finally:
        ipybox("down", str(workspace))


@pytest.mark.integration
def test_up_detached_without_a_terminal_prints_the_summary_alone(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, "cli-progress-pipe")
    try:
        done = ipybox("up", "-d", str(workspace))
        assert done.returncode == 0 and done.stderr == ""
        assert done.stdout.startswith(f"ipybox is up in {workspace}") and "\x1b" not in done.stdout
        # Nor was the child asked for its events.
        assert '"kind":"progress"' not in (workspace / ".ipybox" / "logs" / "up.out").read_text()
    finally:
        ipybox("down", str(workspace))


@pytest.mark.integration
def test_up_in_the_foreground_on_a_terminal_shows_the_progress_before_the_endpoints(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, "cli-progress-foreground")
    stopped: list[subprocess.CompletedProcess[str]] = []
    stopping: list[threading.Thread] = []

    def stop_once_up(output: bytes) -> None:
        if b"stops it." in output and not stopping:
            # From another thread: the pty is read on meanwhile, so the stopping supervisor never blocks
            # writing its log to a full terminal.
            stopping.append(threading.Thread(target=lambda: stopped.append(ipybox("down", str(workspace)))))
            stopping[0].start()

    try:
        code, output = run_in_pty("up", str(workspace), on_output=stop_once_up)
    finally:
        for thread in stopping:
            thread.join()
        if not stopping:
            ipybox("down", str(workspace))
    assert code == 0 and stopped and stopped[0].returncode == 0, output
    shown = screen(output.replace("\r\n", "\n"))
    summary = next(i for i, line in enumerate(shown) if line.startswith(f"ipybox is up in {workspace}"))
    names = [line.split("  ")[0] for line in shown[:summary]]
    # In the order they start; the pool fills while the endpoints and servers come up.
    assert names[:2] == ["✓ tool server", "✓ gateway"]
    assert sorted(names[2:]) == ["✓ endpoints", "✓ kernels", "✓ server edge"]
    assert "Ctrl-C or `ipybox down` stops it." in shown
