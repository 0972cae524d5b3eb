"""`write_answer_rule()`: a person's `always` answer to an `ask`, written into `ipybox.toml` as a rule.

The rule is appended after the last `[[approval.rules]]` table (before any comment that introduces what
follows it), with a comment saying who added it, when and why; everything else in the file stays byte for
byte as it was. It is the narrowest rule that decides the call as answered and covers nothing the asking
rule did not ask about:

```toml
# Added by console (root) on 2026-11-24 07:00 UTC: always allow filesystem.write_file (asked by rule 'ask-for-writes').
[[approval.rules]]
id = "always-allow-filesystem-write_file"
server = "filesystem"
tool = "write_file"
args = { path = { glob = "out/**" } }
decision = "allow"
priority = 11
match = [{ server = "filesystem", tool = "write_file", args = { path = "out/report.md", content = "# Report" } }]
```

- `server` and `tool` are the call's names, with fnmatch's `*?[` escaped so they match only themselves;
- the asking rule's own `args` and `annotations` conditions are copied, and to them the person's choice for
  each argument (`choices`, see `ArgChoice`): `any` value (no condition), `exact` (the call's value:
  `path = "out/report.md"`, or `{ equals = ... }` for a list or an object) or `glob:PATTERN` (a string
  matching the fnmatch glob, e.g. the path's directory `out/*`; globs match text, so `out/*` also matches
  `out/../x`). Left unchosen (`default_choices`), an argument is `any` when the asking rule had argument
  conditions of its own (they stay, as before) and `exact` otherwise, so that an ask no condition narrowed
  does not become a rule for any arguments for ever; `any` for all is a choice the person makes. An
  argument `exact` cannot hold (a null, which TOML cannot hold; a value the audit log redacts, which is
  never written; a name with a dot, which conditions read as a path) defaults to `any`;
- `priority` is one above the asking rule
  (0 when the policy's default asked), so the rule outranks the rule that asked and nothing else decides
  differently than before for calls that rule did not ask about;
- `match` is the call itself (arguments redacted; long strings that no condition tests folded to 200
  characters), so the loader checks on every load that the rule does what it was written for; the
  workspace's own path in it is written `{workspace}`, which the loader fills in for the directory the
  file is in (as in the conditions `ipybox init` writes), so the rule travels with a committed file.

Contract: the file is changed by `ipybox.config.file_edit.edit_config_file` (atomically, only if it loads
afterwards with the real loader) and only if the new rule then decides the call. Nothing is written, and
`RuleWriteError` says why and what to do instead, when: `ipybox.toml` is a symlink or not a regular
file; it does not load now, or would not with the rule (the loader's `file:line:col` reason); the
asking rule is not in the file as it is in effect (the rules come from the environment, or the file
changed since the ask); an allow rule would outrank a `deny` rule that applies to the same tool names (a
deny at the asking rule's priority, or below 0 when the default asked), which the asking rule had no say
over; or the file changed while the rule was written, twice (the first time it is read again and the
rule written anew).
"""

from __future__ import annotations

import re
import secrets
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import tomlkit
from pydantic import ValidationError
from tomlkit.items import AoT, Comment, InlineTable, Table, Trivia, Whitespace

from ipybox.config.errors import ConfigError
from ipybox.config.file_edit import EditRules, edit_config_file
from ipybox.config.loading import CONFIG_FILE, load_config
from ipybox.config.server_catalog import fill_workspace
from ipybox.config.toml_items import NOT_IN_COMMENT, toml_item
from ipybox.config.workspace_config import WorkspaceConfig
from ipybox.errors import IpyboxError
from ipybox.rules import SHELL_SERVER, ApprovalPolicy, Rule, ToolCall, Verdict
from ipybox.rules.engine import rule_id
from ipybox.rules.matching import RuleMatcher, compile_globs
from ipybox.rules.tool_annotations import ANNOTATION_DEFAULTS

__all__ = [
    "ArgChoice",
    "RuleWriteError",
    "WrittenRule",
    "answer_rule_text",
    "default_choices",
    "exact_refusal",
    "preview_answer_rule",
    "write_answer_rule",
]

