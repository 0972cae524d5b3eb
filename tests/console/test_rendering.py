"""What the console shows: long values folded, and the rules listed in the order that decides."""

from __future__ import annotations

import itertools

from ipybox.console.rendering import FOLD_CHARS, args_view, rules_in_order, show_json
from ipybox.rules import ToolCall
from ipybox.rules.engine import RuleEngine
from tests.console.targets import policy_of


def test_short_values_show_whole_and_long_or_multiline_ones_fold() -> None:
    short, long, lines, nested = args_view(
        {"path": "a.md", "content": "x" * (FOLD_CHARS + 1), "script": "a\nb", "opts": {"k": [1, 2]}}
    )
    assert (short.folded, short.text) == (False, "a.md")
    assert long.folded and long.summary == "x" * 80 + f"… ({FOLD_CHARS + 1} characters)"
    assert lines.folded and lines.summary == "a… (3 characters)"
    assert nested.folded and nested.text == '{\n  "k": [\n    1,\n    2\n  ]\n}'


def test_values_are_shown_as_json_except_strings() -> None:
    assert [show_json(v) for v in ["a", 1, True, None, [], {}]] == ["a", "1", "true", "null", "[]", "{}"]


def test_the_first_listed_rule_that_applies_is_the_one_that_decides() -> None:
    policy = policy_of()
    engine = RuleEngine(policy.rules, policy.default)
    rows = rules_in_order(policy)
    calls = [
        ToolCall(server, tool, {"path": path}, annotations)
        for server, tool, path, annotations in itertools.product(
            ["filesystem", "shell", "memory"],
            ["write_file", "read_file", "ls", "rm"],
            ["out/a", "secrets/k", "notes"],
            [{}, {"readOnlyHint": True}],
        )
    ]
    for call in calls:
        first = next((row.id for row in rows if engine.matchers[row.index].applies(call)), None)
        assert first == policy.decide(call).rule_id, call
