"""One approval rule compiled for matching: does it apply to a tool call, and if not, why not.

Globs and regexes are compiled once, when the policy loads, so matching a call costs a few dictionary
look-ups and regex matches. The semantics are documented on `Rule` and `ArgCondition`.

Rule regexes run on RE2 ([linear_regex][ipybox.rules.linear_regex]), in time linear in the argument:
with Python's backtracking `re`, `(a+)+` against 28 characters held the supervisor's event loop for 22 s.
Globs stay on Python's `re`: `fnmatch.translate` emits no nested quantifiers (runs of `*` are emulated
atomically), so a glob cannot backtrack catastrophically.

This module sits below [models][ipybox.rules.models], which compiles its rules with it: it reads a rule
through `RuleFields` and `ConditionFields`, the fields it needs, which the models have, and never imports
them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ipybox.rules.calls import Decision, ToolCall
from ipybox.rules.linear_regex import LinearRegex
from ipybox.rules.tool_annotations import annotation_value


class ConditionFields(Protocol):
    """What matching reads of a condition on one argument (`ArgCondition`, whose docs give the semantics)."""

    @property
    def equals(self) -> Any: ...
    @property
    def one_of(self) -> Sequence[Any] | None: ...
    @property
    def not_in(self) -> Sequence[Any] | None: ...
    @property
    def glob(self) -> str | None: ...
    @property
    def not_glob(self) -> str | None: ...
    @property
    def regex(self) -> str | None: ...
    @property
    def exists(self) -> bool | None: ...
    def conditions(self) -> list[str]:
        """The names of the conditions set: `equals` is one only when given (`None` is a JSON value)."""
        ...


class RuleFields(Protocol):
    """What matching and the engine read of a rule (`Rule`, whose docs give the semantics)."""

    @property
    def id(self) -> str | None: ...
    @property
    def server(self) -> str | Sequence[str]: ...
    @property
    def tool(self) -> str | Sequence[str]: ...
    @property
    def args(self) -> Mapping[str, ConditionFields]: ...
    @property
    def annotations(self) -> Mapping[str, bool]: ...
    @property
    def decision(self) -> Decision: ...
    @property
    def priority(self) -> int: ...


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Final = _Absent()
"""What `lookup` returns for an argument the call does not have (`None` is a value: JSON null)."""


def lookup(args: Mapping[str, Any], path: Sequence[str]) -> Any:
    """The argument at `path` (keys into nested objects), or `ABSENT`.

    A dot always separates keys: a literal top-level key `"a.b"` is not consulted for the path `a.b`,
    otherwise a call could pass both `{"a.b": harmless, "a": {"b": harmful}}` and have rules judge the
    value the server ignores.
    """
    value: Any = args
    for key in path:
        if not isinstance(value, Mapping):
            return ABSENT
        value = value.get(key, ABSENT)
        if value is ABSENT:
            return ABSENT
    return value


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values, except that booleans equal only booleans (Python has `True == 1`)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple | Mapping) or isinstance(b, list | tuple | Mapping):
        return False
    return bool(a == b)


def compile_globs(patterns: Sequence[str]) -> Callable[[str], object] | None:
    """A case-sensitive matcher for "any of these fnmatch globs" (truthy result: a match), or `None` if they
    match every string."""
    if "*" in patterns:
        return None
    if not any(char in pattern for pattern in patterns for char in "*?["):
        return frozenset(patterns).__contains__
    # fnmatch.translate anchors each pattern with \Z, so the alternation needs no extra grouping.
    regex = re.compile("|".join(fnmatch.translate(pattern) for pattern in patterns))
    return regex.match


def show(value: Any) -> str:
    """A value as a person editing TOML reads it: strings quoted, booleans lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value)


@dataclass(frozen=True, slots=True)
class _ArgCheck:
    path: tuple[str, ...]
    key: str
    text: str
    holds: Callable[[Any], bool]
    strings_only: bool
    regex: bool = False

    def cannot_judge(self, value: Any) -> tuple[str, str] | None:
        """Why this string condition cannot judge `value` (which then counts by the rule's decision), and
        what kind of value that is, for messages."""
        if not self.strings_only or value is ABSENT:
            return None
        if not isinstance(value, str):
            return "is not a string", "a non-string"
        if self.regex and _unreadable(value):
            return "has lone surrogates, which the regex engine cannot read", "such a string"
        return None


def _equals(expected: Any) -> Callable[[Any], bool]:
    return lambda value: value is not ABSENT and json_equal(value, expected)


