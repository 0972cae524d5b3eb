from __future__ import annotations

from typing import Any

import pytest

from ipybox.rules import Rule, ToolCall
from ipybox.rules.matching import ABSENT, RuleMatcher, compile_globs, json_equal, lookup


def matcher(**rule: Any) -> RuleMatcher:
    rule.setdefault("decision", "allow")
    return RuleMatcher(Rule.model_validate(rule), rule.get("id") or "rules[0]")


def applies(
    rule: dict[str, Any],
    server: str = "srv",
    tool: str = "tool",
    args: dict[str, Any] | None = None,
    annotations: dict[str, Any] | None = None,
) -> bool:
    m = matcher(**rule)
    call = ToolCall(server, tool, args or {}, annotations or {})
    result = m.applies(call)
    # The explanation used in error messages must agree with the fast path.
    assert (m.mismatch(call) is None) is result
    return result


# --- server and tool globs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "name", "expected"),
    [
        ("filesystem", "filesystem", True),
        ("filesystem", "filesystem2", False),
        ("file*", "filesystem", True),
        ("*", "anything", True),
        ("f?le", "file", True),
        ("f?le", "fiile", False),
        ("[ab]x", "bx", True),
        ("[ab]x", "cx", False),
        ("File*", "filesystem", False),  # case-sensitive on every OS
        ("a*", "a/b", True),  # `*` crosses slashes (fnmatch, not path globbing)
    ],
)
def test_server_and_tool_globs(glob: str, name: str, expected: bool) -> None:
    assert applies({"server": glob}, server=name) is expected
    assert applies({"tool": glob}, tool=name) is expected


def test_glob_list_matches_any() -> None:
    rule = {"tool": ["read_*", "list_*"]}
    assert applies(rule, tool="read_file")
    assert applies(rule, tool="list_dir")
    assert not applies(rule, tool="write_file")


def test_server_and_tool_must_both_match() -> None:
    rule = {"server": "fs", "tool": "read"}
    assert applies(rule, server="fs", tool="read")
    assert not applies(rule, server="fs", tool="write")
    assert not applies(rule, server="web", tool="read")


def test_compile_globs() -> None:
    assert compile_globs(["a", "*"]) is None
    exact = compile_globs(["a", "b"])
    assert exact is not None and exact("a") and not exact("c")
    pattern = compile_globs(["x*", "y?"])
    assert pattern is not None and pattern("xyz") and pattern("yz") and not pattern("yzz")


# --- argument lookup ---------------------------------------------------------------------------------------


def test_lookup_dotted_paths() -> None:
    args = {"a": {"b": {"c": 1}}, "n": None, "s": "x"}
    assert lookup(args, ["a", "b", "c"]) == 1
    assert lookup(args, ["n"]) is None
    assert lookup(args, ["a", "x"]) is ABSENT
    assert lookup(args, ["s", "x"]) is ABSENT  # through a string
    assert lookup(args, ["n", "x"]) is ABSENT  # through null


def test_dotted_arg_conditions() -> None:
    rule = {"args": {"options.mode": "fast"}}
    assert applies(rule, args={"options": {"mode": "fast"}})
    assert not applies(rule, args={"options": {"mode": "slow"}})
    assert not applies(rule, args={"options": "fast"})
    assert not applies(rule, args={})


def test_literal_dotted_key_is_not_consulted() -> None:
    # Otherwise a call could show the rule one value and the server another.
    rule = {"args": {"options.mode": {"not_in": ["dangerous"]}}, "decision": "allow"}
    assert not applies(rule, args={"options.mode": "safe", "options": {"mode": "dangerous"}})
    assert not applies(rule, args={"options.mode": "safe"})


# --- argument conditions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (1, 1.0, True),
        (True, 1, False),
        (0, False, False),
        (True, True, True),
        ([1, True], [1, True], True),
        ([1, True], [1, 1], False),
        ({"k": [False]}, {"k": [False]}, True),
        ({"k": [False]}, {"k": [0]}, False),
        ({"k": 1}, {"k": 1, "j": 2}, False),
        ("1", 1, False),
        ([1], (1,), True),
        ([1], {"1": 1}, False),
        (None, None, True),
        (None, 0, False),
    ],
)
def test_json_equal(a: Any, b: Any, expected: bool) -> None:
    assert json_equal(a, b) is expected
    assert json_equal(b, a) is expected


def test_bare_value_means_equals() -> None:
    assert applies({"args": {"n": 3}}, args={"n": 3})
    assert applies({"args": {"n": 3}}, args={"n": 3.0})
    assert not applies({"args": {"n": 3}}, args={"n": "3"})
    assert applies({"args": {"flag": True}}, args={"flag": True})
    assert not applies({"args": {"flag": True}}, args={"flag": 1})


