"""Property test: for random JSON schemas and tool names, generated code always compiles, imports, and
accepts (and sends back unchanged) instances that are valid under the schema."""

from __future__ import annotations

import itertools
import keyword
import sys
import types
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipybox.mcp_apigen import ToolSchema
from ipybox.mcp_apigen.names import module_names
from ipybox.mcp_apigen.render import render_tool_module

SchemaAndValues = tuple[dict[str, Any], st.SearchStrategy[Any]]

_counter = itertools.count()

# Names that stress sanitizing: keywords, pydantic attributes, builtins, non-identifiers, injection.
NAMES = st.one_of(
    st.sampled_from(
        [*keyword.kwlist, "model_config", "json", "dict", "str", "Any", "Field", "Params", "Result", "_x", "l",
         "a-b", "a.b", "1st", "", " ", '"""', "'''", "\\", "{{x}}", "naïve", "datetime", "date", "__init__"]
    ),
    st.text(max_size=12),
)  # fmt: skip
TEXT = st.text(max_size=20)


def _leaf() -> st.SearchStrategy[SchemaAndValues]:
    patterns = ["^[a-z]+$", "^[0-9]{2,4}$", "ab"]
    strings = st.builds(
        lambda lo, span: (
            {"type": "string", "minLength": lo, "maxLength": lo + span},
            st.text(min_size=lo, max_size=lo + span),
        ),
        st.integers(0, 3),
        st.integers(0, 5),
    )
    # JSON Schema patterns are ECMA-262 regexes, whose `$` matches only at the end (as in pydantic's Rust
    # engine); Python's also matches before a final newline, so strings are drawn with `\Z` instead.
    patterned = st.sampled_from(patterns).map(
        lambda p: ({"type": "string", "pattern": p}, st.from_regex(p.replace("$", r"\Z")))
    )
    string_enum = st.lists(TEXT, min_size=1, max_size=4, unique=True).map(
        lambda values: ({"type": "string", "enum": values}, st.sampled_from(values))
    )
    int_enum = st.lists(st.integers(-5, 5), min_size=1, max_size=4, unique=True).map(
        lambda values: ({"type": "integer", "enum": values}, st.sampled_from(values))
    )
    const = st.one_of(TEXT, st.integers(), st.booleans()).map(lambda v: ({"const": v}, st.just(v)))
    integers = st.builds(
        lambda lo, span, step: (
            {"type": "integer", "minimum": lo, "maximum": lo + span * step, "multipleOf": step},
            st.integers(0, span)
            .map(lambda k: _first_multiple(lo, step) + k * step)
            .filter(lambda v: v <= lo + span * step),
        ),
        st.integers(-50, 50),
        st.integers(0, 10),
        st.integers(1, 4),
    )
    numbers = st.builds(
        lambda lo: (
            {"type": "number", "exclusiveMinimum": lo, "maximum": lo + 10},
            st.floats(lo, lo + 10, exclude_min=True, allow_nan=False) | st.integers(lo + 1, lo + 10),
        ),
        st.integers(-100, 100),
    )
    formats = st.sampled_from(
        [
            ({"type": "string", "format": "date-time"}, st.just("2024-05-01T12:30:00Z")),
            ({"type": "string", "format": "date"}, st.just("2024-05-01")),
            ({"type": "string", "format": "uuid"}, st.uuids().map(str)),
            ({"type": "string", "format": "uri"}, st.just("https://example.com/a b")),
        ]
    )
    simple = st.sampled_from(
        [
            ({"type": "boolean"}, st.booleans()),
            ({"type": "null"}, st.none()),
            ({}, st.one_of(st.none(), st.integers(), TEXT, st.lists(st.integers(), max_size=2))),
            ({"type": ["string", "null"]}, st.one_of(TEXT, st.none())),
            ({"type": "integer", "nullable": True}, st.one_of(st.integers(), st.none())),
            ({"type": ["integer", "string"]}, st.one_of(st.integers(), TEXT)),
            ({"not": {"type": "string"}}, st.integers()),
            ({"type": "object"}, st.dictionaries(TEXT, st.integers(), max_size=2)),
        ]
    )
    return st.one_of(strings, patterned, string_enum, int_enum, const, integers, numbers, formats, simple)


