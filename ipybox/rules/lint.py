"""Approval rules checked against the tools the servers really have: names and arguments that match nothing.

A rule loads as long as it is well formed, so `tool = "get_current_tme"` loads and silently never applies.
`lint_rules` compares each rule with the tools its servers list and reports what can't be right, with a
"did you mean" taken from the real names:

- a server glob that matches no configured server;
- a tool glob that matches no tool of the servers the rule's server globs match;
- an `args` key (a name, or a dotted path into nested objects: `"options.mode"`) that the input schema of
  none of those tools declares (properties are found through `$ref` into `$defs`/`definitions`, and
  through the members of `anyOf`, `oneOf` and `allOf`);
- a condition that can't judge what the schema says the argument holds: `glob`, `not_glob` and `regex` on
  an argument that is never a string, an `equals`, `in` or `not_in` value the argument's type (or enum,
  or const) never holds. Values are checked against the schema's type, enum and const at the argument
  itself, not deeper (the items of a list value, the properties of an object value are not checked).

What is not judged, so that every finding is a real mistake rather than a guess:

- a rule whose server globs match a server whose tools are not known now (`unknown`: it failed to start,
  is still starting, is disabled): its tool and argument checks are skipped, since a misspelt tool can't
  be told from a tool of a server that is down. Its server globs are still checked;
- the tool globs of rules for shell commands (`server = "shell"`, where `tool` is any program, so no
  name can be wrong). Their arguments are checked: a shell command's call carries `cmd` (and `magic` for
  a script cell magic). A rule whose globs match the shell server and real servers (the default
  `server = "*"`) is checked against the real servers' tools: a program name there is reported, with a
  hint to write `server = "shell"` if a shell command was meant. A kernel's questions (`server =
  "ipybox"`) have the tools `shell` and `shell_magic`, with the same arguments;
- `annotations` and `exists` conditions (the models check annotation names when the file loads).

An argument the schema does not declare is a finding even when the schema allows other properties
(`additionalProperties` true or absent, as most MCP servers' schemas are): a server that takes arguments
it does not declare is rare, a misspelt argument common. The message says "not declared in the schema"
then, and "does not exist" only when the schema closes the object (`additionalProperties: false`). A
name that `additionalProperties` (a schema) or a `patternProperties` regex admits is declared.

Pure: it reads plain data (`ToolShape`: a tool's name, JSON input schema and annotations, as the caller
copied them from an MCP listing), so this layer never imports the MCP SDK, and returns findings without
locating them in a file (`ipybox.config.policy_lint` does). Schemas come from servers and may be hostile:
every walk is bounded by the number of distinct schema nodes and by `MAX_SCHEMA_DEPTH`, never exponential
in cycles of `$ref`s, and a reference or keyword it can't read makes the schema accept more, never fewer
(no finding rather than a wrong one).

Example:
    ```python
    tools = {"time": [ToolShape("get_current_time", {"type": "object", "properties": {"timezone": {"type": "string"}}})]}
    [finding] = lint_rules([Rule(server="time", tool="get_current_tme", decision="allow")], tools)
    finding.message  # "tool glob 'get_current_tme' matches no tool of server 'time' (did you mean 'get_current_time'?)"
    ```
"""

from __future__ import annotations

import difflib
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ipybox.rules.engine import rule_id as _rule_id
from ipybox.rules.linear_regex import LinearRegex
from ipybox.rules.matching import ConditionFields, RuleFields, compile_globs, json_equal, show
from ipybox.rules.shell_commands import KERNEL_SHELL_SERVER, KERNEL_SHELL_TOOLS, SHELL_SERVER

__all__ = ["MAX_SCHEMA_DEPTH", "LintFinding", "ToolShape", "lint_rules"]

MAX_SCHEMA_DEPTH: Final = 64
"""The deepest nesting of subschemas (`$ref`s, `anyOf` members...) followed when judging a value or a
type; deeper accepts anything (no finding). Finding a property follows any depth."""

