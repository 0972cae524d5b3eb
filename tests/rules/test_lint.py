"""`lint_rules`: approval rules checked against the tools servers list (pure: no server is started)."""

from __future__ import annotations

from typing import Any

import pytest

from ipybox.rules import Rule
from ipybox.rules.lint import MAX_SCHEMA_DEPTH, LintFinding, ToolShape, lint_rules


def obj(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **extra}


TIME = [
    ToolShape("get_current_time", obj({"timezone": {"type": "string"}})),
    ToolShape("convert_time", obj({"source_timezone": {"type": "string"}, "time": {"type": "string"}})),
]
FS = [
    ToolShape("read_file", obj({"path": {"type": "string"}}, additionalProperties=False)),
    ToolShape(
        "write_file",
        {
            "type": "object",
            "$defs": {
                "Options": obj(
                    {
                        "mode": {"type": "string", "enum": ["overwrite", "append"]},
                        "retries": {"type": "integer"},
                    }
                )
            },
            "properties": {
                "path": {"type": "string"},
                "options": {"$ref": "#/$defs/Options"},
                "size": {"type": "integer"},
                "meta": {"anyOf": [obj({"owner": {"type": "string"}}), {"type": "null"}]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "label": {"type": ["string", "null"]},
            },
        },
    ),
]
TOOLS = {"time": TIME, "fs": FS}


def lint(*rules: dict[str, Any], unknown: tuple[str, ...] = (), tools: Any = None) -> list[LintFinding]:
    parsed = [Rule.model_validate({"decision": "allow", **rule}) for rule in rules]
    return lint_rules(parsed, TOOLS if tools is None else tools, unknown=unknown)


def only(*rules: dict[str, Any], **kwargs: Any) -> LintFinding:
    findings = lint(*rules, **kwargs)
    assert len(findings) == 1, findings
    return findings[0]


# -- tools


def test_a_misspelt_tool_is_found_with_the_real_name_suggested() -> None:
    finding = only({"server": "time", "tool": "get_current_tme"})
    assert finding == LintFinding(
        0,
        "rules[0]",
        ("tool",),
        "tool glob 'get_current_tme' matches no tool of server 'time' (did you mean 'get_current_time'?)",
        "get_current_time",
    )


def test_a_rule_is_named_by_its_id() -> None:
    finding = only({"server": "time", "id": "clock"}, {"id": "t", "server": "time", "tool": "nope"})
    assert (finding.rule_index, finding.rule_id) == (1, "t")


def test_without_a_close_name_the_tools_are_listed() -> None:
    finding = only({"server": "time", "tool": "zzz"})
    assert finding.suggestion is None
    assert "its tools: 'get_current_time', 'convert_time'" in finding.message


def test_in_a_list_of_globs_only_the_one_matching_nothing_is_found() -> None:
    finding = only({"server": "time", "tool": ["get_*", "convert_tim", "*_time"]})
    assert finding.key == ("tool", 1)
    assert finding.suggestion == "convert_time"


def test_tools_are_those_of_the_servers_the_rule_names() -> None:
    # `read_file` is a tool, of another server.
    finding = only({"server": "time", "tool": "read_file"})
    assert "matches no tool of server 'time'" in finding.message


def test_a_wildcard_server_checks_the_tools_of_every_server() -> None:
    assert lint({"tool": "read_file"}, {"server": "*", "tool": "get_*"}) == []
    finding = only({"tool": "raed_file"})
    assert finding.suggestion == "read_file"
    assert "servers 'fs', 'time'" in finding.message


def test_a_case_slip_is_suggested() -> None:
    assert only({"server": "time", "tool": "Get_Current_Time"}).suggestion == "get_current_time"


# -- servers


def test_a_server_glob_matching_no_configured_server_is_found() -> None:
    finding = only({"server": "tme", "tool": "get_current_time"})
    assert finding.key == ("server",)
    assert finding.message == "server glob 'tme' matches no configured server (did you mean 'time'?)"
    assert finding.suggestion == "time"


def test_a_server_glob_is_checked_in_a_list() -> None:
    finding = only({"server": ["time", "f?"], "tool": "*"}, {"server": ["time", "nothing*"]})
    assert (finding.rule_index, finding.key) == (1, ("server", 1))
    assert "configured: 'fs', 'time'" in finding.message


def test_a_server_configured_but_not_known_matches_and_its_rules_are_not_judged() -> None:
    # `down` failed to start: a typo can't be told from one of its tools.
    assert lint({"server": "down", "tool": "get_current_tme", "args": {"x": 1}}, unknown=("down",)) == []
    # A glob that reaches it is not judged either, even together with known servers.
    assert lint({"tool": "get_current_tme"}, unknown=("down",)) == []


def test_with_no_servers_a_server_glob_says_so() -> None:
    finding = only({"server": "time"}, tools={})
    assert finding.message == "server glob 'time' matches no configured server (no servers are configured)"


# -- shell commands and kernel questions


def test_shell_rules_name_any_program() -> None:
    assert lint({"server": "shell", "tool": "rm"}, {"server": "shell", "tool": ["git", "ls*"]}) == []
    assert lint({"server": "shell", "tool": "rm"}, tools={}) == []


def test_shell_rules_arguments_are_the_command_line() -> None:
    assert lint({"server": "shell", "tool": "git", "args": {"cmd": {"glob": "git status*"}}}) == []
    finding = only({"server": "shell", "tool": "rm", "args": {"comd": {"glob": "rm -rf *"}}})
    assert finding.key == ("args", "comd")
    assert finding.suggestion == "cmd"
    assert "shell commands" in finding.message


def test_a_wildcard_server_rule_naming_a_program_gets_a_hint() -> None:
    finding = only({"tool": "rm"})
    assert 'write server = "shell"' in finding.message


def test_kernel_questions_have_their_two_tools() -> None:
    assert lint({"server": "ipybox", "tool": ["shell", "shell_magic"]}) == []
    assert only({"server": "ipybox", "tool": "shel"}).suggestion == "shell"


# -- arguments


def test_an_undeclared_argument_is_found_with_a_suggestion() -> None:
    finding = only({"server": "fs", "tool": "write_file", "args": {"pth": {"glob": "out/*"}}})
    assert finding.key == ("args", "pth")
    assert finding.message == (
        "argument 'pth' is not declared in the schema of tool 'write_file' (did you mean 'path'?)"
    )
    assert finding.suggestion == "path"


def test_an_argument_of_a_closed_schema_does_not_exist() -> None:
    finding = only({"server": "fs", "tool": "read_file", "args": {"pth": "x"}})
    assert finding.message == (
        "argument 'pth' does not exist in tool 'read_file' (its schema allows no other arguments; "
        "did you mean 'path'?)"
    )


def test_an_argument_declared_by_one_of_the_matched_tools_is_fine() -> None:
    assert lint({"server": "fs", "args": {"size": {"exists": True}}}) == []
    assert lint({"server": "fs", "tool": "*_file", "args": {"options.mode": "append"}}) == []


def test_a_dotted_path_follows_a_ref_into_defs() -> None:
    assert lint({"server": "fs", "tool": "write_file", "args": {"options.retries": 3}}) == []
    finding = only({"server": "fs", "tool": "write_file", "args": {"options.mod": "append"}})
    assert finding.suggestion == "options.mode"
    assert "'options' has no property 'mod'" in finding.message


def test_a_dotted_path_follows_any_of() -> None:
    assert lint({"server": "fs", "tool": "write_file", "args": {"meta.owner": "me"}}) == []
    assert (
        only({"server": "fs", "tool": "write_file", "args": {"meta.ownr": "me"}}).suggestion == "meta.owner"
    )


def test_a_path_into_a_non_object_never_reaches_a_value() -> None:
    finding = only({"server": "fs", "tool": "write_file", "args": {"tags.first": "x"}})
    assert "'tags' is an array in the schema of tool 'write_file', not an object" in finding.message


def test_a_dotted_path_through_all_of_and_additional_properties() -> None:
    schema = {
        "type": "object",
        "properties": {
            "merged": {"allOf": [obj({"a": {"type": "string"}}), obj({"b": {"type": "integer"}})]},
            "scores": {"type": "object", "additionalProperties": {"type": "number"}},
        },
    }
    tools = {"s": [ToolShape("t", schema)]}
    assert lint({"args": {"merged.a": "x", "merged.b": 1, "scores.anything": 2.5}}, tools=tools) == []
    finding = only({"args": {"scores.math": "high"}}, tools=tools)
    assert finding.key == ("args", "scores.math", "equals")


def test_recursive_schemas_end() -> None:
    schema = {
        "type": "object",
        "$defs": {
            "A": {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]},
            "B": {"anyOf": [{"$ref": "#/$defs/A"}, obj({"next": {"$ref": "#/$defs/B"}})]},
        },
        "properties": {"root": {"$ref": "#/$defs/A"}},
    }
    tools = {"s": [ToolShape("t", schema)]}
    assert lint({"args": {"root.next.next.next": {"exists": True}}}, tools=tools) == []
    assert only({"args": {"root.next.nxt": {"glob": "*"}}}, tools=tools).suggestion == "root.next.next"


