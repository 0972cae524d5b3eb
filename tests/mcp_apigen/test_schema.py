"""Targeted checks of the JSON Schema translation, one feature at a time."""

from __future__ import annotations

import itertools
import sys
import types
from typing import Any

import pytest
from pydantic import ValidationError

from ipybox.mcp_apigen import ToolSchema
from ipybox.mcp_apigen.render import render_tool_module

_counter = itertools.count()


def _module(properties: dict[str, Any], required: list[str] | None = None, **root: Any) -> types.ModuleType:
    schema = {"type": "object", "properties": properties, "required": required or [], **root}
    source = render_tool_module("srv", ToolSchema("tool", "A tool.", schema, output_schema=schema))
    name = f"_apigen_schema_{next(_counter)}"
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name, "exec"), module.__dict__)
    module.SOURCE = source  # type: ignore[attr-defined]
    return module


def _ok(module: types.ModuleType, value: dict[str, Any]) -> None:
    params = module.Params.model_validate(value)
    assert params.model_dump(mode="json", by_alias=True, exclude_unset=True) == value


def _bad(module: types.ModuleType, value: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        module.Params.model_validate(value)


def test_required_optional_and_defaults() -> None:
    m = _module(
        {"a": {"type": "integer"}, "b": {"type": "string", "default": "x"}, "c": {"type": "number"}}, ["a"]
    )
    _ok(m, {"a": 1})
    _bad(m, {})
    assert m.Params(a=1).b == "x"
    assert m.Params(a=1, c=None).model_dump(by_alias=True, exclude_unset=True) == {"a": 1}
    assert "b: str = " in m.SOURCE


def test_enums_const_and_nullable() -> None:
    m = _module(
        {
            "s": {"enum": ["a", "b", None]},
            "i": {"type": "integer", "enum": [1, 2]},
            "c": {"const": "fixed"},
            "n": {"type": ["string", "null"]},
            "f": {"enum": [1.5, {"x": 1}]},
        },
        ["n"],
    )
    _ok(m, {"s": None, "i": 2, "c": "fixed", "n": None, "f": {"x": 1}})
    for bad in ({"n": None, "s": "z"}, {"n": None, "i": 3}, {"n": None, "c": "other"}, {}):
        _bad(m, bad)
    assert "# 'enum' with values that are not strings" in m.SOURCE


def test_refs_recursion_and_typed_dicts() -> None:
    m = _module(
        {
            "tree": {"$ref": "#/$defs/Tree"},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        **{
            "$defs": {
                "Tree": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}},
                }
            }
        },
    )
    _ok(m, {"tree": {"kids": [{"kids": []}, {}]}, "counts": {"a": 1}})
    _bad(m, {"counts": {"a": "x"}})
    assert "class Tree(BaseModel):" in m.SOURCE


def test_recursive_non_object_alias_and_unknown_ref_degrade() -> None:
    json_value = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#/$defs/Json"}}]}
    m = _module(
        {"v": {"$ref": "#/$defs/Json"}, "u": {"$ref": "#/$defs/Missing"}}, **{"$defs": {"Json": json_value}}
    )
    _ok(m, {"v": ["a", ["b", [1]]], "u": 3})
    assert "loosened to Any" in m.SOURCE


def test_all_of_merges_and_one_of_chooses() -> None:
    a = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    b = {"properties": {"y": {"type": "string"}}}
    m = _module(
        {
            "both": {"allOf": [a, b]},
            "either": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
        }
    )
    _ok(m, {"both": {"x": 1, "y": "s"}, "either": "ab"})
    _bad(m, {"both": {"y": "s"}})
    _bad(m, {"either": "abc"})


