"""The `[approval]` table of `ipybox.toml`: a default decision and rules that allow, deny or ask.

```toml
[approval]
default = "ask"        # what happens to a call no rule matches
ask_timeout = 60       # seconds an `ask` waits for the application; then the call is denied

[[approval.rules]]
id = "read-only"
server = "filesystem"                  # glob (or list of globs) on the server name
tool = ["read_*", "list_*"]            # glob (or list of globs) on the tool name
annotations = { readOnlyHint = true }  # MCP tool annotations the tool must declare
decision = "allow"
match = [{ server = "filesystem", tool = "read_file", args = { path = "notes.md" }, annotations = { readOnlyHint = true } }]
not_match = [{ server = "filesystem", tool = "read_file" }]   # undeclared readOnlyHint counts as false

[[approval.rules]]
id = "no-writes-outside-out"
server = "filesystem"
tool = "write_file"
args = { path = { not_glob = "out/**" } }  # argument conditions, all must hold
decision = "deny"
```

Loading the table validates it completely: unknown keys, invalid regexes (and regexes a linear-time
engine cannot run), unknown annotations and rules whose `match`/`not_match` examples disagree with them
are errors that name the rule. Checking the examples runs the same linear-time matching as deciding
calls: with Python's `re`, `ipybox validate` of a `(a+)+` rule with a 28-character example took 83 s.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from ipybox.rules.calls import AskRoute, Decision, Origin, ToolCall, Verdict
from ipybox.rules.engine import SEVERITY, RuleEngine
from ipybox.rules.linear_regex import LinearRegex
from ipybox.rules.matching import show
from ipybox.rules.tool_annotations import ANNOTATION_DEFAULTS, check_annotation_names

__all__ = [
    "AdminTier",
    "ApprovalPolicy",
    "ArgCondition",
    "CallQuota",
    "Decision",
    "ExampleCall",
    "Rule",
    "When",
]

_CONDITION_KEYS = frozenset(
    {"equals", "in", "one_of", "not_in", "glob", "not_glob", "regex", "exists", "from", "from_"}
)

ReadLabel = Literal["untrusted", "private"]
"""The labels a provenance condition names (`ipybox.rules.provenance`): what a session must not pass on."""


# Lets editors flag a misspelt annotation as the loader does.
_ANNOTATION_NAMES_SCHEMA: dict[str, Any] = {"propertyNames": {"enum": sorted(ANNOTATION_DEFAULTS)}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArgCondition(_Strict):
    """A condition on one argument; every condition given must hold. A bare value in TOML means `equals`.

    An absent argument fails every condition except `exists = false` (which cannot be combined with
    others). `glob`, `not_glob` and `regex` cannot judge a value that is not a string (a number, list,
    object...), so they resolve toward caution: in an `allow` rule they fail, so a permission is never
    granted on a value it was not written for; in `deny` and `ask` rules they hold, so a guard such as
    `path = { not_glob = "out/**" }` cannot be slipped by passing `path = ["../secret"]`. For the same
    reason prefer positive conditions (`in`, `glob`) in allow rules and negative ones in deny rules.

    Attributes:
        equals: The value equals this JSON value (`true` equals only booleans, not `1`). A condition only
            when given: `equals = null` (in JSON) is one, an omitted `equals` is not.
        in: The value is one of these (Python attribute: `one_of`).
        not_in: The value is none of these.
        glob: The value is a string matching this fnmatch glob (case-sensitive; `*` also matches `/`).
            Globs match the text, not a resolved path: `out/*` matches `out/../secret`; add a `regex` to
            refuse `..`.
        not_glob: The value is a string not matching this glob.
        regex: The value is a string this regex matches in full. Written as for Python's `re` and run by
            a linear-time engine (RE2), so no argument can make matching slow; look-around,
            backreferences and `\\b`, which that engine cannot do, are refused when the file loads.
        exists: `true`: the argument is present (with any value, even null); `false`: it is absent.
        from: The argument's value (or a value nested in it) matched a result of the same session with
            this label, `untrusted` or `private`, or any of a list (Python attribute: `from_`; see
            `ipybox.rules.provenance`: a signal, not a proof).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)

    equals: Any = None
    one_of: list[Any] | None = Field(default=None, validation_alias="in", serialization_alias="in")
    not_in: list[Any] | None = None
    glob: str | None = None
    not_glob: str | None = None
    regex: str | None = None
    exists: bool | None = None
    from_: ReadLabel | list[ReadLabel] | None = Field(
        default=None, validation_alias="from", serialization_alias="from"
    )

    @field_validator("regex")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            LinearRegex(value)  # raises ValueError naming what is wrong, or unsupported, and what to do
        return value

    @field_validator("one_of")
    @classmethod
    def _in_is_not_empty(cls, value: list[Any] | None) -> list[Any] | None:
        if value == []:
            raise ValueError("`in = []` can never hold; list at least one value")
        return value

    @model_validator(mode="after")
    def _names_a_condition(self) -> ArgCondition:
        given = self.conditions()
        if not given:
            raise ValueError(
                "an argument condition needs at least one of: equals, in, not_in, glob, not_glob, regex, exists, "
                "from"
            )
        if self.exists is False and given != ["exists"]:
            others = ", ".join(name for name in given if name != "exists")
            raise ValueError(
                f"`exists = false` cannot be combined with {others}: those fail on an absent argument, "
                "so the condition could never hold"
            )
        return self

    def conditions(self) -> list[str]:
        """The names (as written in TOML) of the conditions this object sets."""
        names = ["equals"] if "equals" in self.model_fields_set else []
        for name, value in (
            ("in", self.one_of),
            ("not_in", self.not_in),
            ("glob", self.glob),
            ("not_glob", self.not_glob),
            ("regex", self.regex),
            ("exists", self.exists),
            ("from", self.from_),
        ):
            if value is not None:
                names.append(name)
        return names

    @model_serializer(mode="wrap")
    def _only_conditions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Dump only the conditions set, so that a dumped policy loads back the same (`equals = null` stays).
        data: dict[str, Any] = handler(self)
        return {
            k: v
            for k, v in data.items()
            if v is not None or (k == "equals" and "equals" in self.model_fields_set)
        }