def test_equals_null_is_a_condition() -> None:
    rule = {"args": {"v": {"equals": None}}}
    assert applies(rule, args={"v": None})
    assert not applies(rule, args={"v": 0})
    assert not applies(rule, args={})


def test_equals_object() -> None:
    rule = {"args": {"v": {"equals": {"a": [1, 2]}}}}
    assert applies(rule, args={"v": {"a": [1, 2]}})
    assert not applies(rule, args={"v": {"a": [2, 1]}})


def test_in_and_not_in() -> None:
    one_of = {"args": {"mode": {"in": ["r", "rw"]}}}
    assert applies(one_of, args={"mode": "rw"})
    assert not applies(one_of, args={"mode": "w"})
    not_in = {"args": {"mode": {"not_in": ["w", 1]}}}
    assert applies(not_in, args={"mode": "r"})
    assert applies(not_in, args={"mode": True})  # True is not 1
    assert not applies(not_in, args={"mode": "w"})
    assert not applies(not_in, args={"mode": 1})


def test_glob_and_not_glob_on_strings() -> None:
    assert applies({"args": {"path": {"glob": "out/*"}}}, args={"path": "out/a/b.md"})
    assert not applies({"args": {"path": {"glob": "out/*"}}}, args={"path": "in/a"})
    assert applies({"args": {"path": {"not_glob": "out/*"}}}, args={"path": "in/a"})
    assert not applies({"args": {"path": {"not_glob": "out/*"}}}, args={"path": "out/a"})


def test_regex_matches_in_full() -> None:
    rule = {"args": {"url": {"regex": r"https://example\.com/.*"}}}
    assert applies(rule, args={"url": "https://example.com/x"})
    assert not applies(rule, args={"url": "see https://example.com/x"})
    assert not applies({"args": {"id": {"regex": "[0-9]+"}}}, args={"id": "12a"})


def test_regex_keeps_python_s_unicode_classes() -> None:
    rule = {"args": {"n": {"regex": r"\d+"}}, "decision": "deny"}
    assert applies(rule, args={"n": "١٢٣"})  # Arabic-Indic digits: digits to Python, not to plain RE2


@pytest.mark.parametrize("decision", ["allow", "ask", "deny"])
def test_a_regex_cannot_judge_a_string_with_lone_surrogates_and_resolves_toward_caution(
    decision: str,
) -> None:
    # JSON allows "\ud800"; RE2 reads UTF-8, which cannot hold it. Like a non-string: a deny guard holds,
    # an allow rule does not grant.
    rule = {"args": {"p": {"regex": "out/.*"}}, "decision": decision}
    assert applies(rule, args={"p": "out/\ud800"}) is (decision != "allow")
    assert applies(rule, args={"p": "out/a"})


def test_exists() -> None:
    assert applies({"args": {"v": {"exists": True}}}, args={"v": None})
    assert not applies({"args": {"v": {"exists": True}}}, args={})
    assert applies({"args": {"v": {"exists": False}}}, args={})
    assert not applies({"args": {"v": {"exists": False}}}, args={"v": None})
    assert applies({"args": {"a.b": {"exists": False}}}, args={"a": "not an object"})


@pytest.mark.parametrize(
    "condition",
    [
        {"equals": "x"},
        {"equals": None},
        {"in": ["x"]},
        {"not_in": ["x"]},
        {"glob": "*"},
        {"not_glob": "x"},
        {"regex": ".*"},
        {"exists": True},
    ],
)
@pytest.mark.parametrize("decision", ["allow", "ask", "deny"])
def test_absent_argument_fails_every_condition_but_exists_false(
    condition: dict[str, Any], decision: str
) -> None:
    assert not applies({"args": {"v": condition}, "decision": decision}, args={"other": "x"})


@pytest.mark.parametrize(
    "condition", [{"glob": "*"}, {"glob": "out/*"}, {"not_glob": "out/*"}, {"regex": ".*"}, {"regex": "x"}]
)
@pytest.mark.parametrize("value", [5, 1.5, True, None, ["out/a"], {"p": "out/a"}])
def test_string_conditions_on_non_strings_resolve_toward_caution(
    condition: dict[str, Any], value: Any
) -> None:
    rule = {"args": {"path": condition}}
    assert not applies({**rule, "decision": "allow"}, args={"path": value})
    assert applies({**rule, "decision": "deny"}, args={"path": value})
    assert applies({**rule, "decision": "ask"}, args={"path": value})


def test_deny_guard_cannot_be_slipped_with_a_list() -> None:
    rule = {"tool": "write_file", "args": {"path": {"not_glob": "out/**"}}, "decision": "deny"}
    assert applies(rule, tool="write_file", args={"path": ["../etc/passwd"]})
    assert applies(rule, tool="write_file", args={"path": "../etc/passwd"})
    assert not applies(rule, tool="write_file", args={"path": "out/a"})