def test_constraints() -> None:
    m = _module(
        {
            "s": {"type": "string", "minLength": 2, "pattern": "a+"},
            "i": {"type": "integer", "minimum": 0, "exclusiveMaximum": 10},
            "l": {"type": "array", "items": {"type": "string"}, "maxItems": 1},
            "t": {
                "type": "array",
                "prefixItems": [{"type": "string"}, {"type": "integer"}],
                "minItems": 2,
                "items": False,
            },
            "p": {"type": "string", "pattern": "\\p{L}+"},
        }
    )
    _ok(m, {"s": "baa", "i": 9, "l": ["x"], "t": ["a", 1], "p": "anything"})
    for bad in ({"s": "a"}, {"s": "bb"}, {"i": 10}, {"i": -1}, {"l": ["a", "b"]}, {"t": ["a"]}, {"p": "1"}):
        _bad(m, bad)


@pytest.mark.timeout(
    10
)  # a guard against a hang (SIGALRM interrupts a backtracking match), not a speed check
def test_a_catastrophic_pattern_is_checked_in_linear_time() -> None:
    # A hostile server's pattern: with Python's re (the former "python-re" engine) 28 characters took
    # about 20 s, and each two more four times as long; pydantic's default engine answers at once.
    m = _module({"s": {"type": "string", "pattern": "^(a+)+$"}})
    _ok(m, {"s": "aaaa"})
    _bad(m, {"s": "a" * 40 + "!"})
    assert "regex_engine" not in m.SOURCE


@pytest.mark.parametrize(
    ("pattern", "comment"),
    [
        ("^(?=.*[0-9])[a-z0-9]+$", "# pattern uses look-around: not checked here; the server checks it"),
        ("(?<!x)y", "# pattern uses look-around: not checked here; the server checks it"),
        ("^(a)\\1$", "# pattern uses a backreference: not checked here; the server checks it"),
        (
            "a{1000}{1000}{1000}",
            "# pattern the linear-time regex engine cannot compile: not checked here; the server checks it",
        ),
    ],
)
def test_a_pattern_the_linear_engine_cannot_compile_is_left_to_the_server(pattern: str, comment: str) -> None:
    m = _module({"s": {"type": "string", "pattern": pattern}}, ["s"])
    assert comment in [line.strip() for line in m.SOURCE.splitlines()]
    assert "pattern=" not in m.SOURCE
    _ok(m, {"s": "anything"})  # the module imports, and the unchecked field takes any string


def test_a_pattern_is_emitted_as_a_string_literal_whatever_it_contains() -> None:
    pattern = "^x\"\"\"\n'''\nimport os; os.exit(3)  # \\$"
    m = _module({"s": {"type": "string", "pattern": pattern}}, ["s"])
    assert m.Params.model_fields["s"].metadata[0].pattern == pattern
    _bad(m, {"s": "y"})


def test_formats_are_typed_for_input_only() -> None:
    m = _module(
        {"when": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"}}
    )
    params = m.Params.model_validate(
        {"when": "2024-01-02T03:04:05Z", "id": "8c5fa3b6-1f7c-4c8c-9d6c-1c2b3a4d5e6f"}
    )
    assert type(params.when).__name__ == "datetime" and type(params.id).__name__ == "UUID"
    _bad(m, {"when": "yesterday"})
    assert m.Result.model_validate({"when": "yesterday"}).when == "yesterday"


def test_additional_properties_policy() -> None:
    m = _module({"a": {"type": "integer"}})
    _bad(m, {"a": 1, "typo": 2})  # inputs reject undeclared properties unless the schema allows them
    assert m.Result.model_validate({"a": 1, "more": 2}).model_extra == {"more": 2}
    m = _module({"a": {"type": "integer"}}, additionalProperties=True)
    _ok(m, {"a": 1, "extra": [1]})


def test_unsupported_keywords_never_crash() -> None:
    m = _module(
        {
            "x": {"not": {"type": "string"}},
            "y": {"if": {"type": "string"}, "then": {"minLength": 1}},
            "z": {"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
            "w": False,
            "v": {"type": "frobnicate"},
            "u": {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
            "n": {"type": "number", "minimum": float("inf")},
            "d": {"type": "string", "default": float("nan")},
        }
    )
    _ok(m, {"x": 1, "y": "", "z": {"a": 1}, "v": 5, "u": {"c": 1}})