# -- conditions against types


@pytest.mark.parametrize("condition", ["glob", "not_glob", "regex"])
def test_a_string_condition_on_an_integer_is_found(condition: str) -> None:
    finding = only({"server": "fs", "tool": "write_file", "args": {"size": {condition: "1*"}}})
    assert finding.key == ("args", "size", condition)
    assert finding.message.startswith(
        f"argument 'size' is an integer in the schema of tool 'write_file': {condition} = '1*' judges "
        "strings only, so in this allow rule it never holds"
    )


def test_a_string_condition_in_a_deny_rule_says_it_always_holds() -> None:
    rule = Rule.model_validate({"server": "fs", "args": {"size": {"glob": "1*"}}, "decision": "deny"})
    [finding] = lint_rules([rule], TOOLS)
    assert finding.message.endswith("so in this deny rule it holds for every value the argument has")


def test_a_string_condition_on_a_type_union_with_string_is_fine() -> None:
    assert lint({"server": "fs", "tool": "write_file", "args": {"label": {"glob": "x*"}}}) == []


def test_in_with_a_value_outside_an_enum_is_found() -> None:
    finding = only(
        {"server": "fs", "tool": "write_file", "args": {"options.mode": {"in": ["overwrite", "apend"]}}}
    )
    assert finding.key == ("args", "options.mode", "in", 1)
    assert finding.message == (
        "argument 'options.mode' is one of 'overwrite', 'append' in the schema of tool 'write_file': "
        "in: 'apend' can never match (did you mean 'append'?)"
    )
    assert finding.suggestion == "append"


