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
- the asking rule's own `args` and `annotations` conditions are copied, and `priority` is one above it
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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import tomlkit
from pydantic import ValidationError
from tomlkit.items import AoT, Comment, InlineTable, Table, Trivia, Whitespace

from ipybox.config.file_edit import EditRules, edit_config_file
from ipybox.config.loading import CONFIG_FILE
from ipybox.config.server_catalog import fill_workspace
from ipybox.config.toml_items import NOT_IN_COMMENT, toml_item
from ipybox.config.workspace_config import WorkspaceConfig
from ipybox.errors import IpyboxError
from ipybox.rules import SHELL_SERVER, ApprovalPolicy, Rule, ToolCall, Verdict
from ipybox.rules.engine import rule_id
from ipybox.rules.matching import RuleMatcher, compile_globs
from ipybox.rules.tool_annotations import ANNOTATION_DEFAULTS

__all__ = ["RuleWriteError", "WrittenRule", "write_answer_rule"]

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
    """

    id: str
    decision: Literal["allow", "deny"]
    priority: int
    text: str
    line: int


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

    Returns:
        What was written, and where.

    Raises:
        RuleWriteError: The rule was not written; the message says why and what to do instead.
    """
    path = Path(config_path)
    if path.is_dir():
        path = path / CONFIG_FILE
    when = datetime.now(UTC) if when is None else when
    when = (when.replace(tzinfo=UTC) if when.tzinfo is None else when).astimezone(UTC)
    request = _Request(path, call, "allow" if accept else "deny", asked_by, by, when, redact)
    rules = EditRules(
        refuse=request.refuse,
        fix_first="fix it, then answer again",
        missing="there is no such file (was the workspace moved?)",
        by_hand=f"add the rule by hand. {_ANYWAY_SENTENCE}",
        again=f"answer again once it is saved. {_ANYWAY_SENTENCE}",
        change="the rule in it",
    )
    return edit_config_file(
        path,
        lambda text, current: _edit(request, text, current),
        lambda config, written: _took_effect(request, config, written),
        rules,
    )


@dataclass(frozen=True)
class _Request:
    path: Path
    call: ToolCall
    decision: Literal["allow", "deny"]
    asked_by: str | None
    by: str
    when: datetime
    redact: Callable[[Mapping[str, Any]], dict[str, Any]] | None

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
    block = _rule_block(request, written, new_id, priority)
    new_text, added, line = _insert(request, text, block)
    return new_text, WrittenRule(new_id, request.decision, priority, added, line)


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


def _rule_block(request: _Request, asking: Mapping[str, Any], new_id: str, priority: int) -> str:
    """The comment line and the `[[approval.rules]]` table, as tomlkit renders them; `asking` is the
    asking rule's table as the file has it (its conditions are copied as written there)."""
    call = request.call
    asked = (
        f"asked by rule {request.asked_by!r}"
        if request.asked_by is not None
        else "asked by the default decision"
    )
    comment = _one_line(
        f"Added by {request.by} on {request.when:%Y-%m-%d %H:%M} UTC: always {request.decision} "
        f"{_one_line(call.server, 80)}.{_one_line(call.tool, 80)} ({asked}).",
        limit=400,
    )
    conditions = {key: asking[key] for key in ("args", "annotations") if asking.get(key)}
    tested = [tuple(path.split(".")) for path in conditions.get("args", {})]
    args = request.redact(call.args) if request.redact is not None else dict(call.args)
    example: dict[str, Any] = {"server": call.server, "tool": call.tool}
    written_args = _relative(_example_args(request, args, tested), _root(request))
    if written_args:
        example["args"] = written_args
    annotations = {
        k: v for k, v in call.annotations.items() if k in ANNOTATION_DEFAULTS and isinstance(v, bool)
    }
    if annotations:
        example["annotations"] = annotations

    table = tomlkit.table()
    table.add("id", new_id)
    table.add("server", toml_item(_literal_glob(call.server)))
    table.add("tool", toml_item(_literal_glob(call.tool)))
    for key, value in conditions.items():
        table.add(key, toml_item(value))
    table.add("decision", request.decision)
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


def _example_args(
    request: _Request, args: Mapping[str, Any], tested: list[tuple[str, ...]]
) -> dict[str, Any]:
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
                    raise request.refuse(
                        f"the call's argument {'.'.join(inner)!r} is null, which TOML cannot hold, and the "
                        f"rule that asked tests it; add the rule by hand. {_ANYWAY_SENTENCE}"
                    )
                # else: no condition looks at it, so leaving it out of the example changes nothing
            return out
        if isinstance(value, list | tuple):
            if None in value and _tested(path, tested):
                raise request.refuse(
                    f"the call's argument {'.'.join(path)!r} holds a null, which TOML cannot hold, and "
                    f"the rule that asked tests it; add the rule by hand. {_ANYWAY_SENTENCE}"
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