_VIRTUAL_SERVERS: Final = (SHELL_SERVER, KERNEL_SHELL_SERVER)
_LISTED: Final = 8  # names listed in a message when there is no close match to suggest
_JSON_TYPES: Final = ("string", "integer", "number", "boolean", "null", "array", "object")
_A_TYPE: Final = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
}


@dataclass(frozen=True, slots=True)
class ToolShape:
    """What linting reads of one tool of a server.

    Attributes:
        name: The tool's name as the server lists it.
        input_schema: Its JSON Schema for the arguments (`inputSchema` of the MCP listing).
        annotations: Its MCP annotations (`{"readOnlyHint": True, ...}`); not judged yet, kept so that a
            caller builds one shape per tool for every check.
    """

    name: str
    input_schema: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LintFinding:
    """One thing in one rule that can't be right.

    Attributes:
        rule_index: The rule's index in `[[approval.rules]]` (0-based, file order).
        rule_id: How verdicts name the rule: its `id`, or `rules[<index>]`.
        key: Where in the rule, as keys from the rule's table: `("server",)`, `("tool", 1)` (the second
            glob of a list), `("args", "options.mode")`, `("args", "count", "glob")` (one condition),
            `("args", "color", "in", 2)` (the first value of an `in` that can't be).
        message: What is wrong and, where known, what was meant; one line, without the rule's name.
        suggestion: The real name (or argument path, or enum value) closest to the one written, if any.
    """

    rule_index: int
    rule_id: str
    key: tuple[str | int, ...]
    message: str
    suggestion: str | None = None


def lint_rules(
    rules: Sequence[RuleFields],
    tools: Mapping[str, Sequence[ToolShape]],
    *,
    unknown: Collection[str] = (),
) -> list[LintFinding]:
    """The findings for `rules` (rule by rule, in file order; see the module for what is checked).

    Args:
        rules: The rules (`Rule`s, or anything with their `RuleFields`), in file order.
        tools: The tools of each configured server whose tools are known now, by server name.
        unknown: The configured servers whose tools are not known now (failed, starting, disabled): rules
            that may be meant for them are not judged on tools and arguments.
    """
    servers = _Servers(tools, unknown)
    findings: list[LintFinding] = []
    for index, rule in enumerate(rules):
        findings.extend(_RuleLint(rule, index, servers).findings())
    return findings


# -- the servers and tools a rule is compared with


# What a shell command's call and a kernel's question about one carry (`shell_commands.shell_calls`,
# `ipybox.in_kernel.shell_approval`): the command line, and for a script cell magic the magic's line.
_SHELL_ARGS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"cmd": {"type": "string"}, "magic": {"type": "string"}},
    "additionalProperties": False,
}
_SHELL_COMMAND: Final = ToolShape("", _SHELL_ARGS)
"""Every program a rule for `server = "shell"` may name: its arguments only (messages: "shell commands")."""
_KERNEL_TOOLS: Final = tuple(ToolShape(name, _SHELL_ARGS) for name in KERNEL_SHELL_TOOLS)


class _Servers:
    """The tools known, and each tool's schema read once however many rules ask about it."""

    def __init__(self, tools: Mapping[str, Sequence[ToolShape]], unknown: Collection[str]) -> None:
        self.tools = tools
        self.unknown = frozenset(unknown)
        self.configured = sorted({*tools, *unknown})
        self._schemas: dict[int, _Schema] = {}

    def schema(self, tool: ToolShape) -> _Schema:
        schema = self._schemas.get(id(tool))
        if schema is None:
            schema = self._schemas[id(tool)] = _Schema(tool.input_schema)
        return schema


