from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ipybox.config import RuleWriteError, WrittenRule, load_config, rule_writer, write_answer_rule
from ipybox.errors import IpyboxError
from ipybox.rules import AuditLog, ToolCall
from tests.config.conftest import ROOT

WHEN = datetime(2026, 11, 24, 7, 0, tzinfo=UTC)
WRITE = ToolCall("filesystem", "write_file", {"path": "out/report.md", "content": "# Report"})


@pytest.fixture
def example(workspace: Path) -> Path:
    """A copy of the example workspace's ipybox.toml."""
    path = workspace / "ipybox.toml"
    path.write_text((ROOT / "example-workspace" / "ipybox.toml").read_text())
    return path


def write(
    path: Path, call: ToolCall, asked_by: str | None, *, accept: bool = True, **kwargs: Any
) -> WrittenRule:
    return write_answer_rule(
        path, call, accept=accept, asked_by=asked_by, by="console (root)", when=WHEN, **kwargs
    )


def inserted(before: str, after: str) -> tuple[int, str]:
    """Where `after` differs from `before` by one inserted piece of text, and that text."""
    start = 0
    while start < len(before) and before[start] == after[start]:
        start += 1
    piece = after[start : start + len(after) - len(before)]
    assert after == before[:start] + piece + before[start:], "more than one insertion"
    return start, piece


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- what is written ---------------------------------------------------------------------------------------


def test_always_allow_appends_a_commented_rule_after_the_last_rule(example: Path) -> None:
    before = example.read_text()
    written = write(example, WRITE, "ask-for-writes")
    expected = (
        "# Added by console (root) on 2026-11-24 07:00 UTC: always allow filesystem.write_file "
        "(asked by rule 'ask-for-writes').\n"
        "[[approval.rules]]\n"
        'id = "always-allow-filesystem-write_file"\n'
        'server = "filesystem"\n'
        'tool = "write_file"\n'
        'args = { path = { glob = "out/**" } }\n'
        'decision = "allow"\n'
        "priority = 11\n"
        'match = [{ server = "filesystem", tool = "write_file", args = { path = "out/report.md", content = "# Report" } }]\n'
    )
    assert written == WrittenRule("always-allow-filesystem-write_file", "allow", 11, expected, written.line)
    after = example.read_text()
    # Everything else stays byte for byte: the new rule goes between the last rule and [endpoints].
    offset, piece = inserted(before, after)
    assert piece == expected + "\n"
    assert before[:offset].endswith('{ cmd = "grep -rf patterns.txt ." } },\n]\n\n')
    assert before[offset:].startswith("[endpoints]\n")
    assert after.splitlines()[written.line - 1] == "[[approval.rules]]"
    assert after.splitlines()[written.line - 2].startswith("# Added by console (root)")
    verdict = load_config(example).approval.decide(WRITE)
    assert (verdict.decision, verdict.rule_id) == ("allow", "always-allow-filesystem-write_file")


def test_the_new_rule_covers_only_what_the_asking_rule_asked_about(example: Path) -> None:
    write(example, WRITE, "ask-for-writes")
    policy = load_config(example).approval
    elsewhere = ToolCall("filesystem", "write_file", {"path": "hello.py", "content": ""})
    other_tool = ToolCall("filesystem", "edit_file", {"path": "out/report.md", "edits": []})
    assert policy.decide(elsewhere).rule_id == "no-writes-outside-out"
    assert policy.decide(other_tool).rule_id == "ask-for-writes"


def test_always_deny_writes_a_deny_rule_above_the_asking_rule(example: Path) -> None:
    written = write(example, WRITE, "ask-for-writes", accept=False)
    assert (written.id, written.decision, written.priority) == (
        "always-deny-filesystem-write_file",
        "deny",
        11,
    )
    assert 'decision = "deny"\npriority = 11\n' in written.text
    verdict = load_config(example).approval.decide(WRITE)
    assert (verdict.decision, verdict.rule_id) == ("deny", "always-deny-filesystem-write_file")