ArgChoice = str
"""What an `always` rule requires of one argument: `any` (nothing), `exact` (the call's value) or
`glob:PATTERN` (a string matching the glob)."""

FOLD_CHARS: Final = 200
"""Strings in the `match` example longer than this are cut to it (unless a condition tests them)."""

_ID_CHARS: Final = re.compile(r"[^A-Za-z0-9_.-]+")
_GLOB_SPECIALS: Final = re.compile(r"[*?\[]")
_INDEX_ID: Final = re.compile(r"rules\[(\d+)\]")
_ANYWAY: Final = 'answering "once" or "for this session" still works'
_ANYWAY_SENTENCE: Final = _ANYWAY[0].upper() + _ANYWAY[1:] + "."


@dataclass(frozen=True)
class WrittenRule:
    """The rule `write_answer_rule` added to `ipybox.toml`.

    Attributes:
        id: The rule's id.
        decision: `allow` or `deny`.
        priority: The rule's priority.
        text: The TOML added: the comment line and the `[[approval.rules]]` table.
        line: The 1-based line of its `[[approval.rules]]` header in the file.
        choices: What it requires of each of the call's arguments (`ArgChoice`), the defaults filled in.
    """

    id: str
    decision: Literal["allow", "deny"]
    priority: int
    text: str
    line: int
    choices: Mapping[str, ArgChoice] = field(default_factory=dict, compare=False)


class RuleWriteError(IpyboxError, ValueError):
    """An `always` answer could not be written into `ipybox.toml` as a rule; nothing was written.

    `str(error)` says why and what to do instead (answering once or for the session still works).
    """


def write_answer_rule(
    config_path: Path,
    call: ToolCall,
    *,
    accept: bool,
    asked_by: str | None,
    by: str,
    when: datetime | None = None,
    redact: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
    choices: Mapping[str, ArgChoice] | None = None,
) -> WrittenRule:
    """Add a rule to `ipybox.toml` that decides `call` (and calls like it) as a person answered.

    Args:
        config_path: The workspace's `ipybox.toml` (or the workspace directory).
        call: The call that was asked about.
        accept: `True` writes an allow rule, `False` a deny rule.
        asked_by: The rule that asked (`Verdict.rule_id`: an id, or `rules[<index>]`), `None` when the
            policy's default asked.
        by: Who answered, for the comment (`console (root)`).
        when: When they answered (default: now); naive means UTC.
        redact: Applied to the call's arguments before they are written as the rule's `match` example
            (`AuditLog.redact`), so secrets stay out of the file.
        choices: What the rule requires of each argument, by name (`ArgChoice`); an argument left out
            gets `default_choices`'s. The preview the person narrowed (`preview_answer_rule`).

    Returns:
        What was written, and where.

    Raises:
        RuleWriteError: The rule was not written; the message says why and what to do instead.
    """
    request = _request(config_path, call, accept, asked_by, by, when, redact, choices)
    rules = EditRules(
        refuse=request.refuse,
        fix_first="fix it, then answer again",
        missing="there is no such file (was the workspace moved?)",
        by_hand=f"add the rule by hand. {_ANYWAY_SENTENCE}",
        again=f"answer again once it is saved. {_ANYWAY_SENTENCE}",
        change="the rule in it",
    )
    return edit_config_file(
        request.path,
        lambda text, current: _edit(request, text, current),
        lambda config, written: _took_effect(request, config, written),
        rules,
    )


def preview_answer_rule(
    config_path: Path,
    call: ToolCall,
    *,
    accept: bool,
    asked_by: str | None,
    by: str,
    when: datetime | None = None,
    redact: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
    choices: Mapping[str, ArgChoice] | None = None,
) -> WrittenRule:
    """The rule `write_answer_rule` would add with the same arguments, without writing anything: its
    text, id, line and the choices filled in, for the person to read and narrow before saving.

    The new rule is checked to decide `call` on its own (its conditions hold for the call); whether the
    whole file then decides the call by it is checked when it is written.

    Raises:
        RuleWriteError: It could not be written (the file does not load, the asking rule is gone, a
            choice does not hold for the call...): why, and what to do instead.
    """
    request = _request(config_path, call, accept, asked_by, by, when, redact, choices)
    try:
        text = request.path.read_text(encoding="utf-8")
        current = load_config(request.path)
    except FileNotFoundError:
        raise request.refuse("there is no such file (was the workspace moved?)") from None
    except OSError as e:
        raise request.refuse(f"it cannot be read ({e.strerror or e})") from None
    except ConfigError as e:
        raise request.refuse(f"it does not load as it is; fix it, then answer again:\n{e}") from None
    return _edit(request, text, current)[1]


