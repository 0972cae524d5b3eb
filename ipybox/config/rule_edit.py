"""`edit_rule()`: a person switches a rule of `ipybox.toml` off or on, or removes one an `always` answer
wrote (the console's Rules page, `ipybox policy disable|enable|remove ID`).

- `disable` adds `enabled = false` on the line after the rule's `[[approval.rules]]` header (the rule
  stays, decides nothing, and is shown as disabled); `enable` takes that line out again. Any rule can be
  switched, a hand-written one included: its text is otherwise left as it was.
- `set_rule_args` rewrites the `args` line of a rule an `always` answer wrote (its argument conditions, as
  a TOML inline table; empty: any arguments), the rest of its text as it was; the rule's `match` example
  must still hold, as the loader checks on every load.
- `remove` takes out a rule an `always` answer wrote (id `always-...`, under the `# Added by ...` comment
  `write_answer_rule` put above it): the comment, the table, and the blank line before the comment. A
  rule written by hand is not removed or rewritten by ipybox (disable it, or edit the file).

Contract: the file is changed by `ipybox.config.file_edit.edit_config_file` (atomically, only if it loads
afterwards), and only if the rules loaded afterwards are the rules before with exactly this change (the
same rules, in the same order, the one rule switched or gone); else nothing is written and `RuleEditError`
says why and what to do (no such rule; the rules come from the environment; the rules are written inline,
not as `[[approval.rules]]` tables; a rule not written by an answer to remove).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from pydantic import ValidationError

from ipybox.config.file_edit import EditRules, edit_config_file
from ipybox.config.loading import CONFIG_FILE
from ipybox.config.workspace_config import WorkspaceConfig
from ipybox.errors import IpyboxError
from ipybox.rules import Rule
from ipybox.rules.engine import rule_id

__all__ = [
    "RuleEdit",
    "RuleEditError",
    "RuleEdited",
    "edit_rule",
    "rule_args_text",
    "set_rule_args",
    "written_by_an_answer",
]

RuleEdit = Literal["disable", "enable", "remove"]
_ARGS_LINE: Final = re.compile(r"[ \t]*args[ \t]*=[ \t]*(.*)")

_HEADER: Final = re.compile(r"[ \t]*\[\[[ \t]*approval[ \t]*\.[ \t]*rules[ \t]*\]\][ \t]*(#.*)?")
_TABLE: Final = re.compile(r"[ \t]*\[")
_DISABLED: Final = re.compile(r"[ \t]*enabled[ \t]*=[ \t]*false[ \t]*(#.*)?")
_ID_LINE: Final = re.compile(r'[ \t]*id[ \t]*=[ \t]*"([^"\\]*)"[ \t]*(#.*)?')
_ADDED_BY: Final = "# Added by "


class RuleEditError(IpyboxError, ValueError):
    """A rule could not be switched or removed; nothing was written. `str(error)` says why and what to do."""


@dataclass(frozen=True)
class RuleEdited:
    """What `edit_rule` did.

    Attributes:
        id: The rule (`rules[<index>]` for one without an id).
        edit: `disable`, `enable` or `remove`.
        changed: `False` when the rule already was as asked (nothing written).
    """

    id: str
    edit: RuleEdit | Literal["args"]
    changed: bool = True

    def describe(self) -> str:
        """`Rule 'always-allow-fs-write' disabled.` (or `... was disabled already.`)."""
        if self.edit == "args":
            return f"Rule {self.id!r}: its argument conditions changed."
        done = _done(self.edit)
        return f"Rule {self.id!r} {done}." if self.changed else f"Rule {self.id!r} was {done} already."


def written_by_an_answer(text: str, rule: str) -> bool:
    """Whether the rule `rule` (an id) of the file `text` was written by an `always` answer: its id starts
    with `always-` and the `# Added by ...` comment `write_answer_rule` writes is right above it."""
    if not rule.startswith("always-"):
        return False
    lines = text.splitlines()
    for index, _end, line_id in _blocks(lines):
        if line_id == rule:
            return index > 0 and lines[index - 1].startswith(_ADDED_BY)
    return False


def edit_rule(config_path: Path, rule: str, edit: RuleEdit) -> RuleEdited:
    """Disable, enable or remove the rule `rule` (its id, or `rules[<index>]`) of `ipybox.toml`.

    Raises:
        RuleEditError: Nothing was written; the message says why and what to do.
    """
    path = Path(config_path)
    if path.is_dir():
        path = path / CONFIG_FILE

    def refuse(why: str) -> RuleEditError:
        return RuleEditError(f"rule {rule!r} was not {_done(edit)} in {path}: {why}")

    rules = _edit_rules(refuse, "this change")
    outcome: list[RuleEdited] = []

    def change(text: str, current: WorkspaceConfig) -> tuple[str, tuple[list[Rule], int]]:
        before = current.approval.rules
        index = next((i for i, r in enumerate(before) if rule_id(r, i) == rule), None)
        if index is None:
            raise refuse(
                "no rule in effect has this id (see `ipybox policy check` or the console's Rules page)"
            )
        new_text, changed = _edited(text, index, rule, edit, refuse)
        outcome.append(RuleEdited(rule, edit, changed))
        if not changed:
            return text, (list(before), index)
        if edit == "remove":
            expected = [r for i, r in enumerate(before) if i != index]
        else:
            switched = before[index].model_copy(update={"enabled": edit == "enable"})
            expected = [switched if i == index else r for i, r in enumerate(before)]
        return new_text, (expected, index)

    def took_effect(config: WorkspaceConfig, result: tuple[list[Rule], int]) -> str | None:
        if config.approval.rules != result[0]:
            return (
                "the rules would not be the same but for this change (the rules in effect come from the "
                "environment, an IPYBOX_APPROVAL__RULES variable or the workspace's .env, or the file "
                "has a layout ipybox does not edit); edit it by hand"
            )
        return None

    edit_config_file(path, change, took_effect, rules)
    return outcome[-1]


def _done(edit: RuleEdit) -> str:
    return {"disable": "disabled", "enable": "enabled", "remove": "removed"}[edit]


def _blocks(lines: Sequence[str]) -> list[tuple[int, int, str | None]]:
    """Each `[[approval.rules]]` table of the file, in order: its header's line index, the index after its
    last line (before the comments and blank lines that introduce what follows) and its `id` if written
    as `id = "..."` on a line of it."""
    headers = [i for i, line in enumerate(lines) if _HEADER.fullmatch(line)]
    found = []
    for header in headers:
        end = next((i for i in range(header + 1, len(lines)) if _TABLE.match(lines[i])), len(lines))
        while end > header + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
            end -= 1
        ids = [_ID_LINE.fullmatch(lines[i]) for i in range(header + 1, end)]
        found.append((header, end, next((m.group(1) for m in ids if m is not None), None)))
    return found


def _edited(
    text: str, index: int, rule: str, edit: RuleEdit, refuse: Callable[[str], RuleEditError]
) -> tuple[str, bool]:
    """`text` with the change made to the rule at `index` (in file order), and whether it changed."""
    lines = text.splitlines(keepends=True)
    bare = [line.rstrip("\r\n") for line in lines]
    blocks = _blocks(bare)
    if len(blocks) <= index:
        raise refuse(
            "its rules are not all written as [[approval.rules]] tables (`rules = [ ... ]` or inline), "
            "which is the layout ipybox edits; edit the file by hand"
        )
    header, end, written_id = blocks[index]
    if written_id != (rule if not re.fullmatch(r"rules\[\d+\]", rule) else None):
        raise refuse("the file does not have it where its rules say (is it being edited?); try again")
    newline = "\r\n" if lines[header].endswith("\r\n") else "\n"
    disabled = [i for i in range(header + 1, end) if _DISABLED.fullmatch(bare[i])]
    if edit == "disable":
        if disabled:
            return text, False
        lines.insert(header + 1, f"enabled = false{newline}")
    elif edit == "enable":
        if not disabled:
            return text, False
        for i in reversed(disabled):
            del lines[i]
    else:
        if not written_by_an_answer(text, rule):
            raise refuse(
                "it was written by hand (only rules an always answer wrote, under an `# Added by` comment "
                "with an `always-` id, are removed by ipybox); disable it instead, or edit the file"
            )
        start = header - 1  # the `# Added by` comment
        if start > 0 and not bare[start - 1].strip():
            start -= 1  # and the blank line before it
        elif end < len(bare) and not bare[end].strip():
            end += 1  # or, at the top, the blank line after the rule
        del lines[start:end]
    return "".join(lines), True


def rule_args_text(text: str, rule: str) -> str:
    """The `args` of the rule `rule` as the file `text` writes it (an inline table), `""` when it has none."""
    lines = text.splitlines()
    for header, end, line_id in _blocks(lines):
        if line_id == rule:
            for i in range(header + 1, end):
                found = _ARGS_LINE.fullmatch(lines[i])
                if found is not None:
                    return found.group(1).strip()
    return ""


def set_rule_args(config_path: Path, rule: str, args: str) -> RuleEdited:
    """Rewrite the argument conditions of the rule `rule`, which an `always` answer wrote: `args` is a TOML
    inline table (`{ path = { glob = "out/*" } }`), or empty for any arguments.

    Raises:
        RuleEditError: Nothing was written: the rule was written by hand, `args` is not an inline table
            of conditions, its `match` example would not hold, ... (the message says which).
    """
    path = Path(config_path)
    if path.is_dir():
        path = path / CONFIG_FILE

    def refuse(why: str) -> RuleEditError:
        return RuleEditError(f"the arguments of rule {rule!r} were not changed in {path}: {why}")

    args = args.strip()
    try:
        parsed = tomllib.loads(f"args = {args}")["args"] if args else {}
    except tomllib.TOMLDecodeError as e:
        raise refuse(
            f'{args!r} is not a TOML inline table ({e}); write e.g. {{ path = {{ glob = "out/*" }} }}'
        ) from None
    if not isinstance(parsed, dict) or "\n" in args:
        raise refuse('write the conditions as one inline table, e.g. { path = { glob = "out/*" } }')
    try:
        wanted = Rule.model_validate({"decision": "allow", "args": parsed}).args
    except ValidationError as e:
        raise refuse(f"{e.errors()[0]['msg']}") from None
    rules = _edit_rules(refuse, "these arguments")

    def change(text: str, current: WorkspaceConfig) -> tuple[str, tuple[list[Rule], int]]:
        before = current.approval.rules
        index = next((i for i, r in enumerate(before) if rule_id(r, i) == rule), None)
        if index is None:
            raise refuse("no rule in effect has this id (see the console's Rules page)")
        if not written_by_an_answer(text, rule):
            raise refuse(
                "it was written by hand, and ipybox rewrites only rules an always answer wrote; edit the file"
            )
        lines = text.splitlines(keepends=True)
        blocks = _blocks([line.rstrip("\r\n") for line in lines])
        header, end, _ = next(block for block in blocks if block[2] == rule)
        newline = "\r\n" if lines[header].endswith("\r\n") else "\n"
        at = next((i for i in range(header + 1, end) if _ARGS_LINE.fullmatch(lines[i].rstrip("\r\n"))), None)
        new_line = [f"args = {args}{newline}"] if args else []
        if at is not None:
            lines[at : at + 1] = new_line
        else:
            decision = next(
                (i for i in range(header + 1, end) if lines[i].lstrip().startswith("decision")), end
            )
            lines[decision:decision] = new_line
        return "".join(lines), (list(before), index)

    def took_effect(config: WorkspaceConfig, result: tuple[list[Rule], int]) -> str | None:
        before, index = result
        after = config.approval.rules
        same = len(after) == len(before) and all(
            a == b for i, (a, b) in enumerate(zip(after, before, strict=True)) if i != index
        )
        if not same or after[index].model_copy(update={"args": before[index].args}) != before[index]:
            return "the rules would not be the same but for this change; edit the file by hand"
        if dict(after[index].args) != dict(wanted) and not _placeholders(args):
            return "the conditions would not be read as written; edit the file by hand"
        return None

    edit_config_file(path, change, took_effect, rules)
    return RuleEdited(rule, "args")


def _placeholders(text: str) -> bool:
    return "{workspace" in text


def _edit_rules(refuse: Callable[[str], RuleEditError], change: str) -> EditRules:
    """How the config editor words a refused edit of a rule (`change`: what was to be changed)."""
    return EditRules(
        refuse=refuse,
        fix_first="fix it, then try again",
        missing="there is no such file (was the workspace moved?)",
        by_hand="edit the file by hand",
        again="try again once it is saved",
        change=change,
    )