def _labels(value: ReadLabel | list[ReadLabel] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


class When(_Strict):
    """`when` of a rule: conditions on where the call's data came from (`ipybox.rules.provenance`); every
    one given must hold. Each names a label, `untrusted` or `private`, or a list of them (any may match).

    Attributes:
        session_read: The calling session has been delivered a result with this label (session taint,
            recorded on the host: code in the kernel cannot clear it).
        argument_from: Some argument's value matched a result of the session with this label (value
            provenance: a signal, not a proof; code can transform a value until it no longer matches).
    """

    session_read: ReadLabel | list[ReadLabel] | None = None
    argument_from: ReadLabel | list[ReadLabel] | None = None

    @model_validator(mode="after")
    def _names_a_condition(self) -> When:
        if self.session_read is None and self.argument_from is None:
            raise ValueError(
                'when needs session_read, argument_from or both, e.g. { session_read = "untrusted" }'
            )
        for name in ("session_read", "argument_from"):
            if getattr(self, name) == []:
                raise ValueError(f"when.{name}: an empty list can never hold; name a label")
        return self

    def read_labels(self) -> tuple[str, ...]:
        """The labels `session_read` names (any may match; none: no condition)."""
        return _labels(self.session_read)

    def from_labels(self) -> tuple[str, ...]:
        """The labels `argument_from` names (any may match; none: no condition)."""
        return _labels(self.argument_from)

    @model_serializer(mode="wrap")
    def _only_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None}