def test_a_shell_command_asked_by_a_regex_rule(example: Path) -> None:
    pip = ToolCall("shell", "pip", {"cmd": "pip install 'requests>=2'"})
    written = write_answer_rule(
        example,
        pip,
        accept=True,
        asked_by="shell-ask-pip-install",
        by="terminal (alice on /dev/pts/3)",
        when=WHEN,
    )
    assert written.text == (
        "# Added by terminal (alice on /dev/pts/3) on 2026-11-24 07:00 UTC: always allow shell.pip "
        "(asked by rule 'shell-ask-pip-install').\n"
        "[[approval.rules]]\n"
        'id = "always-allow-shell-pip"\n'
        'server = "shell"\n'
        'tool = "pip"\n'
        'args = { cmd = { regex = "pip3? install( .*)?" } }\n'
        'decision = "allow"\n'
        "priority = 11\n"
        """match = [{ server = "shell", tool = "pip", args = { cmd = "pip install 'requests>=2'" } }]\n"""
    )
    policy = load_config(example).approval
    assert policy.decide(pip).rule_id == "always-allow-shell-pip"
    pip3 = ToolCall("shell", "pip3", {"cmd": "pip3 install requests"})
    assert policy.decide(pip3).rule_id == "shell-ask-pip-install"  # `pip3` was not what was answered


def test_a_regex_with_backslashes_is_copied_as_a_literal_string(write_config: Callable[[str], Path]) -> None:
    path = write_config(
        "[[approval.rules]]\n"
        'id = "ask-pip"\n'
        'server = "shell"\n'
        'tool = "pip"\n'
        "args = { cmd = { regex = 'pip install \\S+' } }\n"
        'decision = "ask"\n'
    )
    call = ToolCall("shell", "pip", {"cmd": "pip install rich"})
    written = write(path, call, "ask-pip")
    assert "args = { cmd = { regex = 'pip install \\S+' } }\n" in written.text
    assert "priority = 1\n" in written.text
    assert load_config(path).approval.decide(call).rule_id == "always-allow-shell-pip"


def test_a_call_asked_by_the_default_gets_a_rule_at_priority_0(write_config: Callable[[str], Path]) -> None:
    text = '# Workspace\n[approval]\ndefault = "ask"  # ask about everything\n\n# Endpoints\n[endpoints]\nport = 0\n'
    path = write_config(text)
    call = ToolCall("time", "get_current_time", {"timezone": "UTC"}, {"readOnlyHint": True, "title": "Now"})
    written = write(path, call, None)
    assert written.text == (
        "# Added by console (root) on 2026-11-24 07:00 UTC: always allow time.get_current_time (asked by the default decision).\n"
        "[[approval.rules]]\n"
        'id = "always-allow-time-get_current_time"\n'
        'server = "time"\n'
        'tool = "get_current_time"\n'
        # No condition narrowed the ask: by default the rule requires the call's exact arguments.
        'args = { timezone = "UTC" }\n'
        'decision = "allow"\n'
        "priority = 0\n"
        'match = [{ server = "time", tool = "get_current_time", args = { timezone = "UTC" }, '
        "annotations = { readOnlyHint = true } }]\n"
    )
    # After [approval]'s own keys and the blank line, before the comment that introduces [endpoints].
    assert path.read_text() == text.replace("\n# Endpoints", "\n" + written.text + "\n# Endpoints")
    assert written.line == 6
    policy = load_config(path).approval
    assert policy.decide(call).rule_id == written.id
    assert policy.decide(ToolCall("time", "convert_time")).rule_id is None


def test_a_file_without_approval_rules_gets_them_at_its_end(write_config: Callable[[str], Path]) -> None:
    path = write_config("[endpoints]\nport = 0")  # no [approval], no final newline
    written = write(path, ToolCall("s", "t"), None, accept=False)
    assert path.read_text() == "[endpoints]\nport = 0\n\n" + written.text
    assert written.line == 5
    assert load_config(path).approval.decide(ToolCall("s", "t")).decision == "deny"


def test_rules_followed_by_other_tables_and_comments_keep_them_after_the_new_rule(
    write_config: Callable[[str], Path],
) -> None:
    text = (
        "[[approval.rules]]\n"
        'id = "ask"\n'
        'decision = "ask"\n'
        "# a note at the end of the rule\n"
        "\n"
        "# Where agents reach the workspace:\n"
        "\n"
        "# loopback only\n"
        "[endpoints]\n"
        "port = 0\n"
    )
    path = write_config(text)
    written = write(path, ToolCall("s", "t"), "ask")
    assert path.read_text() == text.replace(
        'decision = "ask"\n', 'decision = "ask"\n\n' + written.text + "\n"
    )
    assert load_config(path).approval.decide(ToolCall("s", "t")).rule_id == written.id