def _request(
    config_path: Path,
    call: ToolCall,
    accept: bool,
    asked_by: str | None,
    by: str,
    when: datetime | None,
    redact: Callable[[Mapping[str, Any]], dict[str, Any]] | None,
    choices: Mapping[str, ArgChoice] | None,
) -> _Request:
    path = Path(config_path)
    if path.is_dir():
        path = path / CONFIG_FILE
    when = datetime.now(UTC) if when is None else when
    when = (when.replace(tzinfo=UTC) if when.tzinfo is None else when).astimezone(UTC)
    decision: Literal["allow", "deny"] = "allow" if accept else "deny"
    return _Request(path, call, decision, asked_by, by, when, redact, dict(choices or {}))


@dataclass(frozen=True)
class _Request:
    path: Path
    call: ToolCall
    decision: Literal["allow", "deny"]
    asked_by: str | None
    by: str
    when: datetime
    redact: Callable[[Mapping[str, Any]], dict[str, Any]] | None
    choices: Mapping[str, ArgChoice] = field(default_factory=dict)

    def refuse(self, why: str) -> RuleWriteError:
        return RuleWriteError(f"no rule was written into {self.path}: {why}")


def _edit(request: _Request, text: str, current: WorkspaceConfig) -> tuple[str, WrittenRule]:
    data = tomllib.loads(text)
    policy = current.approval
    asking, written = _asking_rule(request, policy, data)
    if request.decision == "allow":
        _refuse_outranking_a_deny(request, policy, asking)
    new_id = _unique_id(request, policy, data)
    priority = asking.priority + 1 if asking is not None else 0
    call = request.call
    redacted = request.redact(call.args) if request.redact is not None else dict(call.args)
    choices = {**default_choices(call, written.get("args") or {}, redacted), **request.choices}
    try:
        block = answer_rule_text(
            call,
            decision=request.decision,
            asked_by=request.asked_by,
            asking=written,
            choices=choices,
            rule_id=new_id,
            priority=priority,
            by=request.by,
            when=request.when,
            redacted=redacted,
            root=_root(request),
        )
    except ValueError as e:
        raise request.refuse(f"{e}. {_ANYWAY_SENTENCE}") from None
    _refuse_unless_it_applies(request, block, new_id)
    new_text, added, line = _insert(request, text, block)
    return new_text, WrittenRule(new_id, request.decision, priority, added, line, choices)


def _asking_rule(
    request: _Request, policy: ApprovalPolicy, data: Mapping[str, Any]
) -> tuple[Rule | None, Mapping[str, Any]]:
    """The rule that asked as it is in effect, and its table as the file writes it (`None` and `{}`: the
    default asked)."""
    name = request.asked_by
    if name is None:
        return None, {}
    index = next((i for i, rule in enumerate(policy.rules) if rule_id(rule, i) == name), None)
    if index is None:
        raise request.refuse(
            f"the rule that asked, {name!r}, is not among the rules in effect (the file changed since "
            f"the call was asked about?); {_ANYWAY}"
        )
    rule = policy.rules[index]
    if rule.decision != "ask" or not RuleMatcher(rule, name).applies(request.call):
        now = "no longer applies to this call" if rule.decision == "ask" else f"now decides {rule.decision}"
        raise request.refuse(
            f"rule {name!r} {now} (the file changed since the call was asked about); answer the call "
            "again if it is asked again"
        )
    approval = data.get("approval")
    written = approval.get("rules") if isinstance(approval, dict) else None
    in_file: Any = None
    if isinstance(written, list):
        by_index = _INDEX_ID.fullmatch(name)
        if by_index is not None:
            position = int(by_index.group(1))
            if (
                position < len(written)
                and isinstance(written[position], dict)
                and "id" not in written[position]
            ):
                in_file = written[position]
        else:
            in_file = next((r for r in written if isinstance(r, dict) and r.get("id") == name), None)
    try:
        # As the loader reads it: with the workspace placeholders filled in.
        same = in_file is not None and Rule.model_validate(fill_workspace(in_file, _root(request))) == rule
    except ValidationError:
        same = False
    if not same:
        raise request.refuse(
            f"the rule that asked, {name!r}, is not written in it as it is in effect: the rules in effect "
            "come from the environment (an IPYBOX_APPROVAL__RULES variable, or the workspace's .env), so "
            f"a rule added to the file would not take effect. Add the rule where the rules are set; {_ANYWAY}"
        )
    return rule, in_file


