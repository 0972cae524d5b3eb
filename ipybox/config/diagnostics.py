"""Turning pydantic's validation errors into `ConfigProblem`s: where each bad value was written (a line of
`ipybox.toml` or `.env`, or an environment variable) and a one-line reason, with a suggestion for an
unknown key.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.alias_generators import to_camel, to_snake
from pydantic_core import ErrorDetails

from ipybox.config.errors import ConfigProblem
from ipybox.config.positions import KeyPath, key_positions

Locate = Callable[[KeyPath], tuple[str, int | None, int | None]]
"""Where the value at a key path was written: source name, line, column."""

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_RULE_LABEL = re.compile(r"(?:rule (?P<id>'[^']*'|\"[^\"]*\")|rules\[(?P<index>\d+)\]): ")
# Messages that already name the value, or have none to name.
_NO_INPUT_SHOWN = {"missing", "extra_forbidden", "value_error", "server_kind", "assertion_error"}


def in_file(path: Path, source: str) -> Locate:
    """How to say where a key of the TOML `source` (read from `path`) is written: at the key, or at the
    nearest table above it that is written, or nowhere in the file."""
    positions = key_positions(source)

    def locate(key_path: KeyPath) -> tuple[str, int | None, int | None]:
        for end in range(len(key_path), 0, -1):
            if key_path[:end] in positions:
                return (str(path), *positions[key_path[:end]])
        return str(path), None, None

    return locate


@dataclass(frozen=True)
class ValueSource:
    """Values from one place (the file, `.env`, the environment), as a nested dict, and how to say where
    one of them was written."""

    data: Mapping[str, Any]
    locate: Locate


def problems_from_errors(
    errors: Iterable[ErrorDetails], sources: Sequence[ValueSource], model: type[BaseModel]
) -> list[ConfigProblem]:
    """One problem per distinct error, most important source first in `sources` (the one whose value
    wins). Errors about the branches of a union that the value plainly isn't are left out."""
    located = [_locate(error, sources) for error in errors]
    located = [item for item in located if not _superseded(item, located)]
    # Errors about one value (its union's members) become one problem: "a string, or a list". A check of
    # a whole table may report several problems, one a line: those stay apart.
    problems: dict[tuple[str, int | None, int | None, str, str], tuple[list[str], str]] = {}
    for item in located:
        head, text = _reason(item, model)
        lines = text.splitlines() or [""]
        for message in lines:
            place, line_head = item.place, head
            rule_place = _rule_place(item, message, sources)
            if rule_place is not None:
                place, line_head = rule_place, ""  # the message names the rule
            key = (*place, line_head, message if len(lines) > 1 else "")
            messages, _ = problems.setdefault(key, ([], _shown_input(item.error)))
            if message not in messages:
                messages.append(message)
    return [
        ConfigProblem(source, line, column, f"{head}: {', or '.join(messages)}{got}" if head else messages[0])
        for (source, line, column, head, _), (messages, got) in problems.items()
    ]


@dataclass(frozen=True)
class _Located:
    error: ErrorDetails
    loc: tuple[str | int, ...]
    path: KeyPath  # the part of `loc` found in the data, spelled as there
    place: tuple[str, int | None, int | None]


def _locate(error: ErrorDetails, sources: Sequence[ValueSource]) -> _Located:
    loc = tuple(error["loc"])
    key = (error.get("ctx") or {}).get("key")
    if isinstance(key, str):  # a check on a whole table that blames one of its keys
        loc = (*loc, key)
    walks = [_walk(source.data, loc) for source in sources]
    longest = max(len(walk) for walk in walks)
    # Sources are merged key by key, the first one winning: the deepest match is where the value came from.
    index = next(i for i, walk in enumerate(walks) if len(walk) == longest)
    return _Located(error, loc, walks[index], sources[index].locate(walks[index]))


def _rule_place(
    item: _Located, message: str, sources: Sequence[ValueSource]
) -> tuple[str, int | None, int | None] | None:
    """For a problem `[approval]` reports about one of its rules (`rule '<id>': ...` or `rules[<n>]: ...`),
    the rule's place rather than the table's."""
    label = _RULE_LABEL.match(message)
    if label is None or item.path != ("approval",):
        return None
    rule_id = label.group("id")[1:-1] if label.group("id") else None
    for source in sources:
        approval = source.data.get("approval")
        rules = approval.get("rules") if isinstance(approval, Mapping) else None
        if not isinstance(rules, list):
            continue
        for index, rule in enumerate(rules):
            if str(index) == label.group("index") or (
                rule_id is not None and isinstance(rule, Mapping) and rule.get("id") == rule_id
            ):
                return source.locate(("approval", "rules", index))
    return None