def _one_of(options: Sequence[Any], *, negate: bool) -> Callable[[Any], bool]:
    def holds(value: Any) -> bool:
        if value is ABSENT:
            return False
        return any(json_equal(value, option) for option in options) is not negate

    return holds


def _string(match: Callable[[str], object], *, negate: bool, on_non_string: bool) -> Callable[[Any], bool]:
    def holds(value: Any) -> bool:
        if isinstance(value, str):
            return bool(match(value)) is not negate
        return value is not ABSENT and on_non_string

    return holds


def _regex(regex: LinearRegex, *, on_non_string: bool) -> Callable[[Any], bool]:
    def holds(value: Any) -> bool:
        if isinstance(value, str):
            matched = regex.fullmatch(value)
            # None: lone surrogates, which RE2 cannot read; judged like a non-string.
            return on_non_string if matched is None else matched
        return value is not ABSENT and on_non_string

    return holds


def _unreadable(value: Any) -> bool:
    """A string with lone surrogates: a regex cannot judge it (see `LinearRegex.fullmatch`)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return True
    return False


def _exists(expected: bool) -> Callable[[Any], bool]:
    return lambda value: (value is not ABSENT) is expected


def _always(_: str) -> bool:
    return True


def _arg_checks(key: str, condition: ConditionFields, *, on_non_string: bool) -> Iterator[_ArgCheck]:
    path = tuple(key.split("."))
    if "equals" in condition.conditions():
        yield _ArgCheck(path, key, f"equals = {show(condition.equals)}", _equals(condition.equals), False)
    if condition.one_of is not None:
        yield _ArgCheck(
            path, key, f"in = {show(condition.one_of)}", _one_of(condition.one_of, negate=False), False
        )
    if condition.not_in is not None:
        yield _ArgCheck(
            path, key, f"not_in = {show(condition.not_in)}", _one_of(condition.not_in, negate=True), False
        )
    for name, pattern, negate in (("glob", condition.glob, False), ("not_glob", condition.not_glob, True)):
        if pattern is not None:
            match = compile_globs([pattern]) or _always
            holds = _string(match, negate=negate, on_non_string=on_non_string)
            yield _ArgCheck(path, key, f"{name} = {show(pattern)}", holds, True)
    if condition.regex is not None:
        holds = _regex(LinearRegex(condition.regex), on_non_string=on_non_string)
        yield _ArgCheck(path, key, f"regex = {show(condition.regex)}", holds, True, regex=True)
    if condition.exists is not None:
        yield _ArgCheck(path, key, f"exists = {show(condition.exists)}", _exists(condition.exists), False)


class RuleMatcher:
    """A rule (`Rule`, or anything with its `RuleFields`) compiled for matching.

    Args:
        rule: The rule.
        rule_id: How verdicts and messages name the rule: its `id`, or `rules[<index>]`.
    """

    __slots__ = (
        "_annotations",
        "_args",
        "_argument_from",
        "_from",
        "_server",
        "_server_text",
        "_session_read",
        "_tool",
        "_tool_text",
        "decision",
        "label",
    )

    def __init__(self, rule: RuleFields, rule_id: str) -> None:
        self.decision = rule.decision
        self.label = f"rule {rule_id!r}" if rule.id is not None else rule_id
        self._server = compile_globs([rule.server] if isinstance(rule.server, str) else list(rule.server))
        self._tool = compile_globs([rule.tool] if isinstance(rule.tool, str) else list(rule.tool))
        self._server_text = show(rule.server)
        self._tool_text = show(rule.tool)
        self._annotations = tuple(rule.annotations.items())
        # Glob and regex conditions cannot judge a non-string; resolve that toward caution (see ArgCondition).
        on_non_string = rule.decision != "allow"
        self._args = tuple(
            check
            for key, condition in rule.args.items()
            for check in _arg_checks(key, condition, on_non_string=on_non_string)
        )
        # Provenance (`ipybox.rules.provenance`): read through getattr, so rules of other shapes need none.
        when = getattr(rule, "when", None)
        self._session_read: frozenset[str] = (
            frozenset(when.read_labels()) if when is not None else frozenset()
        )
        self._argument_from: frozenset[str] = (
            frozenset(when.from_labels()) if when is not None else frozenset()
        )
        self._from: tuple[tuple[str, frozenset[str]], ...] = tuple(
            (key, frozenset(_label_list(getattr(condition, "from_", None))))
            for key, condition in rule.args.items()
            if getattr(condition, "from_", None) is not None
        )

    def applies(self, call: ToolCall) -> bool:
        """Whether every condition of the rule holds for `call`."""
        if self._server is not None and not self._server(call.server):
            return False
        if self._tool is not None and not self._tool(call.tool):
            return False
        for name, expected in self._annotations:
            if annotation_value(call.annotations, name) is not expected:
                return False
        args = call.args
        for check in self._args:
            path = check.path
            # Most arguments are top-level: skip the general walk for them.
            value = args.get(path[0], ABSENT) if len(path) == 1 else lookup(args, path)
            if not check.holds(value):
                return False
        if self._session_read and self._session_read.isdisjoint(call.read_labels()):
            return False
        if self._argument_from and self._argument_from.isdisjoint(call.argument_labels()):
            return False
        return all(not labels.isdisjoint(call.argument_labels(key)) for key, labels in self._from)

    def mismatch(self, call: ToolCall) -> str | None:
        """Why the rule does not apply to `call` (its first condition that fails), or `None` if it applies."""
        if self._server is not None and not self._server(call.server):
            return f"the server glob {self._server_text} does not match {call.server!r}"
        if self._tool is not None and not self._tool(call.tool):
            return f"the tool glob {self._tool_text} does not match {call.tool!r}"
        for name, expected in self._annotations:
            value = annotation_value(call.annotations, name)
            if value is not expected:
                return (
                    f"the rule requires {name} = {show(expected)} and {_annotation_text(call, name, value)}"
                )
        for check in self._args:
            value = lookup(call.args, check.path)
            if check.holds(value):
                continue
            if value is ABSENT:
                return f"argument {check.key!r} is absent, so {check.text} does not hold"
            if (unjudged := check.cannot_judge(value)) is not None:
                why, kind = unjudged
                return (
                    f"argument {check.key!r} = {show(value)} {why}, and {check.text} "
                    f"never holds for {kind} in an allow rule"
                )
            return f"argument {check.key!r} = {show(value)} does not satisfy {check.text}"
        if self._session_read and self._session_read.isdisjoint(call.read_labels()):
            return (
                f"the rule requires the session to have read {_labels_text(self._session_read)} content and "
                f"it has read {_labels_text(call.read_labels()) or 'none'}"
            )
        if self._argument_from and self._argument_from.isdisjoint(call.argument_labels()):
            return (
                f"the rule requires an argument from {_labels_text(self._argument_from)} content and "
                f"the arguments matched {_labels_text(call.argument_labels()) or 'no recorded result'}"
            )
        for key, labels in self._from:
            if labels.isdisjoint(call.argument_labels(key)):
                return (
                    f"argument {key!r} is not from {_labels_text(labels)} content "
                    f"(it matched {_labels_text(call.argument_labels(key)) or 'no recorded result'})"
                )
        return None

    def why_it_applies(self, call: ToolCall) -> str:
        """The conditions that make the rule apply to `call` (which it must), for error messages."""
        reasons = []
        if self._server is not None:
            reasons.append(f"the server glob {self._server_text} matches {call.server!r}")
        if self._tool is not None:
            reasons.append(f"the tool glob {self._tool_text} matches {call.tool!r}")
        for name, _ in self._annotations:
            reasons.append(_annotation_text(call, name, annotation_value(call.annotations, name)))
        for check in self._args:
            value = lookup(call.args, check.path)
            if value is ABSENT:
                reasons.append(f"argument {check.key!r} is absent ({check.text})")
            elif (unjudged := check.cannot_judge(value)) is not None:
                reasons.append(
                    f"argument {check.key!r} = {show(value)} {unjudged[0]}, which counts as satisfying "
                    f"{check.text} in a {self.decision} rule"
                )
            else:
                reasons.append(f"argument {check.key!r} = {show(value)} satisfies {check.text}")
        if self._session_read:
            reasons.append(
                f"the session has read {_labels_text(self._session_read & call.read_labels())} content"
            )
        if self._argument_from:
            reasons.append(
                f"an argument is from {_labels_text(self._argument_from & call.argument_labels())} content"
            )
        for key, labels in self._from:
            reasons.append(
                f"argument {key!r} is from {_labels_text(labels & call.argument_labels(key))} content"
            )
        if not reasons:
            return "the rule has no conditions, so it applies to every call"
        return "; ".join(reasons)


def _label_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _labels_text(labels: frozenset[str]) -> str:
    return " or ".join(sorted(labels))


def _annotation_text(call: ToolCall, name: str, value: bool) -> str:
    declared = isinstance(call.annotations.get(name), bool)
    return f"the tool's {name} is {show(value)}" + ("" if declared else " (not declared, so the MCP default)")