def _names(globs: str | Sequence[str]) -> list[str]:
    return [globs] if isinstance(globs, str) else list(globs)


def _refuse_outranking_a_deny(request: _Request, policy: ApprovalPolicy, asking: Rule | None) -> None:
    """An allow rule one above the asking rule would also outrank the deny rules at its priority (at equal
    priority deny beat the ask), which may apply to other calls of the tool."""
    call = request.call
    for index, rule in enumerate(policy.rules):
        if rule.decision != "deny":
            continue
        if (rule.priority != asking.priority) if asking is not None else (rule.priority >= 0):
            continue
        servers, tools = compile_globs(_names(rule.server)), compile_globs(_names(rule.tool))
        # `None`: the globs match every name.
        if (servers is None or servers(call.server)) and (tools is None or tools(call.tool)):
            new_priority = asking.priority + 1 if asking is not None else 0
            raise request.refuse(
                f"rule {rule_id(rule, index)!r} denies {call.server}.{call.tool} calls at priority "
                f"{rule.priority}, and an allow rule at priority {new_priority} would outrank it. "
                '"Allow once" and "allow for this session" still work; to always allow, edit the rules '
                "by hand."
            )


def _unique_id(request: _Request, policy: ApprovalPolicy, data: Mapping[str, Any]) -> str:
    """`always-<decision>-<server>-<tool>` (with characters other than letters, digits and `_.-` as `-`),
    numbered from `-2` if a rule in effect or in the file has it."""
    call = request.call
    parts = [_ID_CHARS.sub("-", name).strip("-")[:60] or "x" for name in (call.server, call.tool)]
    base = f"always-{request.decision}-{parts[0]}-{parts[1]}"
    approval = data.get("approval")
    written = approval.get("rules") if isinstance(approval, dict) else None
    taken = {rule.id for rule in policy.rules} | {
        r.get("id") for r in (written if isinstance(written, list) else []) if isinstance(r, dict)
    }
    candidate, number = base, 1
    while candidate in taken:
        number += 1
        candidate = f"{base}-{number}"
    return candidate


def _literal_glob(name: str) -> str:
    """A glob that matches exactly `name`: fnmatch's specials each in a character class of its own."""
    return _GLOB_SPECIALS.sub(lambda m: f"[{m.group()}]", name)