class ExampleCall(_Strict):
    """A tool call a rule must (`match`) or must not (`not_match`) apply to, checked when the file loads.

    Attributes:
        server: The server name.
        tool: The tool name.
        args: The call's arguments.
        annotations: The MCP annotations the tool declares; undeclared ones take the MCP defaults.
        session_read: The labels the calling session has read (provenance, see `When`).
        from: The label each argument's value came from, by argument path (Python attribute: `from_`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)

    server: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    annotations: dict[str, bool] = Field(default_factory=dict, json_schema_extra=_ANNOTATION_NAMES_SCHEMA)
    session_read: ReadLabel | list[ReadLabel] | None = None
    from_: dict[str, ReadLabel] | None = Field(
        default=None, validation_alias="from", serialization_alias="from"
    )

    @field_validator("annotations")
    @classmethod
    def _known_annotations(cls, value: dict[str, bool]) -> dict[str, bool]:
        check_annotation_names(value)
        return value

    def to_call(self) -> ToolCall:
        """The example as a `ToolCall` (its provenance as results of an `example` tool)."""
        read = tuple(Origin("example", "example", 0, label) for label in _labels(self.session_read))  # type: ignore[arg-type]
        provenance = {
            path: (Origin("example", "example", 0, label),) for path, label in (self.from_ or {}).items()
        }
        return ToolCall(
            self.server, self.tool, self.args, self.annotations, provenance=provenance, session_read=read
        )

    def __str__(self) -> str:
        """The example as error messages show it: `{server='fs', tool='read_file', args={...}}`."""
        parts = [f"server={self.server!r}", f"tool={self.tool!r}"]
        if self.args:
            parts.append(f"args={show(self.args)}")
        if self.annotations:
            parts.append(
                "annotations={" + ", ".join(f"{k}={show(v)}" for k, v in self.annotations.items()) + "}"
            )
        if self.session_read is not None:
            parts.append(f"session_read={show(self.session_read)}")
        if self.from_:
            parts.append(f"from={show(self.from_)}")
        return "{" + ", ".join(parts) + "}"


class CallQuota(_Strict):
    """`max_calls` of a rule: how many calls it decides before its decision becomes `over_quota`.

    Counted are the calls the rule let run (an `allow` rule's, an `ask` rule's once approved), per rule
    id, on the host; the counts survive a reload of the rules (a rule edited under the same id keeps its
    count). `session` counts per session (the lease of an attached application, else the kernel);
    `cell` per cell of a kernel, by the cell number the kernel reports (see `ToolCall.cell`: code in
    the kernel can claim a new cell, so `cell` limits runaway loops of honest code, and `session` is the
    bound it cannot reset).

    Attributes:
        session: At most this many calls per session.
        cell: At most this many calls per cell.
    """

    session: int | None = Field(default=None, ge=1)
    cell: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _names_a_limit(self) -> CallQuota:
        if self.session is None and self.cell is None:
            raise ValueError("max_calls needs session, cell or both, e.g. { session = 100, cell = 10 }")
        return self


def _bare_values_in_schema(schema: dict[str, Any]) -> None:
    # Editors validate against the JSON Schema: it must accept the bare values `args` turns into `equals`.
    condition = schema["additionalProperties"]
    schema["additionalProperties"] = {
        "anyOf": [condition, {"type": "string"}, {"type": "number"}, {"type": "boolean"}]
    }


class Rule(_Strict):
    """One approval rule. It applies to a call when every condition it names holds.

    Attributes:
        id: Names the rule in verdicts, the audit log and error messages; a rule without one is
            `rules[<index>]` (0-based, in file order).
        server: fnmatch glob on the server name (case-sensitive), or a list of globs any of which may match.
        tool: fnmatch glob on the tool name (case-sensitive), or a list of globs any of which may match.
        args: Conditions on arguments, keyed by name or by a dotted path into nested objects
            (`"options.mode"`); all must hold. A bare value means `equals`.
        annotations: MCP tool annotations and the value each must have. A tool that does not declare one is
            judged by the MCP default (`readOnlyHint = false`, `destructiveHint = true`,
            `idempotentHint = false`, `openWorldHint = true`), so `{ destructiveHint = true }` also catches
            tools that declare nothing. Annotations are the server's hints about its tools, not guarantees.
        decision: `allow`, `deny` or `ask`.
        priority: Among the rules that apply, the highest priority wins; at equal priority deny beats ask
            beats allow.
        match: Example calls the rule must apply to, checked when the file loads.
        not_match: Example calls the rule must not apply to, checked when the file loads.
        reason: Why the rule decides as it does, told to the calling code with the rule's id when it
            refuses a call (`ApprovalRejectedError.reason`), so that an agent learns what is allowed
            instead ("writes go under out/").
        max_calls: How many calls the rule lets run per session and per cell (`CallQuota`); past that
            its decision becomes `over_quota`. Not for `deny` rules, which let none run.
        over_quota: What the rule decides past `max_calls`: `ask` or `deny` (default: `ask` for an
            `allow` rule, `deny` for an `ask` rule).
        when: Conditions on where the call's data came from (`When`): the labels the calling session has
            read (`session_read`), the labels argument values matched (`argument_from`).
    """

    id: str | None = None
    server: str | list[str] = "*"
    tool: str | list[str] = "*"
    args: dict[str, ArgCondition] = Field(default_factory=dict, json_schema_extra=_bare_values_in_schema)
    annotations: dict[str, bool] = Field(default_factory=dict, json_schema_extra=_ANNOTATION_NAMES_SCHEMA)
    decision: Decision
    priority: int = 0
    match: list[ExampleCall] = Field(default_factory=list)
    not_match: list[ExampleCall] = Field(default_factory=list)
    reason: str | None = Field(default=None, max_length=1000)
    max_calls: CallQuota | None = None
    over_quota: Literal["ask", "deny"] | None = None
    when: When | None = None

    @model_validator(mode="after")
    def _quota_fits_the_decision(self) -> Rule:
        if self.max_calls is not None and self.decision == "deny":
            raise ValueError("max_calls: a deny rule lets no call run, so it has nothing to count; remove it")
        if self.over_quota is not None and self.max_calls is None:
            raise ValueError(
                "over_quota says what happens past max_calls: add max_calls, or remove over_quota"
            )
        if self.over_quota is not None and SEVERITY[self.over_quota] <= SEVERITY[self.decision]:
            raise ValueError(
                f"over_quota = {self.over_quota!r} in a {self.decision} rule: past its quota a rule only "
                f"gets stricter; use 'deny'"
            )
        return self

    def quota_decision(self) -> Decision:
        """What the rule decides past `max_calls`."""
        if self.over_quota is not None:
            return self.over_quota
        return "ask" if self.decision == "allow" else "deny"

    @field_validator("id")
    @classmethod
    def _id_names_one_rule(cls, value: str | None) -> str | None:
        if value == "":
            raise ValueError("a rule id must not be empty; leave `id` out for an unnamed rule")
        if value is not None and re.fullmatch(r"rules\[\d+\]", value):
            raise ValueError(f"{value!r} is how rules without an id are named; choose another id")
        return value

    @field_validator("server", "tool")
    @classmethod
    def _globs_given(cls, value: str | list[str]) -> str | list[str]:
        if value == []:
            raise ValueError("an empty list of globs matches nothing; use '*' to match any name")
        return value

    @field_validator("args", mode="before")
    @classmethod
    def _bare_values_mean_equals(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        normalized: dict[Any, Any] = {}
        for key, condition in value.items():
            if isinstance(condition, list):
                raise ValueError(
                    f"args.{key}: a bare list is ambiguous; write {{ in = {show(condition)} }} for any of "
                    f"these values or {{ equals = {show(condition)} }} for this exact list"
                )
            if isinstance(condition, Mapping) and condition and not condition.keys() & _CONDITION_KEYS:
                inner = next(iter(condition))
                raise ValueError(
                    f"args.{key}: {{ {inner} = ... }} is not a condition (conditions are equals, in, not_in, "
                    f'glob, not_glob, regex, exists, from); to match a nested argument use a dotted key ("{key}.{inner}" '
                    "= ...), to match a whole object use { equals = { ... } }"
                )
            is_condition = isinstance(condition, Mapping | ArgCondition)
            normalized[key] = condition if is_condition else {"equals": condition}
        return normalized

    @field_validator("args")
    @classmethod
    def _paths_well_formed(cls, value: dict[str, ArgCondition]) -> dict[str, ArgCondition]:
        for key in value:
            if "" in key.split("."):
                raise ValueError(f"args: {key!r} is not a valid argument path (empty name between dots)")
        return value

    @field_validator("annotations")
    @classmethod
    def _known_annotations(cls, value: dict[str, bool]) -> dict[str, bool]:
        check_annotation_names(value)
        return value


class AdminTier:
    """The rules of an admin policy file, a tier above a workspace's (see `ipybox.config.admin_policy`).

    Its rules only tighten: `deny` and `ask` (an `allow` is refused when the file loads), and a tier's
    verdict counts only when one of its rules applies (it has no default). A workspace's rules cannot
    loosen it: `ApprovalPolicy.decide` takes the strictest verdict of the tiers and the workspace.

    Args:
        name: The tier, as verdicts and messages name it (`system`, `user`).
        source: The file it was read from.
        rules: Its rules, in file order.
    """

    __slots__ = ("engine", "name", "rules", "source")

    def __init__(self, name: str, source: str, rules: list[Rule]) -> None:
        self.name = name
        self.source = source
        self.rules = rules
        self.engine = RuleEngine(rules, "allow", tier=name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AdminTier):
            return NotImplemented
        return (self.name, self.source, self.rules) == (other.name, other.source, other.rules)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"AdminTier({self.name!r}, {self.source!r}, {len(self.rules)} rules)"

    def decide(self, call: ToolCall) -> Verdict | None:
        """The verdict of this tier's strongest rule that applies to `call`, or `None` if none does."""
        verdict = self.engine.decide(call)
        return verdict if verdict.rule_id is not None else None


