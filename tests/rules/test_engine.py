from __future__ import annotations

import fnmatch
import itertools
import pickle
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipybox.rules import ApprovalPolicy, Decision, Rule, ToolCall, Verdict
from ipybox.rules.engine import SEVERITY, RuleEngine

CALL = ToolCall("fs", "write_file", {"path": "out/a"})


def policy(*rules: dict[str, Any], default: Decision = "ask") -> ApprovalPolicy:
    return ApprovalPolicy.model_validate({"default": default, "rules": list(rules)})


@pytest.mark.parametrize("default", ["allow", "deny", "ask"])
def test_default_applies_when_no_rule_does(default: Decision) -> None:
    p = policy({"id": "other", "server": "web", "decision": "allow"}, default=default)
    assert p.decide(CALL) == Verdict(default, None, f"no rule applies; the default is {default}")
    assert policy(default=default).decide(CALL).decision == default


@pytest.mark.parametrize("order", list(itertools.permutations(["allow", "ask", "deny"])))
def test_equal_priority_deny_beats_ask_beats_allow(order: tuple[Decision, ...]) -> None:
    rules = [{"id": d, "decision": d} for d in order]
    assert policy(*rules).decide(CALL).rule_id == "deny"
    without_deny = [r for r in rules if r["decision"] != "deny"]
    assert policy(*without_deny).decide(CALL).rule_id == "ask"


def test_higher_priority_wins_over_severity() -> None:
    p = policy(
        {"id": "deny-writes", "tool": "write_*", "decision": "deny"},
        {"id": "allow-out", "args": {"path": {"glob": "out/*"}}, "decision": "allow", "priority": 10},
    )
    assert p.decide(CALL) == Verdict("allow", "allow-out", "rule 'allow-out' applies")
    assert p.decide(ToolCall("fs", "write_file", {"path": "etc/x"})).rule_id == "deny-writes"


def test_negative_priority_loses() -> None:
    p = policy({"id": "low", "decision": "deny", "priority": -1}, {"id": "zero", "decision": "allow"})
    assert p.decide(CALL).rule_id == "zero"


def test_tie_goes_to_the_first_rule_in_file_order() -> None:
    p = policy({"id": "first", "decision": "deny"}, {"id": "second", "decision": "deny"})
    assert p.decide(CALL).rule_id == "first"


def test_rules_without_id_are_named_by_index() -> None:
    p = policy(
        {"id": "named", "server": "web", "decision": "allow"},
        {"server": "other", "decision": "allow"},
        {"server": "fs", "decision": "deny"},
    )
    assert p.decide(CALL) == Verdict("deny", "rules[2]", "rules[2] applies")


def test_decide_compiles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    p = policy(
        {
            "tool": ["read_*", "list_?"],
            "args": {"path": {"regex": "[a-z/]+", "not_glob": "secret*"}},
            "decision": "allow",
        }
    )

    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("compiled while deciding")

    monkeypatch.setattr(re, "compile", forbidden)
    monkeypatch.setattr(fnmatch, "translate", forbidden)
    assert p.decide(ToolCall("fs", "read_file", {"path": "notes/a"})).decision == "allow"
    assert p.decide(ToolCall("fs", "read_file", {"path": "secret/a"})).decision == "ask"


def test_engine_equality_and_pickling() -> None:
    rules = [Rule(decision="deny", tool="write_*")]
    engine = RuleEngine(rules, "ask")
    assert engine == RuleEngine(list(rules), "ask")
    assert engine != RuleEngine(rules, "allow")
    assert engine != RuleEngine([], "ask")
    restored = pickle.loads(pickle.dumps(engine))
    assert restored == engine
    assert restored.decide(CALL) == engine.decide(CALL) == Verdict("deny", "rules[0]", "rules[0] applies")


# --- properties --------------------------------------------------------------------------------------------

NAMES = ["a", "b", "ab"]
GLOBS = ["*", "a", "b", "a*", "?b"]
DECISIONS: list[Decision] = ["allow", "ask", "deny"]

rule_dicts = st.fixed_dictionaries(
    {
        "server": st.sampled_from(GLOBS) | st.lists(st.sampled_from(GLOBS), min_size=1, max_size=2),
        "tool": st.sampled_from(GLOBS),
        "decision": st.sampled_from(DECISIONS),
        "priority": st.integers(-3, 3),
    },
    optional={"args": st.just({"x": {"in": [1, 2]}}), "annotations": st.just({"readOnlyHint": True})},
)
calls = st.builds(
    ToolCall,
    server=st.sampled_from(NAMES),
    tool=st.sampled_from(NAMES),
    args=st.fixed_dictionaries({}, optional={"x": st.integers(0, 3)}),
    annotations=st.fixed_dictionaries({}, optional={"readOnlyHint": st.booleans()}),
)


def reference(rules: list[dict[str, Any]], default: Decision, call: ToolCall) -> tuple[Decision, str | None]:
    """The spec, written the slow way."""

    def globs(value: str | list[str]) -> list[str]:
        return [value] if isinstance(value, str) else value

    def applies(rule: dict[str, Any]) -> bool:
        return (
            any(fnmatch.fnmatchcase(call.server, g) for g in globs(rule["server"]))
            and fnmatch.fnmatchcase(call.tool, rule["tool"])
            and ("args" not in rule or call.args.get("x") in (1, 2))
            and ("annotations" not in rule or call.annotations.get("readOnlyHint", False) is True)
        )

    best: tuple[int, int, int] | None = None
    for index, rule in enumerate(rules):
        if applies(rule):
            key = (rule["priority"], SEVERITY[rule["decision"]], -index)
            best = key if best is None or key > best else best
    if best is None:
        return default, None
    index = -best[2]
    return rules[index]["decision"], f"rules[{index}]"


@settings(max_examples=300, deadline=None)
@given(rules=st.lists(rule_dicts, max_size=6), default=st.sampled_from(DECISIONS), call=calls)
@pytest.mark.integration  # no process, but a property test that takes seconds
def test_decide_agrees_with_the_reference(
    rules: list[dict[str, Any]], default: Decision, call: ToolCall
) -> None:
    verdict = policy(*rules, default=default).decide(call)
    assert (verdict.decision, verdict.rule_id) == reference(rules, default, call)


@settings(max_examples=200, deadline=None)
@given(rules=st.lists(rule_dicts, max_size=6), default=st.sampled_from(DECISIONS), call=calls)
@pytest.mark.integration  # no process, but a property test that takes seconds
def test_catch_all_deny_at_top_priority_always_wins(
    rules: list[dict[str, Any]], default: Decision, call: ToolCall
) -> None:
    top = max((rule["priority"] for rule in rules), default=0)
    guard = {"id": "guard", "decision": "deny", "priority": top}
    assert policy(guard, *rules, default=default).decide(call) == Verdict(
        "deny", "guard", "rule 'guard' applies"
    )
    # Last in the file, an earlier deny at the same priority may be named instead, but the call is denied.
    assert policy(*rules, guard, default=default).decide(call).decision == "deny"