def test_all_conditions_of_one_argument_must_hold() -> None:
    rule = {"args": {"path": {"glob": "out/*", "not_glob": "*.exe", "exists": True}}}
    assert applies(rule, args={"path": "out/a.md"})
    assert not applies(rule, args={"path": "out/a.exe"})
    assert not applies(rule, args={"path": "in/a.md"})


def test_all_arguments_must_hold() -> None:
    rule = {"args": {"a": 1, "b": {"in": [2, 3]}}}
    assert applies(rule, args={"a": 1, "b": 3, "c": "extra"})
    assert not applies(rule, args={"a": 1, "b": 4})
    assert not applies(rule, args={"a": 2, "b": 3})


# --- annotations -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "default"),
    [("readOnlyHint", False), ("destructiveHint", True), ("idempotentHint", False), ("openWorldHint", True)],
)
def test_undeclared_annotations_take_mcp_defaults(name: str, default: bool) -> None:
    assert applies({"annotations": {name: default}}) is True
    assert applies({"annotations": {name: not default}}) is False
    # MCP SDKs report an undeclared hint as None.
    assert applies({"annotations": {name: default}}, annotations={name: None}) is True


def test_declared_annotations_override_defaults() -> None:
    rule = {"annotations": {"destructiveHint": True}, "decision": "deny"}
    assert not applies(rule, annotations={"destructiveHint": False})
    assert applies(rule, annotations={"destructiveHint": True})
    assert applies(rule, annotations={"readOnlyHint": True})  # still destructive by default


def test_all_annotations_must_hold() -> None:
    rule = {"annotations": {"readOnlyHint": True, "openWorldHint": False}}
    assert applies(rule, annotations={"readOnlyHint": True, "openWorldHint": False})
    assert not applies(rule, annotations={"readOnlyHint": True})


# --- explanations ------------------------------------------------------------------------------------------


def explain(rule: dict[str, Any], **call: Any) -> str | None:
    call.setdefault("server", "srv")
    call.setdefault("tool", "tool")
    return matcher(**rule).mismatch(ToolCall(**call))


def test_mismatch_explanations() -> None:
    assert explain({"server": ["a", "b*"]}, server="c") == "the server glob ['a', 'b*'] does not match 'c'"
    assert explain({"tool": "read_*"}, tool="write") == "the tool glob 'read_*' does not match 'write'"
    assert explain({"annotations": {"readOnlyHint": True}}) == (
        "the rule requires readOnlyHint = true and the tool's readOnlyHint is false "
        "(not declared, so the MCP default)"
    )
    assert explain({"annotations": {"readOnlyHint": True}}, annotations={"readOnlyHint": False}) == (
        "the rule requires readOnlyHint = true and the tool's readOnlyHint is false"
    )
    assert (
        explain({"args": {"a.b": {"glob": "x*"}}}, args={})
        == "argument 'a.b' is absent, so glob = 'x*' does not hold"
    )
    assert explain({"args": {"p": {"glob": "x*"}}}, args={"p": 3}) == (
        "argument 'p' = 3 is not a string, and glob = 'x*' never holds for a non-string in an allow rule"
    )
    assert explain({"args": {"p": {"regex": "x.*"}}}, args={"p": "x\udc00"}) == (
        "argument 'p' = 'x\\udc00' has lone surrogates, which the regex engine cannot read, and "
        "regex = 'x.*' never holds for such a string in an allow rule"
    )
    assert (
        explain({"args": {"p": {"in": ["a"]}}}, args={"p": True})
        == "argument 'p' = true does not satisfy in = ['a']"
    )
    assert (
        explain({"args": {"p": {"exists": False}}}, args={"p": 1})
        == "argument 'p' = 1 does not satisfy exists = false"
    )
    assert explain({"server": "srv"}) is None


def test_why_it_applies() -> None:
    m = matcher(
        server="s*",
        annotations={"destructiveHint": True},
        args={"p": {"not_glob": "out/*"}, "q": {"exists": False}},
        decision="deny",
    )
    assert m.why_it_applies(ToolCall("srv", "t", {"p": 1})) == (
        "the server glob 's*' matches 'srv'; the tool's destructiveHint is true (not declared, so the MCP default); "
        "argument 'p' = 1 is not a string, which counts as satisfying not_glob = 'out/*' in a deny rule; "
        "argument 'q' is absent (exists = false)"
    )
    assert matcher(args={"p": {"regex": "x"}}, decision="deny").why_it_applies(
        ToolCall("s", "t", {"p": "\ud800"})
    ) == (
        "argument 'p' = '\\ud800' has lone surrogates, which the regex engine cannot read, which counts as "
        "satisfying regex = 'x' in a deny rule"
    )
    assert (
        matcher().why_it_applies(ToolCall("s", "t"))
        == "the rule has no conditions, so it applies to every call"
    )