class ApprovalPolicy(_Strict):
    """The `[approval]` table: rules, the default decision, and how long `ask` waits.

    Attributes:
        default: The decision when no rule applies.
        ask_timeout: Seconds an `ask` waits for an answer; then the call is denied.
        ask: Where an `ask` is put, in order: the first route that can answer is asked (`application`:
            the application attached to the calling kernel; `elicitation`: the calling MCP session's
            client, if it supports elicitation; `console`: an open web console; `terminal`: a running
            `ipybox approve`). People (`console`, `terminal`) listed here also see every pending ask and
            may answer it; the first answer wins.
        lint: What a rule that does not fit the live tools is (a tool glob that matches no tool, an
            argument no matched tool declares, a condition its type can never meet): `warn` reports it
            (`ipybox status`, the console, `ipybox validate --live`); `error` also refuses the edit that
            brings it, keeping the last good rules, as for any invalid edit.
        changed_tools: What a call to a tool that differs from its pin in `ipybox.lock` (changed, or new
            on a pinned server) is decided, until the change is accepted (`ipybox lock accept`): `ask`
            or `deny`. A rule's `deny` still stands.
        rules: The rules, in file order.

    The admin tiers (`admin`, set by `with_admin` when the workspace loads, never from `ipybox.toml`)
    are decided with it: see `AdminTier`.

    Example:
        ```python
        verdict = policy.decide(ToolCall("filesystem", "read_file", {"path": "notes.md"}))
        ```
    """

    default: Decision = "ask"
    ask_timeout: float = Field(default=60, gt=0)
    ask: list[AskRoute] = Field(default_factory=lambda: list(get_args(AskRoute)), min_length=1)
    lint: Literal["warn", "error"] = "warn"
    changed_tools: Literal["ask", "deny"] = "ask"
    rules: list[Rule] = Field(default_factory=list)

    @field_validator("ask")
    @classmethod
    def _routes_once(cls, value: list[AskRoute]) -> list[AskRoute]:
        repeated = sorted({route for route in value if value.count(route) > 1})
        if repeated:
            raise ValueError(f"each route is listed once; repeated: {', '.join(map(repr, repeated))}")
        return value

    _engine: RuleEngine | None = PrivateAttr(default=None)
    _admin: tuple[AdminTier, ...] = PrivateAttr(default=())

    @property
    def admin(self) -> tuple[AdminTier, ...]:
        """The admin tiers decided with these rules, strongest first (`system`, then `user`)."""
        return self._admin

    def with_admin(self, tiers: tuple[AdminTier, ...]) -> ApprovalPolicy:
        """This policy under the admin `tiers` (a copy)."""
        policy = self.model_copy()
        policy._admin = tuple(tiers)
        return policy

    @model_validator(mode="after")
    def _compile_and_check_examples(self) -> ApprovalPolicy:
        counts = Counter(rule.id for rule in self.rules if rule.id is not None)
        duplicates = sorted(id_ for id_, count in counts.items() if count > 1)
        if duplicates:
            raise ValueError(f"rule ids must be unique; duplicated: {', '.join(map(repr, duplicates))}")
        engine = RuleEngine(self.rules, self.default)
        problems = []
        for rule, matcher in zip(self.rules, engine.matchers, strict=True):
            label = matcher.label
            for example in rule.match:
                why_not = matcher.mismatch(example.to_call())
                if why_not is not None:
                    problems.append(f"{label}: example {example} is listed under match but {why_not}")
            for example in rule.not_match:
                call = example.to_call()
                if matcher.applies(call):
                    problems.append(
                        f"{label}: example {example} is listed under not_match but the rule applies to it: "
                        + matcher.why_it_applies(call)
                    )
        if problems:
            raise ValueError("\n".join(problems))
        self._engine = engine
        return self

    def decide(self, call: ToolCall) -> Verdict:
        """Decide `call`: the strongest rule that applies, or the default if none does.

        Args:
            call: The tool call.

        Returns:
            The decision, the rule that made it (`None` for the default) and a short reason.
        """
        # Read the slot directly: pydantic's attribute lookup for private attributes costs more than
        # the decision itself.
        engine: RuleEngine | None = self.__pydantic_private__["_engine"]  # type: ignore[index]
        if engine is None or engine.rules is not self.rules or engine.default != self.default:
            # model_construct() or model_copy(update=...) bypassed validation: compile what is there now,
            # never decide by the rules of the policy this one was copied from.
            engine = RuleEngine(self.rules, self.default)
            self._engine = engine
        verdict = engine.decide(call)
        admin: tuple[AdminTier, ...] = self.__pydantic_private__["_admin"]  # type: ignore[index]
        # The strictest verdict wins; at equal severity the higher tier is named (system, user, workspace).
        for tier in reversed(admin):
            ruled = tier.decide(call)
            if ruled is not None and SEVERITY[ruled.decision] >= SEVERITY[verdict.decision]:
                verdict = ruled
        return verdict

    def applying(self, call: ToolCall) -> list[Verdict]:
        """Every rule of every tier that applies to `call`, as verdicts: the admin tiers' first (strongest
        first within each), then the workspace's. `decide` picks among them (and the default)."""
        self.decide(call)  # compiles the engine if need be
        engine: RuleEngine = self.__pydantic_private__["_engine"]  # type: ignore[index]
        found = [verdict for tier in self._admin for verdict in tier.engine.applying(call)]
        return found + engine.applying(call)