def test_conditions_written_as_a_sub_table_are_copied_and_the_rule_follows_it(
    write_config: Callable[[str], Path],
) -> None:
    text = '[[approval.rules]]\nid = "a"\ndecision = "ask"\n[approval.rules.args]\nx = { exists = true }\n\n# eps\n[endpoints]\n'
    path = write_config(text)
    call = ToolCall("s", "t", {"x": 1})
    written = write(path, call, "a")
    assert "args = { x = { exists = true } }\n" in written.text
    assert path.read_text() == text.replace("# eps", written.text + "\n# eps")
    assert load_config(path).approval.decide(call).rule_id == written.id


def test_a_file_with_crlf_line_ends_keeps_them(workspace: Path) -> None:
    path = workspace / "ipybox.toml"
    path.write_bytes(b'[[approval.rules]]\r\nid = "a"\r\ndecision = "ask"\r\n\r\n[endpoints]\r\nport = 0\r\n')
    written = write(path, ToolCall("s", "t"), "a")
    data = path.read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n")
    assert data.split(b"\r\n")[written.line - 1] == b"[[approval.rules]]" and written.line == 6


def test_a_naive_time_is_taken_as_utc(example: Path) -> None:
    written = write_answer_rule(
        example, WRITE, accept=True, asked_by="ask-for-writes", by="x", when=datetime(2026, 1, 2, 3, 4)
    )
    assert written.text.startswith("# Added by x on 2026-01-02 03:04 UTC: ")


def test_a_rule_without_an_id_is_found_by_its_index(write_config: Callable[[str], Path]) -> None:
    path = write_config(
        '[[approval.rules]]\ndecision = "deny"\npriority = -5\n\n'
        '[[approval.rules]]\nserver = "fs"\nannotations = { readOnlyHint = false }\ndecision = "ask"\npriority = 3\n'
    )
    call = ToolCall("fs", "touch", {"path": "a"}, {"readOnlyHint": False})
    written = write(path, call, "rules[1]", accept=False)
    assert "annotations = { readOnlyHint = false }\n" in written.text
    assert "priority = 4\n" in written.text
    assert "(asked by rule 'rules[1]')" in written.text
    assert load_config(path).approval.decide(call).rule_id == written.id


def test_names_with_glob_characters_match_only_themselves(write_config: Callable[[str], Path]) -> None:
    path = write_config('[approval]\ndefault = "ask"\n')
    call = ToolCall("odd*server", "tool?[1]")
    written = write(path, call, None)
    assert 'server = "odd[*]server"\ntool = "tool[?][[]1]"\n' in written.text
    assert written.id == "always-allow-odd-server-tool-1"
    policy = load_config(path).approval
    assert policy.decide(call).rule_id == written.id
    assert policy.decide(ToolCall("odd-x-server", "toolX1")).rule_id is None
    assert policy.decide(ToolCall("odd*server", "tool?1")).rule_id is None


def test_a_taken_id_gets_a_number(example: Path) -> None:
    example.write_text(
        example.read_text().replace('id = "time"', 'id = "always-allow-filesystem-write_file"')
    )
    assert write(example, WRITE, "ask-for-writes").id == "always-allow-filesystem-write_file-2"


def test_the_example_call_is_redacted_and_long_untested_strings_folded(example: Path) -> None:
    log = AuditLog(example.parent / "audit.jsonl", secrets=["hunter2-secret"])
    path = "out/" + "p" * 300 + ".md"  # tested by the rule's glob: kept whole
    call = ToolCall(
        "filesystem",
        "write_file",
        {"path": path, "content": "c" * 1000, "api_key": "k", "note": "by hunter2-secret", "opt": None},
    )
    written = write(example, call, "ask-for-writes", redact=log.redact)
    text = example.read_text()
    assert "hunter2-secret" not in text and '"k"' not in text
    assert f'path = "{path}"' in written.text
    assert f'content = "{"c" * 197}..."' in written.text
    assert 'api_key = "[redacted]", note = "by [redacted]" }' in written.text  # the null is left out
    assert load_config(example).approval.decide(call).rule_id == written.id


def test_who_answered_is_kept_on_one_comment_line(example: Path) -> None:
    written = write_answer_rule(
        example,
        WRITE,
        accept=True,
        asked_by="ask-for-writes",
        by="console (eve)\n[[approval.rules]]",
        when=WHEN,
    )
    assert written.text.startswith("# Added by console (eve) [[approval.rules]] on 2026-11-24 07:00 UTC:")
    assert written.text.count("\n[[approval.rules]]\n") == 1