def _first_multiple(lo: int, step: int) -> int:
    return -(-lo // step) * step


def _extend(children: st.SearchStrategy[SchemaAndValues]) -> st.SearchStrategy[SchemaAndValues]:
    arrays = st.builds(
        lambda child, lo: (
            {"type": "array", "items": child[0], "minItems": lo},
            st.lists(child[1], min_size=lo, max_size=lo + 2),
        ),
        children,
        st.integers(0, 2),
    )
    tuples = st.lists(children, min_size=1, max_size=3).map(
        lambda items: (
            {
                "type": "array",
                "prefixItems": [s for s, _ in items],
                "minItems": len(items),
                "maxItems": len(items),
            },
            st.tuples(*(v for _, v in items)).map(list),
        )
    )
    unions = st.lists(children, min_size=2, max_size=3).flatmap(
        lambda branches: st.sampled_from(["anyOf", "oneOf"]).map(
            lambda kw: ({kw: [s for s, _ in branches]}, st.one_of(*(v for _, v in branches)))
        )
    )
    typed_dicts = children.map(
        lambda child: (
            {"type": "object", "additionalProperties": child[0]},
            st.dictionaries(TEXT, child[1], max_size=2),
        )
    )
    return st.one_of(
        arrays, tuples, unions, typed_dicts, _objects(children), _all_of(children), _defaults(children)
    )


def _objects(children: st.SearchStrategy[SchemaAndValues]) -> st.SearchStrategy[SchemaAndValues]:
    return st.builds(
        _object,
        st.lists(st.tuples(NAMES, children, st.booleans()), max_size=4, unique_by=lambda p: p[0]),
        st.sampled_from([None, False, True]),
    )


def _object(props: list[tuple[str, SchemaAndValues, bool]], additional: bool | None) -> SchemaAndValues:
    schema: dict[str, Any] = {"type": "object", "properties": {name: child[0] for name, child, _ in props}}
    schema["required"] = [name for name, _, required in props if required]
    if additional is not None:
        schema["additionalProperties"] = additional
    required = {name: child[1] for name, child, req in props if req}
    optional = {name: child[1] for name, child, req in props if not req}
    return schema, st.fixed_dictionaries(required, optional=optional)


def _all_of(children: st.SearchStrategy[SchemaAndValues]) -> st.SearchStrategy[SchemaAndValues]:
    def build(left: SchemaAndValues, right: SchemaAndValues) -> SchemaAndValues:
        a = {"type": "object", "properties": {"left": left[0]}, "required": ["left"]}
        b = {"type": "object", "properties": {"right": right[0]}}
        values = st.fixed_dictionaries({"left": left[1]}, optional={"right": right[1]})
        return {"allOf": [a, b]}, values

    return st.builds(build, children, children)


def _defaults(children: st.SearchStrategy[SchemaAndValues]) -> st.SearchStrategy[SchemaAndValues]:
    # A default is only a hint: the value may be left out (then nothing is sent) or given.
    return children.flatmap(
        lambda child: child[1].map(
            lambda default: ({**child[0], "default": default, "description": '"""\\ndefault\x00'}, child[1])
        )
    )


def _recursive_ref(name: str) -> SchemaAndValues:
    node = {
        "type": "object",
        "properties": {
            name: {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
        },
        "required": [name],
    }
    values = st.recursive(
        st.fixed_dictionaries({name: TEXT}),
        lambda inner: st.fixed_dictionaries({name: TEXT}, optional={"children": st.lists(inner, max_size=2)}),
        max_leaves=4,
    )
    return {"$ref": "#/$defs/Node", "$node": node}, values


SCHEMAS = st.recursive(_leaf(), _extend, max_leaves=6)
PROPERTIES = st.lists(
    st.tuples(NAMES, st.one_of(SCHEMAS, NAMES.map(_recursive_ref)), st.booleans()),
    max_size=4,
    unique_by=lambda p: p[0],
)


def _tool(
    tool_name: str, props: list[tuple[str, SchemaAndValues, bool]]
) -> tuple[ToolSchema, st.SearchStrategy[Any]]:
    root, values = _object(props, None)
    defs = {}
    for i, (name, (schema, _), _required) in enumerate(props):
        if "$node" in schema:
            node = schema["$node"]
            node["properties"]["children"]["items"] = {"$ref": f"#/$defs/Node{i}"}
            defs[f"Node{i}"] = node
            root["properties"][name] = {"$ref": f"#/$defs/Node{i}"}
    if defs:
        root["$defs"] = defs
    return ToolSchema(tool_name, '"""description"""\\', root, output_schema=root), values


def _load(source: str) -> types.ModuleType:
    name = f"_apigen_property_{next(_counter)}"
    module = types.ModuleType(name)
    sys.modules[name] = module  # pydantic resolves forward references through sys.modules
    try:
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), NAMES, PROPERTIES)
@pytest.mark.integration  # no process, but a property test that takes seconds
@pytest.mark.slow
def test_generated_code_accepts_every_valid_instance(
    data: st.DataObject, tool_name: str, props: list[tuple[str, SchemaAndValues, bool]]
) -> None:
    tool, values = _tool(tool_name, props)
    source = render_tool_module("srv", tool)
    module = _load(source)
    try:
        assert tool_name == module.TOOL_NAME
        for _ in range(3):
            instance = data.draw(values)
            params = module.Params.model_validate(instance)
            assert params.model_dump(mode="json", by_alias=True, exclude_unset=True) == instance
            module.Result.model_validate(instance)
    finally:
        del sys.modules[module.__name__]


@settings(max_examples=200, deadline=None)
@given(st.lists(NAMES, max_size=8))
def test_module_names_are_distinct_valid_and_order_independent(tool_names: list[str]) -> None:
    names = module_names(tool_names)
    assert set(names) == set(tool_names)
    assert len(set(names.values())) == len(names)
    for name in names.values():
        assert name.isidentifier() and name.isascii() and not keyword.iskeyword(name) and name == name.lower()
    assert module_names(list(reversed(tool_names))) == names