def _one_line(text: str, limit: int = 200) -> str:
    text = NOT_IN_COMMENT.sub(" ", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _refuse_unless_it_applies(request: _Request, block: str, new_id: str) -> None:
    """The new rule, read as the loader will read it, must apply to the call on its own (a choice such as
    a value holding `{workspace}` could make it miss); the whole file is checked when it is written."""
    try:
        table = tomllib.loads(block)["approval"]["rules"][0]
        rule = Rule.model_validate(fill_workspace(table, _root(request)))
    except (tomllib.TOMLDecodeError, ValidationError, KeyError, IndexError) as e:
        raise request.refuse(f"the rule would not load ({e}). {_ANYWAY_SENTENCE}") from None
    why_not = RuleMatcher(rule, new_id).mismatch(request.call)
    if why_not is not None:
        raise request.refuse(f"the rule would not decide this call: {why_not}. {_ANYWAY_SENTENCE}")


def exact_refusal(name: str, value: Any, shown: Any) -> str | None:
    """Why an argument cannot be required `exact` (`shown`: its value as the audit log redacts it), or
    `None` when it can."""
    if "." in name:
        return "its name has a dot, which a rule reads as a path into an object"
    if _holds_null(value):
        return "it is (or holds) null, which TOML cannot hold"
    if shown != value:
        return "it holds a secret, which is never written into ipybox.toml"
    return None


def _holds_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, Mapping):
        return any(_holds_null(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_null(item) for item in value)
    return False


def default_choices(
    call: ToolCall, asking_args: Mapping[str, Any], redacted: Mapping[str, Any]
) -> dict[str, ArgChoice]:
    """What an `always` rule requires of each argument unless the person chooses: `any` when the asking
    rule has argument conditions (which the new rule keeps), else `exact` where it can hold (see
    `exact_refusal`), so that the rule is never silently one for any arguments."""
    return {
        name: "any" if asking_args or exact_refusal(name, value, redacted.get(name)) else "exact"
        for name, value in call.args.items()
    }


def _arg_conditions(
    call: ToolCall,
    choices: Mapping[str, ArgChoice],
    asking_args: Mapping[str, Any],
    redacted: Mapping[str, Any],
    root: Path,
) -> dict[str, Any]:
    """The rule's `args`: the asking rule's conditions (as written), with the choices added.

    Raises:
        ValueError: A choice names no argument of the call, is not `any`/`exact`/`glob:PATTERN`, cannot
            hold for the call's value, or clashes with the asking rule's condition on that argument.
    """
    conditions: dict[str, Any] = dict(asking_args)
    for name, choice in choices.items():
        if name not in call.args:
            raise ValueError(f"{name!r} is not an argument of this call")
        kind, colon, pattern = choice.partition(":")
        if choice == "any":
            continue
        value = call.args[name]
        if choice == "exact":
            why = exact_refusal(name, value, redacted.get(name))
            if why is not None:
                raise ValueError(f"argument {name!r} cannot be required exactly: {why}; choose any value")
            added: dict[str, Any] = {"equals": _relative(value, root)}
        elif kind == "glob" and colon:
            if not isinstance(value, str) or "." in name:
                raise ValueError(f"argument {name!r}: a glob is for string arguments; choose exact or any")
            if not pattern:
                raise ValueError(f"argument {name!r}: the glob is empty; write one, e.g. out/*")
            matches = compile_globs([pattern])
            if matches is not None and not matches(value):
                raise ValueError(
                    f"argument {name!r}: the glob {_one_line(pattern, 80)!r} does not match this call's "
                    f"value {_one_line(value, 80)!r}, so the rule would not decide it; widen the glob"
                )
            added = {"glob": pattern}
        else:
            raise ValueError(
                f"argument {name!r}: choose any, exact or glob:PATTERN, not {_one_line(choice, 80)!r}"
            )
        if name not in conditions:
            bare = "equals" in added and isinstance(value, str | int | float | bool)
            conditions[name] = added["equals"] if bare else added
            continue
        held = conditions[name]
        merged = dict(held) if isinstance(held, Mapping) else {"equals": held}
        clash = sorted(key for key in added if key in merged and merged[key] != added[key])
        if clash:
            raise ValueError(
                f"argument {name!r}: the rule that asked already requires {clash[0]} "
                f"{_one_line(str(merged[clash[0]]), 80)!r} of it; choose another kind, or any value"
            )
        conditions[name] = {**merged, **added}
    return conditions


def answer_rule_text(
    call: ToolCall,
    *,
    decision: Literal["allow", "deny"],
    asked_by: str | None,
    asking: Mapping[str, Any],
    choices: Mapping[str, ArgChoice],
    rule_id: str,
    priority: int,
    by: str,
    when: datetime,
    redacted: Mapping[str, Any],
    root: Path,
) -> str:
    """The comment line and the `[[approval.rules]]` table an `always` answer adds, as tomlkit renders
    them: a pure function of the ask, the asking rule's table as the file has it (its conditions are
    copied as written there), the person's `choices` and the new rule's id and priority. The console's
    preview and `ipybox approve` show it; `write_answer_rule` writes it.

    Args:
        redacted: The call's arguments as the audit log redacts them (the `match` example).
        root: The workspace, written `{workspace}` in the example.

    Raises:
        ValueError: A choice that cannot be written (see `_arg_conditions`), or a null the conditions test.
    """
    asked = f"asked by rule {asked_by!r}" if asked_by is not None else "asked by the default decision"
    comment = _one_line(
        f"Added by {by} on {when:%Y-%m-%d %H:%M} UTC: always {decision} "
        f"{_one_line(call.server, 80)}.{_one_line(call.tool, 80)} ({asked}).",
        limit=400,
    )
    conditions = {key: asking[key] for key in ("args", "annotations") if asking.get(key)}
    args_conditions = _arg_conditions(call, choices, asking.get("args") or {}, redacted, root)
    if args_conditions:
        conditions = {"args": args_conditions, **{k: v for k, v in conditions.items() if k != "args"}}
    tested = [tuple(path.split(".")) for path in conditions.get("args", {})]
    example: dict[str, Any] = {"server": call.server, "tool": call.tool}
    written_args = _relative(_example_args(redacted, tested), root)
    if written_args:
        example["args"] = written_args
    annotations = {
        k: v for k, v in call.annotations.items() if k in ANNOTATION_DEFAULTS and isinstance(v, bool)
    }
    if annotations:
        example["annotations"] = annotations

    table = tomlkit.table()
    table.add("id", rule_id)
    table.add("server", toml_item(_literal_glob(call.server)))
    table.add("tool", toml_item(_literal_glob(call.tool)))
    for key, value in conditions.items():
        table.add(key, toml_item(value))
    table.add("decision", decision)
    table.add("priority", priority)
    table.add("match", toml_item([example]))
    rules = tomlkit.aot()
    rules.append(table)
    approval = tomlkit.table(is_super_table=True)
    approval.append("rules", rules)
    document = tomlkit.document()
    document.append("approval", approval)
    return f"# {comment}\n{document.as_string()}"


def _root(request: _Request) -> Path:
    return request.path.parent.resolve()


def _relative(value: Any, root: Path) -> Any:
    """`value` with the workspace's path in its strings written as `{workspace}` (which the loader fills in
    again), so that the rule holds wherever the file is checked out. A string that holds a placeholder
    already is left as it is (filled in, it would change)."""
    if isinstance(value, str):
        if "{workspace" in value:
            return value
        # The path itself, or followed by `/`: never a prefix of another name (`/ws-other`).
        return re.sub(re.escape(str(root)) + r"(?=/|$)", lambda _: "{workspace}", value)
    if isinstance(value, Mapping):
        return {key: _relative(item, root) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_relative(item, root) for item in value]
    return value


def _tested(path: tuple[str, ...], tested: list[tuple[str, ...]]) -> bool:
    """Whether a condition tests the value at `path` or something inside or around it."""
    return any(path[: len(t)] == t or t[: len(path)] == path for t in tested)


def _example_args(args: Mapping[str, Any], tested: list[tuple[str, ...]]) -> dict[str, Any]:
    def example(value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, str):
            if len(value) > FOLD_CHARS and not _tested(path, tested):
                return value[: FOLD_CHARS - 3] + "..."
            return value
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                inner = (*path, str(key))
                if item is not None:
                    out[str(key)] = example(item, inner)
                elif _tested(inner, tested):
                    raise ValueError(
                        f"the call's argument {'.'.join(inner)!r} is null, which TOML cannot hold, and the "
                        "rule tests it; add the rule by hand"
                    )
                # else: no condition looks at it, so leaving it out of the example changes nothing
            return out
        if isinstance(value, list | tuple):
            if None in value and _tested(path, tested):
                raise ValueError(
                    f"the call's argument {'.'.join(path)!r} holds a null, which TOML cannot hold, and "
                    "the rule tests it; add the rule by hand"
                )
            return [example(item, path) for item in value if item is not None]
        if value is None or isinstance(value, bool | int | float):
            return value
        return str(value)

    written: dict[str, Any] = example(args, ())
    return written


def _insert(request: _Request, text: str, block: str) -> tuple[str, str, int]:
    """`text` with `block` after the last `[[approval.rules]]` table, before the comments that introduce
    whatever follows it; and the block as added, and the line of its header."""
    document = tomlkit.parse(text)
    approval = document.get("approval")
    if approval is None:
        offset = len(text)
    else:
        rules = approval.get("rules") if isinstance(approval, Mapping) else None
        if isinstance(approval, InlineTable) or (rules is not None and not isinstance(rules, AoT)):
            raise request.refuse(
                "its rules are written inline (`approval = { ... }` or `rules = [ ... ]`), and ipybox adds "
                f"a rule as an [[approval.rules]] table; write them as [[approval.rules]] tables, or add "
                f"the rule by hand. {_ANYWAY_SENTENCE}"
            )
        last: Any = rules.body[-1] if rules is not None and rules.body else approval
        found = _end_of(document, text, _tail(last)) if isinstance(last, Table) else None
        if found is None:
            raise request.refuse(
                f"ipybox cannot tell where its [approval] rules end; add the rule by hand. {_ANYWAY_SENTENCE}"
            )
        offset = found
    newline = "\r\n" if text.count("\r\n") * 2 > text.count("\n") else "\n"  # as the file has them
    block = block.replace("\n", newline)
    before, after = text[:offset], text[offset:]
    lead = "" if not before or before.endswith("\n") else newline
    if before and not (before + lead).endswith(newline * 2):
        lead += newline  # a blank line between the rule before and the new one
    trail = newline if after else ""
    new_text = before + lead + block + trail + after
    line = (before + lead).count("\n") + 2  # the header is the line after the comment
    return new_text, block, line


def _tail(table: Table) -> Table:
    """The table whose body the text of `table` ends with: its last sub-table's, if it has one."""
    while True:
        keyed = [item for key, item in table.value.body if key is not None]
        if keyed and isinstance(keyed[-1], Table):
            table = keyed[-1]
        elif keyed and isinstance(keyed[-1], AoT) and keyed[-1].body:
            table = keyed[-1].body[-1]
        else:
            return table


def _end_of(document: tomlkit.TOMLDocument, text: str, table: Table) -> int | None:
    """Where the text of `table` ends: before the comments (and blank lines between them) at its end,
    which tomlkit keeps with the table but which introduce whatever comes next. `None`: not found."""
    body = table.value.body
    split = len(body)
    while split and body[split - 1][0] is None and isinstance(body[split - 1][1], Whitespace | Comment):
        split -= 1
    while split < len(body) and isinstance(body[split][1], Whitespace):
        split += 1  # blank lines right after the table's last value stay with it
    marker = f"# ipybox-insertion-point-{secrets.token_hex(16)}"
    body.insert(split, (None, Comment(Trivia(comment=marker, trail="\n"))))
    rendered = document.as_string()
    offset = rendered.find(marker + "\n")
    if offset < 0 or rendered[:offset] + rendered[offset + len(marker) + 1 :] != text:
        return None  # tomlkit placed it elsewhere: a layout it does not keep apart
    return offset


def _decide(policy: ApprovalPolicy, call: ToolCall) -> Verdict:
    """The verdict as the workspace's approver reaches it: for a shell command, allow rules count only if
    their `server` names `shell` itself (as `ipybox.approval.rule_approver` decides)."""
    if call.server != SHELL_SERVER:
        return policy.decide(call)
    rules = [
        rule
        if rule.decision != "allow" or SHELL_SERVER in _names(rule.server)
        else rule.model_copy(update={"server": []})
        for rule in policy.rules
    ]
    return ApprovalPolicy.model_construct(default=policy.default, rules=rules).decide(call)


def _took_effect(request: _Request, config: WorkspaceConfig, written: WrittenRule) -> str | None:
    """Why the new rule would not decide the call in the new file, if it would not."""
    if not any(rule.id == written.id for rule in config.approval.rules):
        return (
            "the rule would not take effect: the rules in effect come from the environment (an "
            f"IPYBOX_APPROVAL__RULES variable, or the workspace's .env); {_ANYWAY}"
        )
    verdict = _decide(config.approval, request.call)
    if (verdict.rule_id, verdict.decision) != (written.id, request.decision):
        return f"the rule would not decide this call: {verdict.reason}; {_ANYWAY}"
    return None
