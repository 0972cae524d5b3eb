"""How the console shows things: the jinja2 environment of its templates (files under `templates/`,
autoescaping on for every template, so nothing a tool call or the audit log holds becomes markup), and the
small view models the templates read (arguments folded, rules in the order the engine tries them).

Contract: templates get only values escaped on output; nothing here marks text safe (`Markup`), so an
argument `<script>` is shown as the text `<script>`. Before that, every value a template prints
(`{{ ... }}`, attributes included) goes through `ipybox.display_text.printable` with its lines kept: HTML
escaping leaves bidi overrides, zero-width and control characters in place, and a browser would reorder or
hide text with them; they are shown as `\u202e`, `\u200b`, `\x1b`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import jinja2
import markupsafe

from ipybox.display_text import printable
from ipybox.limits import describe_limit, format_bytes
from ipybox.rules import ApprovalPolicy, Rule
from ipybox.rules.engine import SEVERITY, rule_id

__all__ = [
    "FOLD_CHARS",
    "TEMPLATES_DIR",
    "ArgView",
    "RuleRow",
    "args_view",
    "environment",
    "rules_in_order",
    "show_json",
]

TEMPLATES_DIR: Final = Path(__file__).parent / "templates"
FOLD_CHARS: Final = 160
"""A value longer than this (or of several lines) is folded: its first line shows, the rest opens on a
click (`<details>`)."""
_SUMMARY_CHARS: Final = 80


def show_json(value: Any) -> str:
    """A value as the console shows it: a string as it is, anything else as JSON (indented when nested)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping | list) and value:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return json.dumps(value, ensure_ascii=False, default=str)


@dataclass(frozen=True, slots=True)
class ArgView:
    """One argument of a call, ready to show.

    Attributes:
        name: The argument's name.
        text: Its value (see `show_json`).
        folded: Shown folded: `summary` first, the whole `text` on a click.
        summary: The first line, cut to 80 characters.
    """

    name: str
    text: str
    folded: bool
    summary: str


def args_view(args: Mapping[str, Any]) -> list[ArgView]:
    """The arguments of a call, long values folded."""
    views = []
    for name, value in args.items():
        text = show_json(value)
        folded = len(text) > FOLD_CHARS or "\n" in text
        first = text.split("\n", 1)[0]
        summary = first[:_SUMMARY_CHARS] + ("…" if len(first) > _SUMMARY_CHARS or "\n" in text else "")
        views.append(
            ArgView(str(name), text, folded, f"{summary} ({len(text)} characters)" if folded else text)
        )
    return views


@dataclass(frozen=True, slots=True)
class RuleRow:
    """A rule as the rules page lists it.

    Attributes:
        rank: 1 for the rule tried first.
        id: Its `id`, or `rules[<index>]`.
        index: Its place in the file (0-based).
        decision: `allow`, `deny` or `ask`.
        priority: Its priority.
        server, tool: Its globs, as written.
        args: Its argument conditions, one line each (`path: glob "out/**"`).
        annotations: The annotations it requires, one line each (`readOnlyHint = true`).
        examples: How many `match` / `not_match` examples it has.
        enabled: `False` for a rule switched off (`enabled = false`): it decides nothing.
    """

    rank: int
    id: str
    index: int
    decision: str
    priority: int
    server: str
    tool: str
    args: list[str]
    annotations: list[str]
    examples: int
    enabled: bool = True


def _globs(value: str | Sequence[str]) -> str:
    return value if isinstance(value, str) else ", ".join(value)


def _condition_text(key: str, rule: Rule) -> str:
    conditions = rule.args[key].model_dump(by_alias=True)
    return f"{key}: " + ", ".join(
        f"{name} {json.dumps(value, ensure_ascii=False)}" for name, value in conditions.items()
    )


def rules_in_order(policy: ApprovalPolicy) -> list[RuleRow]:
    """The policy's rules in the order the engine tries them: highest priority first; at equal priority
    deny, then ask, then allow; then file order. The first that applies decides."""
    rules = policy.rules
    order = sorted(range(len(rules)), key=lambda i: (-rules[i].priority, -SEVERITY[rules[i].decision]))
    return [
        RuleRow(
            rank=rank,
            id=rule_id(rules[i], i),
            index=i,
            decision=rules[i].decision,
            priority=rules[i].priority,
            server=_globs(rules[i].server),
            tool=_globs(rules[i].tool),
            args=[_condition_text(key, rules[i]) for key in rules[i].args],
            annotations=[f"{name} = {json.dumps(value)}" for name, value in rules[i].annotations.items()],
            examples=len(rules[i].match) + len(rules[i].not_match),
            enabled=rules[i].enabled,
        )
        for rank, i in enumerate(order, start=1)
    ]


def _moment(iso: str | None) -> str:
    """`2026-11-24T07:00:00.123456Z` as `2026-11-24 07:00:00` (UTC)."""
    if not iso:
        return ""
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _seconds_left(iso: str | None) -> str:
    if not iso:
        return "no time limit"
    try:
        left = (datetime.fromisoformat(iso.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds()
    except ValueError:
        return ""
    return f"{max(0, round(left))} s left"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    return f"{hours // 24} days {hours % 24} h"


def _limits_text(limits: Mapping[str, float]) -> str:
    """A kernel's limits as a person reads them: `memory 4 GiB, processes 256, open files 4096`."""
    return ", ".join(describe_limit(name, value) for name, value in limits.items()) or "none"


def _query(fields: Mapping[str, Any], **extra: Any) -> str:
    """A query string of the fields given (empty ones left out)."""
    given = {**fields, **extra}
    return urlencode({name: value for name, value in given.items() if value not in ("", None)})


def _shown(value: Any) -> Any:
    """What a template prints of `value` (jinja's `finalize`, before autoescaping): text with the
    characters a browser would not show as themselves escaped visibly; markup the templates made
    themselves (a macro's output) and numbers as they are."""
    if isinstance(value, markupsafe.Markup) or hasattr(value, "__html__"):
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    return printable(value if isinstance(value, str) else str(value), lines=True)


def environment() -> jinja2.Environment:
    """The templates' environment: files under `templates/`, every printed value escaped visibly
    (`_shown`) and autoescaped, undefined names an error."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,
        finalize=_shown,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["moment"] = _moment
    env.filters["seconds_left"] = _seconds_left
    env.filters["duration"] = _duration
    env.filters["show_json"] = show_json
    env.filters["size"] = format_bytes
    env.filters["limits_text"] = _limits_text
    env.globals["args_view"] = args_view
    env.globals["query"] = _query
    return env