def _walk(data: Mapping[str, Any], loc: Sequence[str | int]) -> KeyPath:
    node: Any = data
    path: list[str | int] = []
    for part in loc:
        if isinstance(node, Mapping) and isinstance(part, str):
            key = _find_key(node, part)
            if key is not None:
                node = node[key]
                path.append(key)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            path.append(part)
        # Anything else is not in the data: a union member's tag, `[key]`, or a missing key.
    return tuple(path)


def _find_key(node: Mapping[str, Any], part: str) -> str | None:
    # pydantic names a field by its alias (`denyRead`) whichever spelling was given (`deny_read`), and
    # names from environment variables are lower case.
    candidates = (part, to_snake(part), to_camel(part))
    for key in node:
        if isinstance(key, str) and (key in candidates or key.lower() in {c.lower() for c in candidates}):
            return key
    return None


def _superseded(item: _Located, located: Sequence[_Located]) -> bool:
    # For a value of a union type pydantic reports every member that failed, each under its member's tag.
    # A member that got further into the value (a table's unknown key) is what the author meant; "not a
    # string" is noise then.
    tagged = (
        item.error["type"] != "missing" and item.loc[-1:] != ("[key]",) and len(item.loc) > len(item.path)
    )
    return tagged and any(
        len(other.path) > len(item.path) and other.path[: len(item.path)] == item.path
        for other in located
        if other is not item and other.place[0] == item.place[0]
    )


def _reason(item: _Located, model: type[BaseModel]) -> tuple[str, str]:
    """A heading (the key, empty when the message names it) and the message."""
    error = item.error
    if error["type"] == "extra_forbidden":
        return "", _unknown_key(item, model)
    message = error["msg"].removeprefix("Value error, ")
    if item.loc and item.loc[-1] == "[key]":
        return "", message
    path = item.path
    if error["type"] == "missing" and item.loc:
        path = (*path, item.loc[-1])
    return dotted(path) or "(top level)", message


def _shown_input(error: ErrorDetails) -> str:
    value = error.get("input")
    if error["type"] in _NO_INPUT_SHOWN or not isinstance(value, str | int | float | bool):
        return ""
    return f" (got {value!r})"


def _unknown_key(item: _Located, model: type[BaseModel]) -> str:
    key, parent = item.path[-1] if item.path else item.loc[-1], item.path[:-1]
    where = f"in [{dotted(parent)}]" if parent else "at the top level"
    known = _known_keys(model, item.loc[:-1])
    if not known:
        return f"unknown key {key!r} {where}"
    close = difflib.get_close_matches(str(key), known, n=1)
    if close:
        return f"unknown key {key!r} {where} (did you mean {close[0]!r}?)"
    return f"unknown key {key!r} {where} (expected one of: {', '.join(known)})"


def dotted(path: KeyPath) -> str:
    """A key path as TOML writes it: `servers."my-server".args[0]`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            key = part if _BARE_KEY.fullmatch(part) else '"' + part.replace('"', '\\"') + '"'
            text += f".{key}" if text else key
    return text


def _known_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys the table at `loc` may have: field names and their aliases."""
    annotation: Any = model
    for part in loc:
        annotation = _step(annotation, part)
        if annotation is None:
            return []
    table = _as_model(annotation)
    if table is None:
        return []
    keys: list[str] = []
    for name, field in table.model_fields.items():
        keys.extend(dict.fromkeys([field.alias or name, name]))
    return keys


def _step(annotation: Any, part: str | int) -> Any:
    annotation = _without_none(annotation)
    table = _as_model(annotation)
    if table is not None:
        if not isinstance(part, str):
            return None
        for name, field in table.model_fields.items():
            if part.lower() in (name.lower(), (field.alias or name).lower()):
                return field.annotation
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and isinstance(part, int):
        return args[0]
    if origin is dict:
        return args[1]
    if origin in (typing.Union, types.UnionType):
        return next((_untagged(arg) for arg in args if part in _member_names(arg)), None)
    return None


def _member_names(member: Any) -> set[str]:
    # A union member appears in error locations by its class name, or by its tag in a tagged union.
    names = {getattr(_untagged(member), "__name__", None)}
    names.update(getattr(meta, "tag", None) for meta in getattr(member, "__metadata__", ()))
    return {name for name in names if isinstance(name, str)}


def _untagged(annotation: Any) -> Any:
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation


def _without_none(annotation: Any) -> Any:
    annotation = _untagged(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _as_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _without_none(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
