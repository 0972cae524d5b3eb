"""The preview of an `always` rule and the person's narrowing of it (`preview_answer_rule`,
`answer_rule_text`), and switching or removing rules (`edit_rule`): golden TOML text, no processes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ipybox.config import load_config
from ipybox.config.rule_edit import (
    RuleEditError,
    edit_rule,
    rule_args_text,
    set_rule_args,
    written_by_an_answer,
)
from ipybox.config.rule_writer import (
    RuleWriteError,
    default_choices,
    preview_answer_rule,
    write_answer_rule,
)
from ipybox.rules import ToolCall

WHEN = datetime(2026, 11, 24, 7, 0, tzinfo=UTC)
ASKING = (
    "# Workspace\n"
    "[approval]\n"
    'default = "allow"\n'
    "\n"
    "[[approval.rules]]\n"
    'id = "ask-writes"\n'
    'server = "fs"\n'
    'tool = "write_file"\n'
    'decision = "ask"\n'
    "priority = 5\n"
)
CALL = ToolCall("fs", "write_file", {"path": "out/a.md", "content": "hi", "mode": 0o644, "tags": ["x"]})
HEADER = (
    "# Added by console (root) on 2026-11-24 07:00 UTC: always allow fs.write_file (asked by rule 'ask-writes').\n"
    "[[approval.rules]]\n"
    'id = "always-allow-fs-write_file"\n'
    'server = "fs"\n'
    'tool = "write_file"\n'
)
TAIL = (
    'decision = "allow"\n'
    "priority = 6\n"
    'match = [{ server = "fs", tool = "write_file", args = { path = "out/a.md", content = "hi", mode = 420, tags = ["x"] } }]\n'
)


def preview(path: Path, call: ToolCall = CALL, **kwargs: Any) -> str:
    return preview_answer_rule(
        path, call, accept=True, asked_by="ask-writes", by="console (root)", when=WHEN, **kwargs
    ).text


def test_the_default_preview_of_an_unconditioned_ask_requires_every_argument_exactly(
    write_config: Callable[[str], Path],
) -> None:
    path = write_config(ASKING)
    written = preview_answer_rule(
        path, CALL, accept=True, asked_by="ask-writes", by="console (root)", when=WHEN
    )
    assert written.text == (
        HEADER
        + 'args = { path = "out/a.md", content = "hi", mode = 420, tags = { equals = ["x"] } }\n'
        + TAIL
    )
    assert dict(written.choices) == {"path": "exact", "content": "exact", "mode": "exact", "tags": "exact"}
    assert path.read_text() == ASKING, "a preview writes nothing"


def test_narrowing_to_a_glob_and_any_value_is_what_the_rule_says_and_still_decides_the_call(
    write_config: Callable[[str], Path],
) -> None:
    path = write_config(ASKING)
    choices = {"path": "glob:out/*", "content": "any", "mode": "any", "tags": "any"}
    text = preview(path, choices=choices)
    assert text == HEADER + 'args = { path = { glob = "out/*" } }\n' + TAIL
    written = write_answer_rule(
        path, CALL, accept=True, asked_by="ask-writes", by="console (root)", when=WHEN, choices=choices
    )
    assert written.text == text
    policy = load_config(path).approval
    assert policy.decide(CALL).rule_id == "always-allow-fs-write_file"
    other = ToolCall("fs", "write_file", {"path": "etc/passwd", "content": "hi", "mode": 0, "tags": []})
    assert policy.decide(other).rule_id == "ask-writes"


def test_any_arguments_is_an_explicit_choice(write_config: Callable[[str], Path]) -> None:
    path = write_config(ASKING)
    text = preview(path, choices=dict.fromkeys(CALL.args, "any"))
    assert text == HEADER + TAIL


@pytest.mark.parametrize(
    ("choices", "why"),
    [
        ({"path": "glob:src/*"}, "the glob 'src/*' does not match this call's value 'out/a.md'"),
        ({"mode": "glob:4*"}, "argument 'mode': a glob is for string arguments"),
        ({"nope": "any"}, "'nope' is not an argument of this call"),
        ({"path": "prefix"}, "choose any, exact or glob:PATTERN, not 'prefix'"),
        ({"path": "glob:"}, "the glob is empty"),
    ],
)
def test_a_choice_that_would_not_decide_the_call_is_refused_naming_the_argument(
    write_config: Callable[[str], Path], choices: dict[str, str], why: str
) -> None:
    path = write_config(ASKING)
    with pytest.raises(RuleWriteError, match="no rule was written") as raised:
        preview(path, choices=choices)
    assert why in str(raised.value)


def test_an_asking_rule_with_conditions_keeps_them_and_adds_the_narrowing(
    write_config: Callable[[str], Path],
) -> None:
    path = write_config(
        ASKING.replace('decision = "ask"', 'args = { path = { glob = "out/**" } }\ndecision = "ask"')
    )
    call = ToolCall("fs", "write_file", {"path": "out/a.md"})
    assert preview(path, call).count('args = { path = { glob = "out/**" } }\n') == 1  # default: as asked
    assert 'args = { path = { glob = "out/**", equals = "out/a.md" } }\n' in preview(
        path, call, choices={"path": "exact"}
    )
    with pytest.raises(RuleWriteError, match="already requires glob"):
        preview(path, call, choices={"path": "glob:out/*"})


def test_secrets_nulls_and_dotted_names_default_to_any_and_cannot_be_required_exactly() -> None:
    call = ToolCall("s", "t", {"token": "sk-1", "gone": None, "a.b": 1, "ok": 2})
    redacted = {"token": "[redacted]", "gone": None, "a.b": 1, "ok": 2}
    assert default_choices(call, {}, redacted) == {"token": "any", "gone": "any", "a.b": "any", "ok": "exact"}


def test_an_exact_workspace_path_is_written_relative_to_the_workspace(
    write_config: Callable[[str], Path], workspace: Path
) -> None:
    path = write_config(ASKING)
    call = ToolCall("fs", "write_file", {"path": f"{workspace.resolve()}/out/a.md"})
    assert 'args = { path = "{workspace}/out/a.md" }\n' in preview(path, call)


# --- switching and removing rules ---------------------------------------------------------------------


def written_rule(path: Path) -> str:
    return write_answer_rule(
        path,
        CALL,
        accept=True,
        asked_by="ask-writes",
        by="console (root)",
        when=WHEN,
        choices=dict.fromkeys(CALL.args, "any"),
    ).id


def test_disabling_a_hand_written_rule_adds_one_line_and_enabling_takes_it_out(
    write_config: Callable[[str], Path],
) -> None:
    path = write_config(ASKING)
    assert edit_rule(path, "ask-writes", "disable").describe() == "Rule 'ask-writes' disabled."
    assert path.read_text() == ASKING.replace("[[approval.rules]]\n", "[[approval.rules]]\nenabled = false\n")
    policy = load_config(path).approval
    assert policy.decide(CALL).decision == "allow" and policy.decide(CALL).rule_id is None
    assert edit_rule(path, "ask-writes", "disable").describe() == "Rule 'ask-writes' was disabled already."
    edit_rule(path, "ask-writes", "enable")
    assert path.read_text() == ASKING


def test_a_rule_an_answer_wrote_is_removed_with_its_comment_leaving_the_file_as_before(
    write_config: Callable[[str], Path],
) -> None:
    trailer = "\n# Endpoints\n[endpoints]\nport = 0\n"
    path = write_config(ASKING + trailer)
    rule = written_rule(path)
    assert written_by_an_answer(path.read_text(), rule)
    assert not written_by_an_answer(path.read_text(), "ask-writes")
    edit_rule(path, rule, "disable")
    assert edit_rule(path, rule, "remove").describe() == f"Rule {rule!r} removed."
    assert path.read_text() == ASKING + trailer


def test_a_hand_written_rule_is_not_removed(write_config: Callable[[str], Path]) -> None:
    path = write_config(ASKING)
    with pytest.raises(RuleEditError, match=r"written by hand .* disable it instead"):
        edit_rule(path, "ask-writes", "remove")
    assert path.read_text() == ASKING


def test_an_unknown_rule_or_inline_rules_are_refused_unchanged(write_config: Callable[[str], Path]) -> None:
    path = write_config(ASKING)
    with pytest.raises(RuleEditError, match="no rule in effect has this id"):
        edit_rule(path, "nope", "disable")
    inline = '[approval]\nrules = [{ id = "r", decision = "deny" }]\n'
    path = write_config(inline)
    with pytest.raises(RuleEditError, match=r"not all written as \[\[approval.rules\]\] tables"):
        edit_rule(path, "r", "disable")
    assert path.read_text() == inline


def test_rules_without_an_id_are_switched_by_their_index(write_config: Callable[[str], Path]) -> None:
    text = '[[approval.rules]]\ntool = "a"\ndecision = "deny"\n\n[[approval.rules]]\ntool = "b"\ndecision = "deny"\n'
    path = write_config(text)
    edit_rule(path, "rules[1]", "disable")
    rules = load_config(path).approval.rules
    assert [rule.enabled for rule in rules] == [True, False]


def test_the_arguments_of_a_rule_an_answer_wrote_are_rewritten_in_place_and_checked(
    write_config: Callable[[str], Path],
) -> None:
    path = write_config(ASKING)
    rule = write_answer_rule(
        path, CALL, accept=True, asked_by="ask-writes", by="console (root)", when=WHEN
    ).id
    assert rule_args_text(path.read_text(), rule).startswith('{ path = "out/a.md", content = "hi"')
    before = path.read_text()
    done = set_rule_args(path, rule, '{ path = { glob = "out/*" } }')
    assert done.describe() == f"Rule {rule!r}: its argument conditions changed."
    after = path.read_text()
    old_line = next(line for line in before.splitlines() if line.startswith("args = "))
    assert after == before.replace(old_line, 'args = { path = { glob = "out/*" } }')
    assert load_config(path).approval.decide(CALL).rule_id == rule
    # Conditions the rule's own `match` example (the call answered) does not meet: the loader refuses.
    with pytest.raises(RuleEditError, match="would not load with these arguments"):
        set_rule_args(path, rule, '{ path = { glob = "src/*" } }')
    with pytest.raises(RuleEditError, match="not a TOML inline table"):
        set_rule_args(path, rule, "{ path = ")
    with pytest.raises(RuleEditError, match="written by hand"):
        set_rule_args(path, "ask-writes", "{ path = 1 }")
    assert path.read_text() == after
    set_rule_args(path, rule, "")  # any arguments: the line goes
    assert "args = " not in path.read_text().split(rule)[1].split("match = ")[0]