def _globs(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _matcher(glob: str) -> Callable[[str], bool]:
    match = compile_globs([glob])  # the engine's own matching: case-sensitive fnmatch
    return (lambda _: True) if match is None else (lambda name: bool(match(name)))


class _RuleLint:
    def __init__(self, rule: RuleFields, index: int, servers: _Servers) -> None:
        self.rule = rule
        self.index = index
        self.id = _rule_id(rule, index)
        self.servers = servers

    def finding(self, key: tuple[str | int, ...], message: str, suggestion: str | None = None) -> LintFinding:
        return LintFinding(self.index, self.id, key, message, suggestion)

    def findings(self) -> Iterator[LintFinding]:
        server_globs = _globs(self.rule.server)
        configured = self.servers.configured
        matched: set[str] = set()
        for position, glob in enumerate(server_globs):
            names = [name for name in (*configured, *_VIRTUAL_SERVERS) if _matcher(glob)(name)]
            matched.update(names)
            if not names:
                key = ("server",) if isinstance(self.rule.server, str) else ("server", position)
                yield self._no_server(key, glob, configured)
        if not matched or matched & self.servers.unknown:
            return  # nothing to compare with, or the tools that may be meant are not known now
        yield from self._tools_and_args(matched, shell_named=SHELL_SERVER in server_globs)

    def _no_server(self, key: tuple[str | int, ...], glob: str, configured: list[str]) -> LintFinding:
        suggestion = _closest(glob, [*configured, *_VIRTUAL_SERVERS])
        if suggestion is not None:
            hint = f"did you mean {suggestion!r}?"
        elif configured:
            hint = f"configured: {_names(configured)}"
        else:
            hint = "no servers are configured"
        return self.finding(key, f"server glob {glob!r} matches no configured server ({hint})", suggestion)

    def _tools_and_args(self, matched: set[str], *, shell_named: bool) -> Iterator[LintFinding]:
        known = sorted(name for name in matched if name in self.servers.tools)
        shell = SHELL_SERVER in matched
        listed = [shape for server in known for shape in self.servers.tools[server]]
        if KERNEL_SHELL_SERVER in matched:
            listed.extend(_KERNEL_TOOLS)
        # Any program is a shell command's tool: no name can be judged when the rule names the shell
        # server, or reaches no other tool list (`server = "s*"`). A wildcard that also matches real
        # servers (the default "*") is judged against their tools: a typo there is likelier than a rule
        # for both MCP tools and programs.
        judge_tools = not shell_named and (bool(known) or not shell)
        where = known or [KERNEL_SHELL_SERVER]
        selected: list[ToolShape] = []
        for position, glob in enumerate(_globs(self.rule.tool)):
            match = _matcher(glob)
            hits = [shape for shape in listed if match(shape.name)]
            selected.extend(hits)
            if not hits and judge_tools:
                key = ("tool",) if isinstance(self.rule.tool, str) else ("tool", position)
                yield self._no_tool(key, glob, where, [shape.name for shape in listed], shell=shell)
        if shell:
            selected.append(_SHELL_COMMAND)
        if not selected:
            return  # no tool matched: the tool finding says it all
        tools = list({id(shape): shape for shape in selected}.values())
        for path, condition in self.rule.args.items():
            yield from self._argument(path, condition, tools)

    def _no_tool(
        self, key: tuple[str | int, ...], glob: str, servers: list[str], names: list[str], *, shell: bool
    ) -> LintFinding:
        names = list(dict.fromkeys(names))
        suggestion = _closest(glob, names)
        where = f"server {servers[0]!r}" if len(servers) == 1 else f"servers {_names(servers)}"
        if suggestion is not None:
            hint = f" (did you mean {suggestion!r}?)"
        elif names:
            hint = f" ({'its' if len(servers) == 1 else 'their'} tools: {_names(names)})"
        else:
            hint = f" ({'it lists' if len(servers) == 1 else 'they list'} no tools)"
        if shell and suggestion is None:
            hint += (
                f"; its server globs also match {SHELL_SERVER!r}, so it applies to a shell command {glob!r}: "
                f'if that is what it is for, write server = "{SHELL_SERVER}"'
            )
        return self.finding(key, f"tool glob {glob!r} matches no tool of {where}{hint}", suggestion)

    # -- arguments

    def _argument(
        self, path: str, condition: ConditionFields, tools: Sequence[ToolShape]
    ) -> Iterator[LintFinding]:
        declared: list[tuple[ToolShape, _Schema, Any]] = []
        misses: list[_Miss] = []
        for shape in tools:
            schema = self.servers.schema(shape)
            found = schema.walk(path.split("."))
            if isinstance(found, _Miss):
                misses.append(found)
            else:
                declared.extend((shape, schema, node) for node in found)
        if not declared:
            yield self._undeclared(path, tools, misses)
            return
        yield from self._condition_types(path, condition, declared)

    def _undeclared(self, path: str, tools: Sequence[ToolShape], misses: Sequence[_Miss]) -> LintFinding:
        key = ("args", path)
        # The miss that got furthest into the path is the one to explain (a typo in its last part).
        miss = max(misses, key=lambda m: len(m.prefix))
        where = _tools_text([tool for tool, m in zip(tools, misses, strict=True) if m.prefix == miss.prefix])
        prefix = ".".join(miss.prefix)
        if miss.not_object is not None:
            return self.finding(
                key,
                f"argument {path!r}: {prefix!r} is {miss.not_object} in the schema of {where}, not an object, "
                "so the path never reaches a value (the argument always counts as absent)",
            )
        alike = [m for m in misses if m.prefix == miss.prefix]
        close = _closest(miss.missing, [name for m in alike for name in m.candidates])
        suggestion = f"{prefix}.{close}" if close is not None and prefix else close
        closed = all(m.closed for m in alike)
        notes = [f"{prefix!r} has no property {miss.missing!r}" + (" and allows no others" if closed else "")]
        if not prefix:
            notes = ["its schema allows no other arguments"] if closed else []
        if closed:
            what = f"argument {path!r} does not exist in {where}"
        else:
            what = f"argument {path!r} is not declared in the schema of {where}"
        if suggestion is not None:
            notes.append(f"did you mean {suggestion!r}?")
        return self.finding(key, f"{what} ({'; '.join(notes)})" if notes else what, suggestion)

    def _condition_types(
        self, path: str, condition: ConditionFields, declared: Sequence[tuple[ToolShape, _Schema, Any]]
    ) -> Iterator[LintFinding]:
        where = _tools_text([shape for shape, _, _ in declared])
        described = " or ".join(dict.fromkeys(schema.describe(node) for _, schema, node in declared))
        intro = f"argument {path!r} is {described} in the schema of {where}"
        given = condition.conditions()
        for name in ("glob", "not_glob", "regex"):
            if name not in given or any(schema.could_be(node, "string") for _, schema, node in declared):
                continue
            # The engine's resolution toward caution (see ArgCondition): what the condition does instead.
            if self.rule.decision == "allow":
                effect = "so in this allow rule it never holds and the rule never applies"
            else:
                effect = f"so in this {self.rule.decision} rule it holds for every value the argument has"
            pattern = getattr(condition, name)
            yield self.finding(
                ("args", path, name), f"{intro}: {name} = {show(pattern)} judges strings only, {effect}"
            )

        def holdable(value: Any) -> bool:
            return any(schema.accepts(node, value) for _, schema, node in declared)

        def suggest(value: Any) -> str | None:
            if not isinstance(value, str):
                return None
            return _closest(value, [v for _, schema, node in declared for v in schema.enum_strings(node)])

        if "equals" in given and not holdable(condition.equals):
            suggestion = suggest(condition.equals)
            hint = f" (did you mean {suggestion!r}?)" if suggestion is not None else ""
            message = f"{intro}: equals = {show(condition.equals)} can never hold{hint}"
            yield self.finding(("args", path, "equals"), message, suggestion)
        for name, values in (("in", condition.one_of), ("not_in", condition.not_in)):
            if values is None:
                continue
            positions = [position for position, value in enumerate(values) if not holdable(value)]
            never = [values[position] for position in positions]
            if not never:
                continue
            suggestion = next((s for s in map(suggest, never) if s is not None), None)
            hint = f" (did you mean {suggestion!r}?)" if suggestion is not None else ""
            shown = ", ".join(show(value) for value in never)
            if name == "not_in":
                verb, them = ("is", "it") if len(never) == 1 else ("are", "them")
                effect = f"not_in: {shown} {verb} never its value, so excluding {them} does nothing"
            elif len(never) == len(values):
                effect = f"in = {show(list(values))} can never hold"
            else:
                effect = f"in: {shown} can never match"
            # Placed at the first value that can't be (a list in TOML is numbered from 0, as here).
            yield self.finding(("args", path, name, positions[0]), f"{intro}: {effect}{hint}", suggestion)


def _tools_text(tools: Iterable[ToolShape]) -> str:
    """`tool 'a'`, `tools 'a', 'b'`, `shell commands`, `tool 'a' and shell commands`."""
    tools = list(tools)
    names = list(dict.fromkeys(tool.name for tool in tools if tool is not _SHELL_COMMAND))
    parts = [f"tool {names[0]!r}" if len(names) == 1 else f"tools {_names(names)}"] if names else []
    if any(tool is _SHELL_COMMAND for tool in tools):
        parts.append("shell commands")
    return " and ".join(parts)


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def _closest(written: str, names: Iterable[str]) -> str | None:
    """The real name most like `written` (a glob's text counts as written), if one is close enough."""
    candidates = [name for name in dict.fromkeys(names) if name != written]
    close = difflib.get_close_matches(written, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    # A case slip (`Get_Time`) is read as far from its name by difflib: compare without case too.
    lowered = {name.lower(): name for name in candidates}
    close = difflib.get_close_matches(written.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


# -- JSON schemas, as far as linting needs them


@dataclass(frozen=True)
class _Miss:
    """Where an argument path left the schema: after `prefix`, no property `missing` (among `candidates`),
    or `prefix` is never an object (`not_object`: what it is)."""

    prefix: tuple[str, ...]
    missing: str
    candidates: tuple[str, ...] = ()
    closed: bool = False
    not_object: str | None = None


_ANYTHING: Final[Mapping[str, Any]] = {}  # the schema `true`, as a branch


class _Schema:
    """One tool's input schema: `$ref`s resolved against it, each question answered once per node."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        # `could_be` answers by type, for every rule that asks: a node is judged once per type.
        self._could_be: dict[str, dict[int, bool]] = {}

    def resolve(self, ref: str) -> Any:
        """The subschema a local reference (`#/$defs/Point`) points to; `None` for any other (a remote
        URL, a pointer to nothing), which then constrains nothing."""
        if not ref.startswith("#"):
            return None
        node: Any = self.root
        pointer = urllib.parse.unquote(ref[1:])
        if not pointer:
            return node
        if not pointer.startswith("/"):
            return None  # an anchor (`#foo`): not followed
        for part in pointer[1:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def branches(self, node: Any) -> list[Mapping[str, Any]]:
        """`node` and every subschema it may stand for (`$ref` targets, members of `anyOf`/`oneOf`/`allOf`,
        transitively), each once."""
        # Iterative, each node once: no depth limit is needed, however deep or cyclic the references.
        out: list[Mapping[str, Any]] = []
        seen: set[int] = set()
        pending: list[Any] = [node]
        while pending:
            current = pending.pop()
            if current is True:
                current = _ANYTHING
            if not isinstance(current, Mapping) or id(current) in seen:
                continue
            seen.add(id(current))
            out.append(current)
            ref = current.get("$ref")
            if isinstance(ref, str):
                pending.append(self.resolve(ref))
            for keyword in ("anyOf", "oneOf", "allOf"):
                members = current.get(keyword)
                if isinstance(members, list):
                    pending.extend(reversed(members))
        return out

    def walk(self, path: Sequence[str]) -> list[Any] | _Miss:
        """The subschemas the argument at `path` (names into nested objects) is declared by, or where the
        path leaves the schema. A part of the path whose schema says nothing this module reads (a remote
        `$ref`) is declared as anything, and so is the rest of the path."""
        nodes: list[Any] = [self.root]
        for depth, name in enumerate(path):
            prefix = tuple(path[:depth])
            found: list[Any] = []
            candidates: list[str] = []
            closed = True  # every object the value may be forbids other properties
            objects = False
            others: list[Mapping[str, Any]] = []  # alternatives that are never objects
            # The alternatives the value may be: wrappers (`{"$ref": ...}`, `{"anyOf": [...]}`) only
            # point to them.
            for branch in (b for node in nodes for b in self.branches(node)):
                if not _constrains_object(branch):
                    continue
                if not self.could_be(branch, "object"):
                    others.append(branch)
                    continue
                objects = True
                properties = branch.get("properties")
                if isinstance(properties, Mapping):
                    candidates.extend(key for key in properties if isinstance(key, str))
                    if name in properties:
                        found.append(properties[name])
                        continue
                patterns = branch.get("patternProperties")
                if isinstance(patterns, Mapping) and patterns:
                    closed = False
                    found.extend(schema for pattern, schema in patterns.items() if _searches(pattern, name))
                additional = branch.get("additionalProperties", True)
                if isinstance(additional, Mapping):
                    found.append(additional)  # any name is declared, with this schema
                elif additional is not False:
                    closed = False
            if found:
                nodes = found
            elif objects:
                return _Miss(prefix, name, tuple(dict.fromkeys(candidates)), closed)
            elif others:
                what = " or ".join(dict.fromkeys(self.describe(branch) for branch in others))
                return _Miss(prefix, name, not_object=what)
            else:
                return [True]  # nothing readable: not judged
        return nodes

    def could_be(self, node: Any, json_type: str) -> bool:
        """Whether `node` accepts some value of `json_type` (as far as type, enum, const and the combinators
        tell; anything else constrains nothing)."""
        memo = self._could_be.setdefault(json_type, {})
        return self._holds(node, lambda schema: _could_be_here(schema, json_type), memo)

    def accepts(self, node: Any, value: Any) -> bool:
        """Whether `node` accepts `value`, judged by type, enum and const at this level only."""
        return self._holds(node, lambda schema: _accepts_here(schema, value), {})

    def _holds(
        self, node: Any, here: Callable[[Mapping[str, Any]], bool], memo: dict[int, bool], depth: int = 0
    ) -> bool:
        if isinstance(node, bool):
            return node
        if not isinstance(node, Mapping) or depth > MAX_SCHEMA_DEPTH:
            return True
        key = id(node)
        if key in memo:
            return memo[key]
        memo[key] = True  # a cycle of references constrains nothing more than its first visit
        result = here(node)
        ref = node.get("$ref")
        if result and isinstance(ref, str):
            result = self._holds(self.resolve(ref), here, memo, depth + 1)
        members = node.get("allOf")
        if result and isinstance(members, list):
            result = all(self._holds(member, here, memo, depth + 1) for member in members)
        for keyword in ("anyOf", "oneOf"):
            members = node.get(keyword)
            if result and isinstance(members, list) and members:
                result = any(self._holds(member, here, memo, depth + 1) for member in members)
        memo[key] = result
        return result

    def describe(self, node: Any, depth: int = 0) -> str:
        """What `node` holds, for a message: `an integer`, `one of 'a', 'b'`, `a string or null`."""
        if node is True or (isinstance(node, Mapping) and not node):
            return "anything"
        if not isinstance(node, Mapping) or depth > 8:
            return "constrained by its schema"
        if "const" in node:
            return f"always {show(node['const'])}"
        enum = node.get("enum")
        if isinstance(enum, list) and enum:
            return (
                "one of "
                + ", ".join(show(value) for value in enum[:_LISTED])
                + (", ..." if len(enum) > _LISTED else "")
            )
        types = _types(node)
        if types is not None:
            return " or ".join(_A_TYPE[t] for t in types) if types else "nothing"
        ref = node.get("$ref")
        if isinstance(ref, str):
            return self.describe(self.resolve(ref), depth + 1)
        for keyword in ("anyOf", "oneOf"):
            members = node.get(keyword)
            if isinstance(members, list) and members:
                return " or ".join(dict.fromkeys(self.describe(member, depth + 1) for member in members))
        return "constrained by its schema"

    def enum_strings(self, node: Any) -> list[str]:
        """The string values `node`'s enums and consts allow, for suggestions."""
        values: list[str] = []
        for branch in self.branches(node):
            enum = branch.get("enum")
            if isinstance(enum, list):
                values.extend(value for value in enum if isinstance(value, str))
            if isinstance(branch.get("const"), str):
                values.append(branch["const"])
        return values


def _types(schema: Mapping[str, Any]) -> list[str] | None:
    """The JSON types `type` allows (with OpenAPI's `nullable: true`), or `None` when it names none."""
    given = schema.get("type")
    names = [given] if isinstance(given, str) else given if isinstance(given, list) else None
    if names is None:
        return None
    types = [name for name in names if name in _JSON_TYPES]
    if len(types) != len(names):
        return None  # a type this module does not know: judged as unconstrained
    if schema.get("nullable") is True and "null" not in types:
        types.append("null")
    return types


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return "unknown"


def _type_allows(types: Sequence[str], json_type: str) -> bool:
    # An integer is a number; a whole number is an integer (JSON Schema: 1.0 is an integer).
    return json_type in types or (json_type == "integer" and "number" in types)


def _accepts_here(schema: Mapping[str, Any], value: Any) -> bool:
    if "const" in schema and not json_equal(schema["const"], value):
        return False
    enum = schema.get("enum")
    if isinstance(enum, list) and not any(json_equal(option, value) for option in enum):
        return False
    types = _types(schema)
    return types is None or _type_allows(types, _json_type(value))


def _could_be_here(schema: Mapping[str, Any], json_type: str) -> bool:
    if "const" in schema and not _type_allows([json_type], _json_type(schema["const"])):
        return False
    enum = schema.get("enum")
    if isinstance(enum, list) and not any(_type_allows([json_type], _json_type(option)) for option in enum):
        return False
    types = _types(schema)
    return types is None or json_type in types or (json_type == "integer" and "number" in types)


def _constrains_object(schema: Mapping[str, Any]) -> bool:
    """Whether `schema` says something of the value itself, rather than only pointing to the schemas that do
    (`{"$ref": ...}`, `{"anyOf": [...]}`, with at most annotations beside): `{}` does (anything)."""
    return any(key not in _WRAPPER_KEYS for key in schema) or not any(key in schema for key in _POINTERS)


_POINTERS: Final = frozenset({"$ref", "anyOf", "oneOf", "allOf"})
_WRAPPER_KEYS: Final = _POINTERS | {"title", "description", "default", "examples", "$comment", "deprecated"}


def _searches(pattern: Any, name: str) -> bool:
    """Whether a `patternProperties` regex finds `name`. A server's regex is run by RE2, in linear time (a
    hostile `(a+)+$` can't hang the check); one it can't run may declare the name, which is no finding."""
    if not isinstance(pattern, str):
        return False
    try:
        return LinearRegex(f"(?s:.*)(?:{pattern})(?s:.*)").fullmatch(name) is not False
    except ValueError:
        return True