def test_the_files_mode_is_kept_and_no_temporary_file_is_left(example: Path) -> None:
    example.chmod(0o640)
    write(example, WRITE, "ask-for-writes")
    assert stat.S_IMODE(example.stat().st_mode) == 0o640
    assert files_in(example.parent) == ["ipybox.toml"]


# --- refusals ----------------------------------------------------------------------------------------------


def refused(path: Path, call: ToolCall, asked_by: str | None, *, accept: bool = True, **kwargs: Any) -> str:
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(RuleWriteError) as raised:
        write(path, call, asked_by, accept=accept, **kwargs)
    if before is not None:
        assert path.read_bytes() == before, "a refused rule must leave the file as it was"
    assert [name for name in files_in(path.parent) if name.endswith(".tmp")] == []
    return str(raised.value)


def test_a_rule_that_would_not_decide_the_call_is_refused_before_the_file_is_read_again(
    example: Path,
) -> None:
    # The ask rule's glob holds for a non-string path (caution); an allow rule's glob does not, so the
    # call itself would not match the rule written for it: refused before the loader is asked.
    before = example.read_text()
    call = ToolCall("filesystem", "write_file", {"path": ["out/a.md"], "content": ""})
    message = refused(example, call, "ask-for-writes")
    assert message.startswith(f"no rule was written into {example}: the rule would not decide this call: ")
    assert "never holds for a non-string in an allow rule" in message
    assert example.read_text() == before


def test_an_allow_rule_that_would_outrank_a_deny_for_the_same_tool_is_refused(
    write_config: Callable[[str], Path],
) -> None:
    path = write_config(
        "[[approval.rules]]\n"
        'id = "ask-writes"\nserver = "fs"\ntool = "write*"\ndecision = "ask"\npriority = 10\n\n'
        "[[approval.rules]]\n"
        'id = "no-secrets"\nserver = "*"\ntool = "write_file"\nargs = { path = { glob = "secret/**" } }\n'
        'decision = "deny"\npriority = 10\n'
    )
    call = ToolCall("fs", "write_file", {"path": "out/a"})
    message = refused(path, call, "ask-writes")
    assert "rule 'no-secrets' denies fs.write_file calls at priority 10" in message
    assert "an allow rule at priority 11 would outrank it" in message
    assert '"Allow once" and "allow for this session" still work' in message
    write(path, call, "ask-writes", accept=False)  # denying always outranks nothing it should not


def test_an_allow_rule_for_the_default_refuses_to_outrank_a_deny_below_0(
    write_config: Callable[[str], Path],
) -> None:
    path = write_config(
        '[[approval.rules]]\nid = "deny-low"\nserver = "fs"\ntool = "write"\nargs = { mode = "x" }\ndecision = "deny"\npriority = -1\n\n'
        '[[approval.rules]]\nid = "deny-other-tool"\nserver = "fs"\ntool = "read"\ndecision = "deny"\npriority = -1\n'
    )
    assert "rule 'deny-low' denies fs.write calls at priority -1" in refused(
        path, ToolCall("fs", "write"), None
    )
    assert write(path, ToolCall("fs", "read_all"), None).priority == 0  # no deny names fs.read_all


