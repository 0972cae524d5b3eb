"""Translating JSON Schema into pydantic model definitions (as data, rendered by the templates).

Covers objects (nested, with typed `additionalProperties`), arrays and tuples, string/integer enums,
`const`, `oneOf`/`anyOf`/`allOf`, `$ref`/`$defs` (recursive ones too), type lists, `nullable`,
defaults, required vs optional, formats and numeric/string constraints. Whatever it cannot express
(`not`, `if`, recursive non-object aliases, unusual enums, ...) becomes a loose type with a comment:
a generated model may accept more than the schema does, never less, and generation never fails.

Every identifier comes from [names][ipybox.mcp_apigen.names]; every untrusted string or value is
turned into source by [literals][ipybox.mcp_apigen.literals].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic_core import SchemaValidator, core_schema

from ipybox.mcp_apigen.literals import NotALiteralError, py_literal, py_str
from ipybox.mcp_apigen.names import class_name, field_name, sanitized_field_name

Direction = Literal["input", "output"]

# Imported as private module names, so that properties named `datetime` or `date` stay as they are.
_STRING_FORMATS = {
    "date-time": ("datetime", "_datetime.datetime"),
    "date": ("datetime", "_datetime.date"),
    "uuid": ("uuid", "_uuid.UUID"),
}
_STRUCTURAL = ("type", "properties", "items", "prefixItems", "additionalProperties", "$ref", "enum", "const")
_COMBINATORS = ("anyOf", "oneOf", "allOf")
_UNSUPPORTED = ("not", "if", "then", "else", "dependentSchemas", "dependencies", "unevaluatedProperties")
_REF_PREFIX = "#/"


@dataclass(frozen=True)
class TypeExpr:
    """A Python type expression; `constraints` are `Field()` keyword arguments for it."""

    expr: str
    constraints: tuple[tuple[str, str], ...] = ()

    def inline(self) -> str:
        if not self.constraints:
            return self.expr
        return f"Annotated[{self.expr}, Field({_kwargs(self.constraints)})]"


@dataclass
class FieldDef:
    """A model field, ready to render as `name: annotation = value`."""

    name: str
    annotation: str
    value: str | None
    comments: list[str] = field(default_factory=list)


@dataclass
class ModelDef:
    """A model class: a `BaseModel` with fields, or a `RootModel[root]`."""

    name: str
    description: str | None
    config: list[tuple[str, str]] = field(default_factory=list)
    fields: list[FieldDef] = field(default_factory=list)
    extra_type: str | None = None
    root: str | None = None
    comments: list[str] = field(default_factory=list)


@dataclass
class ModuleModels:
    """All models of one generated module, in definition order, and the names they import."""

    models: list[ModelDef] = field(default_factory=list)
    imports: set[tuple[str, str]] = field(default_factory=set)
    class_names: set[str] = field(default_factory=lambda: {"Params", "Result", "ToolRunner"})
    field_names: set[str] = field(default_factory=set)
    uses_is_none: bool = False

    def reserve_field_names(self, schema: Any) -> None:
        """Keep class names clear of every property name in `schema`: a field named like a class
        would shadow it inside a class body."""
        if isinstance(schema, dict):
            properties = schema.get("properties")
            if isinstance(properties, dict):
                self.field_names.update(sanitized_field_name(str(name)) for name in properties)
            for value in schema.values():
                self.reserve_field_names(value)
        elif isinstance(schema, list):
            for value in schema:
                self.reserve_field_names(value)

    def class_name(self, hint: str) -> str:
        avoid = self.class_names | self.field_names
        name = class_name(hint, avoid)
        self.class_names.add(name)
        return name


def unchecked_pattern(pattern: str) -> str | None:
    """Why a generated model leaves a schema's `pattern` unchecked (a comment for the generated code), or
    `None` when pydantic's default regex engine can check it.

    Generated models check patterns with pydantic's default engine, Rust's `regex` crate, which matches in
    linear time: with Python's `re` (the "python-re" engine) a hostile server's pattern such as `(a+)+$`
    hung the kernel while validating arguments. Rust's engine has no look-around or backreferences
    (JSON Schema patterns are ECMA-262 regexes, which do), and refuses patterns that compile past its
    size limit; pydantic would raise on such a pattern when the module is imported, so it is left out,
    with a comment, and the server, which receives the arguments, checks it. Compilability is asked of
    pydantic-core itself (a one-field validator, 20-300 us; ~55 ms for a pattern that reaches the size
    limit), so generation and import agree.
    """
    try:
        SchemaValidator(core_schema.str_schema(pattern=pattern))
    except Exception as e:  # SchemaError, or a pattern pydantic-core cannot even read (lone surrogates)
        reason = str(e)
        if "look-around" in reason:
            return "pattern uses look-around: not checked here; the server checks it"
        if "backreference" in reason:
            return "pattern uses a backreference: not checked here; the server checks it"
        return "pattern the linear-time regex engine cannot compile: not checked here; the server checks it"
    return None


def _kwargs(pairs: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> str:
    return ", ".join(f"{key}={value}" for key, value in pairs)


def _is_constraint_only(schema: Any) -> bool:
    return isinstance(schema, dict) and not any(key in schema for key in (*_STRUCTURAL, *_COMBINATORS))


class SchemaTranslator:
    """Translates the schemas of one tool module; `Params` and `Result` share its class namespace.

    Args:
        models: The module's models, appended to as schemas are translated.
    """

    def __init__(self, models: ModuleModels) -> None:
        self._module = models
        self._root: dict[str, Any] = {}
        self._direction: Direction = "input"
        self._refs: dict[tuple[int, str], str] = {}
        self._root_index = 0
        self._inlining: set[str] = set()
        self._comments: list[str] = []

    def root_model(self, schema: Any, name: str, direction: Direction) -> None:
        """Define the module's `Params` (input) or `Result` (output) model from a tool schema."""
        self._root = schema if isinstance(schema, dict) else {}
        self._root_index += 1
        self._direction = direction
        self._comments = []
        root = self._root
        if "$ref" in root:
            target = self._resolve(root["$ref"])
            root = {**target, **{k: v for k, v in root.items() if k != "$ref"}} if target is not None else {}
        if "allOf" in root:
            root = self._merge_all(root)
        if direction == "input" and not root.get("properties") and _union_branches(root):
            # A class with fields is friendlier than a union at the top: every branch's properties
            # become optional fields.
            root = self._flatten_union(root)
            self._comments.append("the schema is a union of objects: all their properties are optional here")
        if direction == "input" or _is_object_schema(root):
            model = self._object_model(root, name, name=name)
        else:
            model = ModelDef(name=name, description=None, root=self._type(root, "Item").inline())
            self._use("pydantic", "RootModel")
        model.comments = self._comments + model.comments
        self._module.models.append(model)

    def _use(self, module: str, name: str) -> None:
        self._module.imports.add((module, name))

    def _any(self, reason: str | None = None) -> TypeExpr:
        if reason:
            self._comments.append(reason)
        self._use("typing", "Any")
        return TypeExpr("Any")

    def _type(self, schema: Any, hint: str) -> TypeExpr:
        if schema is True or schema == {}:
            return self._any()
        if not isinstance(schema, dict):
            return self._any("a schema that accepts nothing (or is not an object): loosened to Any")
        for keyword in _UNSUPPORTED:
            if keyword in schema:
                self._comments.append(f"'{keyword}' is not supported: not checked here")
        if "$ref" in schema:
            return self._ref(schema["$ref"], hint, nullable=schema.get("nullable") is True)
        if "allOf" in schema:
            return self._type(self._merge_all(schema), hint)
        branches = _union_branches(schema)
        if branches is not None:
            return self._union(schema, branches, hint)
        types = self._types_of(schema)
        if "const" in schema:
            result = self._literal([schema["const"]], "const")
        elif "enum" in schema:
            values = schema["enum"]
            result = self._literal(values if isinstance(values, list) else [], "enum")
        elif types is None:
            result = self._any()
        else:
            members = [self._single(schema, t, hint) for t in types]
            result = self._join(members)
        if schema.get("nullable") is True and "None" not in _split_union(result.expr):
            result = self._join([result, TypeExpr("None")])
        return result

    def _types_of(self, schema: dict[str, Any]) -> list[str] | None:
        declared = schema.get("type")
        if isinstance(declared, str):
            declared = [declared]
        if isinstance(declared, list):
            known = [
                t
                for t in declared
                if t in ("string", "integer", "number", "boolean", "null", "array", "object")
            ]
            if "integer" in known and "number" in known:
                known.remove("integer")
            return list(dict.fromkeys(known)) or None
        if "properties" in schema or "additionalProperties" in schema or "required" in schema:
            return ["object"]
        if "items" in schema or "prefixItems" in schema:
            return ["array"]
        return None

    def _single(self, schema: dict[str, Any], type_: str, hint: str) -> TypeExpr:
        if type_ == "string":
            return self._string(schema)
        if type_ in ("integer", "number"):
            return TypeExpr("int" if type_ == "integer" else "float", _numeric_constraints(schema))
        if type_ == "boolean":
            return TypeExpr("bool")
        if type_ == "null":
            return TypeExpr("None")
        if type_ == "array":
            return self._array(schema, hint)
        return self._object(schema, hint)

    def _string(self, schema: dict[str, Any]) -> TypeExpr:
        expr = "str"
        fmt = schema.get("format")
        # Output keeps formats as plain strings: servers do not always send what they declare.
        if self._direction == "input" and isinstance(fmt, str) and fmt in _STRING_FORMATS:
            module, expr = _STRING_FORMATS[fmt]
            self._use(f"import {module}", f"_{module}")
            return TypeExpr(expr)
        constraints: list[tuple[str, str]] = []
        for key, arg in (("minLength", "min_length"), ("maxLength", "max_length")):
            value = schema.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                constraints.append((arg, repr(value)))
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            unchecked = unchecked_pattern(pattern)
            if unchecked is not None:
                self._comments.append(unchecked)
            else:
                constraints.append(("pattern", py_str(pattern)))
        return TypeExpr(expr, tuple(constraints))

    def _array(self, schema: dict[str, Any], hint: str) -> TypeExpr:
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        closed = items is False
        if isinstance(items, list):
            prefix, items = items, None
            closed = schema.get("additionalItems") is False
        min_items, max_items = schema.get("minItems"), schema.get("maxItems")
        if isinstance(prefix, list) and prefix:
            n = len(prefix)
            fixed = isinstance(min_items, int) and min_items >= n and (closed or max_items == n)
            if fixed and (min_items == n):
                members = [self._type(item, f"{hint}_item{i}").inline() for i, item in enumerate(prefix)]
                return TypeExpr(f"tuple[{', '.join(members)}]")
            self._comments.append("a tuple whose length may vary: items not checked here")
            self._use("typing", "Any")
            item = TypeExpr("Any")
        elif isinstance(items, dict) or items is True:
            item = self._type(items, _singular(hint))
        else:
            item = self._any()
        constraints: list[tuple[str, str]] = []
        for value, arg in ((min_items, "min_length"), (max_items, "max_length")):
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                constraints.append((arg, repr(value)))
        return TypeExpr(f"list[{item.inline()}]", tuple(constraints))

    def _object(self, schema: dict[str, Any], hint: str) -> TypeExpr:
        properties = schema.get("properties")
        required = schema.get("required")
        if (isinstance(properties, dict) and properties) or (isinstance(required, list) and required):
            model = self._object_model(schema, hint)
            self._module.models.append(model)
            return TypeExpr(model.name)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return TypeExpr(f"dict[str, {self._type(extra, _singular(hint)).inline()}]")
        if "patternProperties" in schema:
            self._comments.append("'patternProperties' is not supported: values not checked here")
        self._use("typing", "Any")
        return TypeExpr("dict[str, Any]")

    def _object_model(self, schema: dict[str, Any], hint: str, name: str | None = None) -> ModelDef:
        if name is None:
            name = self._module.class_name(hint)
        description = schema.get("description")
        model = ModelDef(name=name, description=description if isinstance(description, str) else None)
        self._use("pydantic", "BaseModel")
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required_list = schema.get("required")
        required = (
            {r for r in required_list if isinstance(r, str)} if isinstance(required_list, list) else set()
        )
        for missing in sorted(required - set(properties)):
            properties = {**properties, missing: True}
        names = self._field_names([str(prop) for prop in properties])
        aliased = False
        for prop, prop_schema in properties.items():
            saved, self._comments = self._comments, []
            fdef, has_alias = self._field(str(prop), names[str(prop)], prop_schema, prop in required, name)
            fdef.comments = self._comments
            self._comments = saved
            aliased = aliased or has_alias
            model.fields.append(fdef)
        extra = schema.get("additionalProperties")
        if extra is False:
            policy = "forbid"
        elif extra is None and "patternProperties" not in schema:
            policy = "forbid" if self._direction == "input" else "allow"
        else:
            policy = "allow"
            if isinstance(extra, dict) and extra:
                model.extra_type = f"dict[str, {self._type(extra, _singular(name)).inline()}]"
        model.config = [("extra", py_str(policy))]
        if aliased:
            model.config.append(("validate_by_name", "True"))
        self._use("pydantic", "ConfigDict")
        return model

    def _field_names(self, properties: list[str]) -> dict[str, str]:
        """Field names for properties: one that is a valid name keeps it, so that no field name can
        equal another field's alias (validation by name and by alias would then both apply)."""
        taken: set[str] = set(self._module.class_names)
        names: dict[str, str] = {}
        for prop in properties:
            if field_name(prop, set()) == prop and prop not in taken:
                names[prop] = prop
                taken.add(prop)
        for prop in properties:
            if prop not in names:
                names[prop] = field_name(prop, taken)
        return names

    def _field(self, prop: str, name: str, schema: Any, required: bool, owner: str) -> tuple[FieldDef, bool]:
        type_ = self._type(schema, name if name[:1].islower() else f"{owner}_{name}")
        info = schema if isinstance(schema, dict) else {}
        if "$ref" in info and "default" not in info:
            target = self._resolve(info["$ref"])
            if target is not None and "default" in target:
                info = {**info, "default": target["default"]}
        kwargs: list[tuple[str, str]] = []
        if name != prop:
            kwargs.append(("alias", py_str(prop)))
        description = info.get("description")
        if isinstance(description, str) and description:
            kwargs.append(("description", py_str(description)))
        if required and " | " not in type_.expr:
            annotation = type_.expr
            kwargs.extend(type_.constraints)
        else:
            annotation = type_.inline()
        default: str | None = None
        if not required:
            if "default" in info:
                try:
                    default = py_literal(info["default"])
                except NotALiteralError:
                    self._comments.append("a default that is not a JSON value: left to the server")
            if default is None or default == "None":
                default = "None"
                if annotation != "Any" and "None" not in _split_union(annotation):
                    if self._direction == "input":
                        # An explicit None is not sent either: the server applies its own default.
                        kwargs.append(("exclude_if", "_is_none"))
                        self._module.uses_is_none = True
                    annotation = f"{annotation} | None"
        if required:
            value = f"Field({_kwargs(kwargs)})" if kwargs else None
        elif kwargs:
            value = f"Field({default}, {_kwargs(kwargs)})"
        else:
            value = default
        return FieldDef(name=name, annotation=annotation, value=value), name != prop

    def _literal(self, values: list[Any], keyword: str) -> TypeExpr:
        literals: list[str] = []
        nullable = False
        for value in values:
            if value is None:
                nullable = True
            elif isinstance(value, bool | str) or (isinstance(value, int) and not isinstance(value, bool)):
                literals.append(py_literal(value))
            else:
                return self._any(
                    f"'{keyword}' with values that are not strings, integers or booleans: not checked"
                )
        if not literals:
            return TypeExpr("None") if nullable else self._any(f"an empty '{keyword}': loosened to Any")
        self._use("typing", "Literal")
        expr = f"Literal[{', '.join(dict.fromkeys(literals))}]"
        return TypeExpr(f"{expr} | None" if nullable else expr)

    def _union(self, schema: dict[str, Any], branches: list[Any], hint: str) -> TypeExpr:
        own = {
            k: v for k, v in schema.items() if k not in ("anyOf", "oneOf", "description", "title", "default")
        }
        if all(_is_constraint_only(branch) for branch in branches):
            self._comments.append("alternatives that only add constraints: not checked here")
            return self._type(own, hint) if own else self._any()
        members: list[TypeExpr] = []
        for i, branch in enumerate(branches):
            branch_schema = self._merge([own, branch]) if any(k in own for k in _STRUCTURAL) else branch
            members.append(self._type(branch_schema, hint if i == 0 else f"{hint}_{i + 1}"))
        result = self._join(members)
        if schema.get("nullable") is True:
            result = self._join([result, TypeExpr("None")])
        return result

    def _join(self, members: list[TypeExpr]) -> TypeExpr:
        if len(members) == 1:
            return members[0]
        parts: list[str] = []
        for member in members:
            for part in _split_union(member.inline()):
                if part not in parts:
                    parts.append(part)
        if "Any" in parts:
            return TypeExpr("Any")
        if "_datetime.datetime" in parts and "_datetime.date" in parts:
            # Either parses as the other ('2024-05-01' as a datetime at midnight, a midnight datetime as a
            # date), so the value would not come back as it was given: keep the text.
            at = parts.index("_datetime.datetime")
            parts = [p for p in parts if p not in ("_datetime.datetime", "_datetime.date", "str")]
            parts.insert(min(at, len(parts)), "str")
            self._comments.append("date or date-time alternatives: kept as text")
        if "None" in parts:
            parts.remove("None")
            parts.append("None")
        return TypeExpr(" | ".join(parts))

    def _resolve(self, ref: Any) -> dict[str, Any] | None:
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith(_REF_PREFIX)):
            return None
        node: Any = self._root
        for raw in ref[len(_REF_PREFIX) :].split("/") if ref != "#" else []:
            key = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                return None
        return node if isinstance(node, dict) else ({} if node is True else None)

    def _ref(self, ref: Any, hint: str, nullable: bool = False) -> TypeExpr:
        result = self._ref_type(ref, hint)
        return self._join([result, TypeExpr("None")]) if nullable else result

    def _ref_type(self, ref: Any, hint: str) -> TypeExpr:
        target = self._resolve(ref)
        if target is None:
            return self._any("a '$ref' that cannot be resolved: loosened to Any")
        key = (self._root_index, str(ref))
        if key in self._refs:
            return TypeExpr(self._refs[key])
        ref_hint = str(ref).rsplit("/", 1)[-1] or hint
        if _is_object_schema(target) and not _union_branches(target) and "allOf" not in target:
            name = self._module.class_name(ref_hint)
            self._refs[key] = name
            saved, self._comments = self._comments, []
            model = self._object_model(target, ref_hint, name=name)
            model.comments = self._comments
            self._comments = saved
            self._module.models.append(model)
            return TypeExpr(name)
        if str(ref) in self._inlining:
            return self._any("a recursive schema that is not an object: loosened to Any")
        self._inlining.add(str(ref))
        try:
            return self._type(target, ref_hint)
        finally:
            self._inlining.discard(str(ref))

    def _merge_all(self, schema: dict[str, Any]) -> dict[str, Any]:
        parts = [{k: v for k, v in schema.items() if k != "allOf"}]
        branches = schema.get("allOf")
        for branch in branches if isinstance(branches, list) else []:
            if isinstance(branch, dict) and "$ref" in branch:
                target = self._resolve(branch["$ref"])
                if target is None or str(branch["$ref"]) in self._inlining:
                    self._comments.append("an 'allOf' part that cannot be merged: not checked here")
                    continue
                branch = {**target, **{k: v for k, v in branch.items() if k != "$ref"}}
            if isinstance(branch, dict) and "allOf" in branch:
                branch = self._merge_all(branch)
            parts.append(branch if isinstance(branch, dict) else {})
        return self._merge(parts)

    def _merge(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for part in parts:
            for key, value in part.items():
                if key == "properties" and isinstance(value, dict):
                    properties = dict(merged.get("properties", {}))
                    for prop, prop_schema in value.items():
                        if prop in properties and properties[prop] != prop_schema:
                            properties[prop] = {"allOf": [properties[prop], prop_schema]}
                        else:
                            properties[prop] = prop_schema
                    merged["properties"] = properties
                elif key == "required" and isinstance(value, list):
                    merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
                elif key == "type" and "type" in merged:
                    merged["type"] = _intersect_types(merged["type"], value)
                elif key == "additionalProperties" and "additionalProperties" in merged:
                    if value is False or merged["additionalProperties"] is False:
                        merged["additionalProperties"] = False
                elif key not in merged:
                    merged[key] = value
        return merged

    def _flatten_union(self, root: dict[str, Any]) -> dict[str, Any]:
        properties: dict[str, Any] = dict(root.get("properties") or {})
        for branch in _union_branches(root) or []:
            if isinstance(branch, dict) and "$ref" in branch:
                branch = self._resolve(branch["$ref"]) or {}
            if isinstance(branch, dict) and isinstance(branch.get("properties"), dict):
                for prop, prop_schema in branch["properties"].items():
                    properties.setdefault(prop, prop_schema)
        flat = {k: v for k, v in root.items() if k not in ("anyOf", "oneOf", "required")}
        return {**flat, "type": "object", "properties": properties, "additionalProperties": True}


def _union_branches(schema: dict[str, Any]) -> list[Any] | None:
    for keyword in ("anyOf", "oneOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list) and branches:
            return branches
    return None


def _is_object_schema(schema: dict[str, Any]) -> bool:
    declared = schema.get("type")
    if declared == "object":
        return True
    if declared is None and ("properties" in schema or "required" in schema):
        return True
    return isinstance(declared, list) and declared == ["object"]


def _intersect_types(a: Any, b: Any) -> Any:
    left = [a] if isinstance(a, str) else a
    right = [b] if isinstance(b, str) else b
    if not isinstance(left, list) or not isinstance(right, list):
        return a
    common = [t for t in left if t in right or (t == "integer" and "number" in right)]
    common += [t for t in right if t == "integer" and "number" in left and t not in common]
    return common or a


def _numeric_constraints(schema: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    constraints: list[tuple[str, str]] = []

    def number(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        try:
            return py_literal(value)
        except NotALiteralError:
            return None

    minimum, maximum = number(schema.get("minimum")), number(schema.get("maximum"))
    exclusive_min, exclusive_max = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if exclusive_min is True and minimum is not None:
        constraints.append(("gt", minimum))
    elif minimum is not None:
        constraints.append(("ge", minimum))
    if exclusive_max is True and maximum is not None:
        constraints.append(("lt", maximum))
    elif maximum is not None:
        constraints.append(("le", maximum))
    if (value := number(exclusive_min)) is not None:
        constraints.append(("gt", value))
    if (value := number(exclusive_max)) is not None:
        constraints.append(("lt", value))
    multiple = schema.get("multipleOf")
    if (value := number(multiple)) is not None and float(value) > 0:
        constraints.append(("multiple_of", value))
    return tuple(constraints)


def _split_union(expr: str) -> list[str]:
    """Split a type expression on top-level `|` (not inside brackets or string literals)."""
    parts, depth, start, quote, i = [], 0, 0, "", 0
    while i < len(expr):
        char = expr[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "[" or char == "(":
            depth += 1
        elif char == "]" or char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(expr[start:i].strip())
            start = i + 1
        i += 1
    parts.append(expr[start:].strip())
    return parts


def _singular(hint: str) -> str:
    if hint.endswith("ies") and len(hint) > 3:
        return hint[:-3] + "y"
    if hint.endswith("s") and not hint.endswith("ss") and len(hint) > 1:
        return hint[:-1]
    return f"{hint}_item"
