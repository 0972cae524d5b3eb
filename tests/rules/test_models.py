from __future__ import annotations

import copy
import pickle
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import ipybox.rules.models
from ipybox.cli.main import EXIT_ERROR, main
from ipybox.rules import ApprovalPolicy, ArgCondition, ExampleCall, Rule, ToolCall, Verdict


def load(toml: str) -> ApprovalPolicy:
    return ApprovalPolicy.model_validate(tomllib.loads(toml)["approval"])


def error(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        ApprovalPolicy.model_validate(data)
    assert info.value.error_count() == 1
    return str(info.value.errors()[0]["msg"])


def test_docstring_example_loads_and_decides() -> None:
    doc = ipybox.rules.models.__doc__
    assert doc is not None
    p = load(doc.split("```toml")[1].split("```")[0])
    assert p.default == "ask" and p.ask_timeout == 60
    read = ToolCall("filesystem", "read_file", {"path": "a"}, {"readOnlyHint": True})
    assert p.decide(read) == Verdict("allow", "read-only", "rule 'read-only' applies")
    assert (
        p.decide(ToolCall("filesystem", "write_file", {"path": "etc/x"})).rule_id == "no-writes-outside-out"
    )
    assert p.decide(ToolCall("filesystem", "write_file", {"path": "out/x"})).rule_id is None


def test_defaults() -> None:
    p = ApprovalPolicy()
    assert (p.default, p.ask_timeout, p.rules) == ("ask", 60, [])
    rule = Rule(decision="deny")
    assert (rule.server, rule.tool, rule.priority, rule.id) == ("*", "*", 0, None)


# --- shape -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "loc"),
    [
        ({"defualt": "allow"}, ("defualt",)),
        ({"rules": [{"decision": "deny", "serverr": "x"}]}, ("rules", 0, "serverr")),
        (
            {"rules": [{"decision": "deny", "args": {"p": {"glob": "x", "globb": "y"}}}]},
            ("rules", 0, "args", "p", "globb"),
        ),
        (
            {"rules": [{"decision": "deny", "match": [{"server": "s", "tool": "t", "arg": {}}]}]},
            ("rules", 0, "match", 0, "arg"),
        ),
    ],
)
def test_unknown_keys_are_rejected(data: dict[str, Any], loc: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        ApprovalPolicy.model_validate(data)
    [err] = info.value.errors()
    assert err["type"] == "extra_forbidden" and err["loc"] == loc


def test_invalid_values_are_rejected() -> None:
    assert "Input should be 'allow', 'deny' or 'ask'" in error({"default": "maybe"})
    assert "greater than 0" in error({"ask_timeout": 0})
    assert "'allow', 'deny' or 'ask'" in error({"rules": [{"decision": "yes"}]})
    assert "Field required" in error({"rules": [{"id": "x"}]})


def test_invalid_regex() -> None:
    assert error({"rules": [{"decision": "deny", "args": {"p": {"regex": "(a"}}}]}) == (
        "Value error, invalid regex '(a': missing ) at '(a'"
    )


def test_a_regex_with_look_around_is_a_load_error_saying_what_to_do() -> None:
    data = {"rules": [{"decision": "deny", "args": {"p": {"regex": "(?!out/).*"}}}]}
    with pytest.raises(ValidationError) as info:
        ApprovalPolicy.model_validate(data)
    [err] = info.value.errors()
    assert err["loc"] == ("rules", 0, "args", "p", "regex")
    assert err["msg"].startswith(
        "Value error, regex '(?!out/).*' uses look-around ('(?!' at position 0), which ipybox's linear-time "
        "regex engine does not support; rewrite it without look-around"
    )


def test_ipybox_validate_shows_a_look_around_regex_at_its_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ipybox.toml").write_text(
        '[approval]\n\n[[approval.rules]]\ndecision = "deny"\nargs = { p = { regex = "(?<=a)b" } }\n'
    )
    assert main(["validate", str(tmp_path)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"{tmp_path / 'ipybox.toml'}:5:") and "uses look-around" in err, err


# --- regexes that backtrack catastrophically in Python's re -------------------------------------------------

# With Python's re, `(a+)+` against 28 a's and a mismatch took 22 s per call (twice as long per extra
# character), on the supervisor's event loop.
CATASTROPHIC = {"id": "aaa", "tool": "t", "args": {"q": {"regex": "(a+)+"}}, "decision": "deny"}


# A guard against a hang, not a speed check: matching takes microseconds, and 10 s fails the test (by
# SIGALRM, which also interrupts a backtracking match: a thread could not, it holds the GIL throughout).
@pytest.mark.timeout(10)
def test_deciding_a_call_against_a_catastrophic_regex_returns() -> None:
    policy = ApprovalPolicy.model_validate({"default": "allow", "rules": [CATASTROPHIC]})
    call = ToolCall("s", "t", {"q": "a" * 28 + "!"})
    assert policy.decide(call) == Verdict("allow", None, "no rule applies; the default is allow")
    assert policy.decide(ToolCall("s", "t", {"q": "a" * 28})).rule_id == "aaa"


@pytest.mark.timeout(10)
def test_ipybox_validate_checks_a_catastrophic_regex_s_examples_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 83 s with Python's re: each example is matched as a call would be.
    (tmp_path / "ipybox.toml").write_text(
        "[[approval.rules]]\n"
        'id = "aaa"\ntool = "t"\nargs = { q = { regex = "(a+)+" } }\ndecision = "deny"\n'
        f'match = [{{ server = "s", tool = "t", args = {{ q = "{"a" * 28}" }} }}]\n'
        f'not_match = [{{ server = "s", tool = "t", args = {{ q = "{"a" * 28}!" }} }}]\n'
    )
    assert main(["validate", str(tmp_path)]) == 0
    assert "ok (0 servers, 1 approval rules" in capsys.readouterr().out


def test_condition_needs_a_condition() -> None:
    assert error({"rules": [{"decision": "deny", "args": {"p": {}}}]}) == (
        "Value error, an argument condition needs at least one of: equals, in, not_in, glob, not_glob, regex, exists, from"
    )


def test_exists_false_cannot_be_combined() -> None:
    assert error(
        {"rules": [{"decision": "deny", "args": {"p": {"exists": False, "in": [1], "glob": "*"}}}]}
    ) == (
        "Value error, `exists = false` cannot be combined with in, glob: those fail on an absent argument, "
        "so the condition could never hold"
    )
    assert ArgCondition(exists=True, glob="*").conditions() == ["glob", "exists"]


def test_empty_in_is_rejected() -> None:
    assert "`in = []` can never hold" in error({"rules": [{"decision": "deny", "args": {"p": {"in": []}}}]})


def test_bare_list_is_ambiguous() -> None:
    assert error({"rules": [{"decision": "deny", "args": {"p": ["a", "b"]}}]}) == (
        "Value error, args.p: a bare list is ambiguous; write { in = ['a', 'b'] } for any of these values "
        "or { equals = ['a', 'b'] } for this exact list"
    )


def test_nested_table_that_is_no_condition_gets_a_hint() -> None:
    msg = error({"rules": [{"decision": "deny", "args": {"options": {"mode": "x"}}}]})
    assert 'use a dotted key ("options.mode" = ...)' in msg
    assert "{ equals = { ... } }" in msg


def test_malformed_arg_path() -> None:
    assert "'a..b' is not a valid argument path" in error(
        {"rules": [{"decision": "deny", "args": {"a..b": 1}}]}
    )


def test_empty_glob_list() -> None:
    assert "use '*' to match any name" in error({"rules": [{"decision": "deny", "tool": []}]})


@pytest.mark.parametrize("where", ["rule", "example"])
def test_unknown_annotation_names_the_known_ones(where: str) -> None:
    rule: dict[str, Any] = {"decision": "deny"}
    if where == "rule":
        rule["annotations"] = {"readonlyHint": True}
    else:
        rule["match"] = [{"server": "s", "tool": "t", "annotations": {"readonlyHint": True}}]
    assert error({"rules": [rule]}) == (
        "Value error, unknown annotation 'readonlyHint' (did you mean 'readOnlyHint'?); "
        "known annotations: destructiveHint, idempotentHint, openWorldHint, readOnlyHint"
    )


def test_duplicate_ids() -> None:
    assert error({"rules": [{"id": "a", "decision": "deny"}, {"id": "a", "decision": "allow"}]}) == (
        "Value error, rule ids must be unique; duplicated: 'a'"
    )


def test_ids_that_could_be_confused() -> None:
    assert "must not be empty" in error({"rules": [{"id": "", "decision": "deny"}]})
    assert error({"rules": [{"id": "rules[0]", "decision": "deny"}]}) == (
        "Value error, 'rules[0]' is how rules without an id are named; choose another id"
    )
    assert Rule(id="rules[x]", decision="deny").id == "rules[x]"


# --- argument conditions -----------------------------------------------------------------------------------


def test_bare_values_and_aliases() -> None:
    rule = Rule.model_validate({"decision": "deny", "args": {"a": "x", "b": 0, "c": False, "d": {"in": [1]}}})
    assert rule.args["a"] == ArgCondition(equals="x")
    assert rule.args["b"].conditions() == ["equals"] and rule.args["b"].equals == 0
    assert rule.args["c"].equals is False
    assert rule.args["d"].one_of == [1]
    assert ArgCondition(one_of=[1]) == ArgCondition.model_validate({"in": [1]})


def test_equals_is_a_condition_only_when_given() -> None:
    assert ArgCondition(equals=None).conditions() == ["equals"]
    assert ArgCondition(glob="x").conditions() == ["glob"]


def test_dump_holds_only_the_conditions_given() -> None:
    assert ArgCondition(glob="x").model_dump() == {"glob": "x"}
    assert ArgCondition(equals=None, one_of=[1]).model_dump(by_alias=True) == {"equals": None, "in": [1]}


@pytest.mark.parametrize("by_alias", [True, False])
def test_dump_round_trips(by_alias: bool) -> None:
    p = ApprovalPolicy.model_validate(
        {
            "default": "deny",
            "rules": [
                {"id": "n", "args": {"v": {"equals": None}, "w": {"in": [1]}}, "decision": "allow"},
                {
                    "tool": ["a*", "b"],
                    "annotations": {"readOnlyHint": True},
                    "decision": "ask",
                    "priority": 2,
                },
            ],
        }
    )
    again = ApprovalPolicy.model_validate(p.model_dump(by_alias=by_alias))
    assert again == p
    call = ToolCall("s", "t", {"v": None, "w": 1})
    assert again.decide(call) == p.decide(call) == Verdict("allow", "n", "rule 'n' applies")


def test_policies_compare_by_fields() -> None:
    data = {"rules": [{"tool": "x", "decision": "deny"}]}
    assert ApprovalPolicy.model_validate(data) == ApprovalPolicy.model_validate(data)
    assert ApprovalPolicy.model_validate(data) != ApprovalPolicy.model_validate({**data, "default": "deny"})


# --- examples ----------------------------------------------------------------------------------------------

READ_ONLY = """
[approval]
[[approval.rules]]
id = "read-only"
server = "filesystem"
tool = ["read_*", "list_*"]
decision = "allow"
match = [{ server = "filesystem", tool = "read_file", args = { path = "notes.md" } }, { server = "filesystem", tool = "list_dir" }]
not_match = [{ server = "web", tool = "read_file" }, { server = "filesystem", tool = "write_file" }]
"""


def test_examples_that_agree_load() -> None:
    assert load(READ_ONLY).rules[0].match[1] == ExampleCall(server="filesystem", tool="list_dir")


def test_match_example_that_does_not_match() -> None:
    toml = """
    [approval]
    [[approval.rules]]
    id = "read-only"
    server = "filesystem"
    tool = ["read_*", "list_*"]
    decision = "allow"
    match = [{ server = "filesystem", tool = "write_file" }]
    """
    with pytest.raises(ValidationError) as info:
        load(toml)
    assert info.value.errors()[0]["msg"] == (
        "Value error, rule 'read-only': example {server='filesystem', tool='write_file'} is listed under match "
        "but the tool glob ['read_*', 'list_*'] does not match 'write_file'"
    )


def rule_with(**fields: Any) -> dict[str, Any]:
    return {"rules": [{"server": "fs", "decision": "deny"}, {"decision": "allow", **fields}]}


def test_match_example_failing_an_argument_condition() -> None:
    data = rule_with(
        args={"path": {"glob": "out/*"}}, match=[{"server": "fs", "tool": "w", "args": {"path": "in/a"}}]
    )
    assert error(data) == (
        "Value error, rules[1]: example {server='fs', tool='w', args={'path': 'in/a'}} is listed under match "
        "but argument 'path' = 'in/a' does not satisfy glob = 'out/*'"
    )


def test_match_example_failing_an_annotation() -> None:
    data = rule_with(annotations={"readOnlyHint": True}, match=[{"server": "fs", "tool": "r"}])
    assert error(data) == (
        "Value error, rules[1]: example {server='fs', tool='r'} is listed under match but the rule requires "
        "readOnlyHint = true and the tool's readOnlyHint is false (not declared, so the MCP default)"
    )


def test_not_match_example_that_matches() -> None:
    data = rule_with(
        id="outs",
        tool="write_*",
        args={"path": {"glob": "out/*"}},
        not_match=[
            {
                "server": "fs",
                "tool": "write_file",
                "args": {"path": "out/a"},
                "annotations": {"readOnlyHint": False},
            }
        ],
    )
    assert error(data) == (
        "Value error, rule 'outs': example {server='fs', tool='write_file', args={'path': 'out/a'}, "
        "annotations={readOnlyHint=false}} is listed under not_match but the rule applies to it: "
        "the tool glob 'write_*' matches 'write_file'; argument 'path' = 'out/a' satisfies glob = 'out/*'"
    )


def test_every_failing_example_is_reported_in_one_error() -> None:
    data = rule_with(
        id="r",
        tool="read",
        match=[{"server": "s", "tool": "write"}],
        not_match=[{"server": "s", "tool": "read"}],
    )
    lines = error(data).removeprefix("Value error, ").split("\n")
    assert lines == [
        "rule 'r': example {server='s', tool='write'} is listed under match but the tool glob 'read' does not match 'write'",
        "rule 'r': example {server='s', tool='read'} is listed under not_match but the rule applies to it: "
        "the tool glob 'read' matches 'read'",
    ]


def test_examples_use_the_rules_non_string_semantics() -> None:
    example = [{"server": "s", "tool": "t", "args": {"p": 1}}]
    deny = {"rules": [{"decision": "deny", "args": {"p": {"glob": "x*"}}, "match": example}]}
    assert ApprovalPolicy.model_validate(deny).rules[0].match[0].args == {"p": 1}
    allow = {"rules": [{"decision": "allow", "args": {"p": {"glob": "x*"}}, "match": example}]}
    assert "is not a string, and glob = 'x*' never holds for a non-string in an allow rule" in error(allow)


# --- copies ------------------------------------------------------------------------------------------------


def test_copies_decide_by_their_own_rules() -> None:
    p = ApprovalPolicy.model_validate({"rules": [{"id": "d", "decision": "deny"}]})
    call = ToolCall("s", "t")
    assert p.model_copy(update={"rules": []}).decide(call).rule_id is None
    assert p.model_copy(update={"default": "allow", "rules": []}).decide(call).decision == "allow"
    assert ApprovalPolicy.model_construct(default="deny").decide(call).decision == "deny"
    assert pickle.loads(pickle.dumps(p)).decide(call).rule_id == "d"
    assert copy.deepcopy(p).decide(call).rule_id == "d"
    assert p.decide(call).rule_id == "d"


# --- JSON Schema (for editors) -----------------------------------------------------------------------------


def test_json_schema_accepts_what_the_loader_accepts() -> None:
    defs = ApprovalPolicy.model_json_schema(by_alias=True)["$defs"]
    assert defs["Rule"]["properties"]["args"]["additionalProperties"] == {
        "anyOf": [
            {"$ref": "#/$defs/ArgCondition"},
            {"type": "string"},
            {"type": "number"},
            {"type": "boolean"},
        ]
    }
    assert "in" in defs["ArgCondition"]["properties"] and "one_of" not in defs["ArgCondition"]["properties"]
    names = {"enum": ["destructiveHint", "idempotentHint", "openWorldHint", "readOnlyHint"]}
    assert defs["Rule"]["properties"]["annotations"]["propertyNames"] == names
    assert defs["ExampleCall"]["properties"]["annotations"]["propertyNames"] == names