def test_rules_in_effect_from_the_environment_are_refused(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = [{"id": "ask-for-writes", "server": "filesystem", "decision": "ask", "priority": 3}]
    monkeypatch.setenv("IPYBOX_APPROVAL__RULES", json.dumps(rules))
    message = refused(example, WRITE, "ask-for-writes")
    assert "the rule that asked, 'ask-for-writes', is not written in it as it is in effect" in message
    assert "IPYBOX_APPROVAL__RULES" in message
    monkeypatch.setenv("IPYBOX_APPROVAL__RULES", "[]")
    message = refused(example, ToolCall("fs", "t"), None)
    assert "the rule would not take effect: the rules in effect come from the environment" in message


def test_an_asking_rule_that_is_gone_or_changed_is_refused(example: Path) -> None:
    assert "the rule that asked, 'gone', is not among the rules in effect" in refused(example, WRITE, "gone")
    assert "rule 'time' now decides allow" in refused(example, WRITE, "time")
    outside = ToolCall("filesystem", "write_file", {"path": "elsewhere"})
    assert "rule 'ask-for-writes' no longer applies to this call" in refused(
        example, outside, "ask-for-writes"
    )


def test_a_tested_null_argument_is_refused(write_config: Callable[[str], Path]) -> None:
    path = write_config(
        '[[approval.rules]]\nid = "a"\nargs = { mode = { exists = true } }\ndecision = "ask"\n'
    )
    message = refused(path, ToolCall("s", "t", {"mode": None}), "a")
    assert "the call's argument 'mode' is null, which TOML cannot hold" in message


def test_inline_rules_are_refused(write_config: Callable[[str], Path]) -> None:
    path = write_config('[approval]\nrules = [{ id = "a", decision = "ask" }]\n')
    assert "its rules are written inline" in refused(path, ToolCall("s", "t"), "a")


def test_a_file_that_does_not_load_now_is_refused(write_config: Callable[[str], Path]) -> None:
    path = write_config('[approval]\ndefault = "maybe"\n')
    message = refused(path, ToolCall("s", "t"), None)
    assert message.startswith(f"no rule was written into {path}: it does not load as it is; fix it")
    assert f"{path}:2:" in message


def test_a_symlinked_config_is_refused(example: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.toml"
    example.rename(target)
    example.symlink_to(target)
    before = target.read_text()
    message = refused(example, WRITE, "ask-for-writes")
    assert "it is a symlink, and ipybox does not write through one" in message
    assert target.read_text() == before and example.is_symlink()


def test_a_fifo_is_refused_without_blocking(workspace: Path) -> None:
    os.mkfifo(workspace / "ipybox.toml")
    assert "it is not a regular file" in refused(workspace / "ipybox.toml", WRITE, None)


def test_a_file_changed_while_writing_is_read_again_once(
    example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = rule_writer._took_effect
    edits: list[int] = []

    def edited_meanwhile(*args: Any) -> str | None:
        why = check(*args)
        if not edits:  # someone saves the file while the rule is being written, once
            edits.append(1)
            example.write_text(example.read_text() + "\n# edited meanwhile\n")
        return why

    monkeypatch.setattr(rule_writer, "_took_effect", edited_meanwhile)
    written = write(example, WRITE, "ask-for-writes")
    text = example.read_text()
    assert text.endswith("\n# edited meanwhile\n") and written.text in text  # both: nothing was lost


def test_a_file_that_keeps_changing_is_refused(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check = rule_writer._took_effect

    def edited_meanwhile(*args: Any) -> str | None:
        why = check(*args)
        example.write_text(example.read_text() + "# edited meanwhile\n")
        return why

    monkeypatch.setattr(rule_writer, "_took_effect", edited_meanwhile)
    with pytest.raises(RuleWriteError, match="changed while it was being written, twice"):
        write(example, WRITE, "ask-for-writes")
    assert example.read_text().count("# edited meanwhile") == 2 and "always-allow" not in example.read_text()
    assert files_in(example.parent) == ["ipybox.toml"]


def test_a_refusal_is_an_ipybox_error_and_a_value_error() -> None:
    assert issubclass(RuleWriteError, IpyboxError) and issubclass(RuleWriteError, ValueError)


def test_a_rule_written_for_a_path_in_the_workspace_names_it_by_placeholder_and_travels(
    tmp_path: Path,
) -> None:
    # The asking rule names the workspace as `ipybox init` writes it; the loader fills it in.
    workspace, elsewhere = (tmp_path / "ws").resolve(), (tmp_path / "copy").resolve()
    workspace.mkdir()
    elsewhere.mkdir()
    (workspace / "ipybox.toml").write_text(
        '[[approval.rules]]\nid = "ask-in-out"\nserver = "filesystem"\ntool = "write_file"\n'
        'args = { path = { glob = "{workspace_glob}/out/**" } }\ndecision = "ask"\n'
    )
    call = ToolCall("filesystem", "write_file", {"path": f"{workspace}/out/report.md", "content": ""})

    written = write(workspace / "ipybox.toml", call, "ask-in-out")

    text = (workspace / "ipybox.toml").read_text()
    assert str(tmp_path) not in text
    assert 'args = { path = { glob = "{workspace_glob}/out/**" } }' in written.text
    assert 'args = { path = "{workspace}/out/report.md", content = "" }' in written.text
    # Checked out elsewhere, the file loads and the rule decides the same call there.
    (elsewhere / "ipybox.toml").write_text(text)
    moved = ToolCall("filesystem", "write_file", {"path": f"{elsewhere}/out/report.md", "content": ""})
    verdict = load_config(elsewhere).approval.decide(moved)
    assert (verdict.decision, verdict.rule_id) == ("allow", written.id)