def test_in_with_no_possible_value_can_never_hold() -> None:
    finding = only({"server": "fs", "tool": "write_file", "args": {"size": {"in": ["1", "2"]}}})
    assert "in = ['1', '2'] can never hold" in finding.message


def test_not_in_with_an_impossible_value_excludes_nothing() -> None:
    finding = only({"server": "fs", "tool": "write_file", "args": {"options.mode": {"not_in": ["delete"]}}})
    assert finding.key == ("args", "options.mode", "not_in", 0)
    assert "'delete' is never its value, so excluding it does nothing" in finding.message


@pytest.mark.parametrize(
    ("path", "value", "holds"),
    [
        ("size", 3, True),
        ("size", 3.0, True),  # a whole number is an integer in JSON Schema
        ("size", 3.5, False),
        ("size", True, False),  # a boolean is not a number in JSON
        ("label", None, True),
        ("path", None, False),
        ("tags", ["a"], True),
        ("tags", "a", False),
        ("meta", None, True),
        ("meta", {"owner": "me"}, True),
    ],
)
def test_equals_is_checked_against_the_type(path: str, value: Any, holds: bool) -> None:
    findings = lint({"server": "fs", "tool": "write_file", "args": {path: {"equals": value}}})
    assert (findings == []) is holds, findings
    if not holds:
        assert findings[0].message.endswith("can never hold")


def test_exists_is_never_a_type_finding() -> None:
    assert lint({"server": "fs", "tool": "write_file", "args": {"size": {"exists": False}}}) == []


def test_schemas_it_cannot_read_judge_nothing() -> None:
    schema = {
        "type": "object",
        "properties": {
            "remote": {"$ref": "https://example.com/schema.json"},
            "anything": {},
            "custom": {"type": "decimal"},
            "pattern": {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}},
        },
    }
    tools = {"s": [ToolShape("t", schema)]}
    rules = {"args": {"remote": {"glob": "a"}, "anything": 1, "custom": "x", "pattern.x_1": 2}}
    assert lint(rules, tools=tools) == []


def test_findings_come_in_rule_order() -> None:
    findings = lint({"server": "tme"}, {"server": "time", "tool": "nope"}, {"server": "fs", "args": {"x": 1}})
    assert [f.rule_index for f in findings] == [0, 1, 2]


def test_a_schema_whose_references_branch_at_every_level_is_read_in_linear_time() -> None:
    # Each level refers to the next twice: followed naively, 2**25 paths; each node is judged once.
    tools = {"s": [ToolShape("t", branching(25, obj({"leaf": {"type": "integer"}})))]}
    assert only({"args": {"x.leaf": {"glob": "1*"}}}, tools=tools).key == ("args", "x.leaf", "glob")
    assert only({"args": {"x.lef": 1}}, tools=tools).suggestion == "x.leaf"
    tools = {"s": [ToolShape("t", branching(25, {"type": "integer"}))]}
    assert only({"args": {"x": {"glob": "1*"}}}, tools=tools).key == ("args", "x", "glob")


def test_beyond_the_deepest_schema_followed_a_type_is_not_judged() -> None:
    # Two subschemas a level: the integer is past MAX_SCHEMA_DEPTH, so whether it is one is not judged.
    tools = {"s": [ToolShape("t", branching(MAX_SCHEMA_DEPTH, {"type": "integer"}))]}
    assert lint({"args": {"x": {"glob": "1*"}, "x.y": {"exists": True}}}, tools=tools) == [
        LintFinding(
            0,
            "rules[0]",
            ("args", "x.y"),
            "argument 'x.y': 'x' is an integer in the schema of tool 't', not an object, so the path never "
            "reaches a value (the argument always counts as absent)",
        )
    ]  # finding a property follows any depth


def branching(levels: int, last: dict[str, Any]) -> dict[str, Any]:
    defs: dict[str, Any] = {
        f"L{i}": {"anyOf": [{"$ref": f"#/$defs/L{i + 1}"}, {"$ref": f"#/$defs/L{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"L{levels}"] = last
    return {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/L0"}}}
