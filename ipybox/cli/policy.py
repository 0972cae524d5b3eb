"""`ipybox policy check` and `ipybox policy replay`: what the approval policy decides, and what a change
of it would have decided.

- `check DIR 'server.tool {json args}'`: the decision on one call under the workspace's policy (its admin
  tiers included), the rule that decided it and its tier, and every other rule that applies. The tool's
  annotations come from its pin in `ipybox.lock` when it has one (`--annotations` overrides them).
  `shell {"cmd": "..."}` checks a shell command line, each command it runs.
- `replay DIR [--config OTHER] [--since T]`: every call in the audit log (its rotated files included,
  oldest first) decided again under the workspace's policy, or the one in `OTHER`, and the calls whose
  decision would change, grouped by the rule that would decide them now. What was asked is compared as
  `ask` (whatever the person answered). Arguments the log redacted are decided as recorded
  (`[redacted]`), and quotas and pins (which depend on the moment) are left out.

Exit status, for scripts and CI: `check` 0; `replay` 0 when no call would go from allow to deny or back
(asks may come and go), 1 when one would; 2 when the workspace, the other file, the call or the log
can't be read, with one line saying what to fix. Every command has `--json`.

Measured (`replay` of 100,000 records, one rule in ten changed): see the `bench/` note in the closing
notes; it streams the log, holding only the groups and a few examples each.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipybox.display_text import printable

EXIT_FLIPS = 1
EXIT_TROUBLE = 2
_EXAMPLES = 5


def fail(message: str, as_json: bool) -> int:
    """Say what can't be read and what to fix in one line (a JSON object with `--json`): exit 2."""
    if as_json:
        print(json.dumps({"error": message}))
    else:
        print(f"ipybox: {printable(message, lines=True)}", file=sys.stderr)
    return EXIT_TROUBLE


def _load(path: Path) -> Any:
    from ipybox.config import load_config

    return load_config(path)


def parse_call(text: str) -> tuple[str, str, dict[str, Any]]:
    """`server.tool {json}` (or `shell {"cmd": ...}`) as server, tool and arguments.

    Raises:
        ValueError: What is wrong with it and how it is written.
    """
    head, _, rest = text.strip().partition(" ")
    rest = rest.strip()
    try:
        args = json.loads(rest) if rest else {}
    except json.JSONDecodeError as e:
        raise ValueError(
            f"the arguments are not JSON ({e.msg} at column {e.colno}): write them as a JSON object"
        ) from None
    if not isinstance(args, dict):
        raise ValueError('the arguments are a JSON object, e.g. \'filesystem.read_file {"path": "a.md"}\'')
    if head == "shell":
        return "shell", "", args
    server, dot, tool = head.partition(".")
    if not dot or not server or not tool:
        raise ValueError(
            f"{head!r} is not SERVER.TOOL: write the call as 'server.tool {{json args}}', e.g. "
            '\'filesystem.read_file {"path": "notes.md"}\''
        )
    return server, tool, args


def _pinned_annotations(workspace: Path, server: str, tool: str) -> dict[str, Any]:
    from ipybox.config.tool_lock import LOCK_FILE, LockFileError, read_lock

    try:
        lock = read_lock(workspace / LOCK_FILE)
    except LockFileError:
        return {}
    pins = lock.servers.get(server)
    pin = pins.tools.get(tool) if pins is not None else None
    return dict(pin.annotations) if pin is not None else {}


def _verdict_json(verdict: Any) -> dict[str, Any]:
    return {
        "decision": verdict.decision,
        "rule": verdict.rule_id,
        "tier": verdict.tier or "workspace",
        "reason": verdict.reason,
        "explanation": verdict.explanation,
    }


def _tier(verdict: Any) -> str:
    if verdict.rule_id is None:
        return "the default"
    where = f"the {verdict.tier} admin policy" if verdict.tier else "ipybox.toml"
    return f"rule {verdict.rule_id!r} of {where}"


_LABELS = ("untrusted", "private", "trusted")


def provenance_context(session_read: Sequence[str], origins: Sequence[str]) -> dict[str, Any]:
    """`--session-read` and `--from ARG=LABEL` as the `ToolCall` fields they stand for (origins of a
    `policy-check` tool, result 0).

    Raises:
        ValueError: A `--from` that is not `ARG=LABEL` with a known label.
    """
    from ipybox.rules.calls import Origin

    read = tuple(Origin("policy-check", "given", 0, label) for label in dict.fromkeys(session_read))  # type: ignore[arg-type]
    provenance: dict[str, tuple[Origin, ...]] = {}
    for given in origins:
        path, _, label = given.partition("=")
        if not path or label not in _LABELS:
            raise ValueError(f"--from {given!r}: write ARG=LABEL, LABEL one of {', '.join(_LABELS)}")
        provenance[path] = (*provenance.get(path, ()), Origin("policy-check", "given", 0, label))  # type: ignore[arg-type]
    return {"provenance": provenance, "session_read": read}


def check(
    workspace: Path,
    call_text: str,
    *,
    annotations: str | None,
    as_json: bool,
    session_read: Sequence[str] = (),
    origins: Sequence[str] = (),
) -> int:
    """`ipybox policy check`: see the module."""
    from ipybox.approval.rule_approver import explain_call
    from ipybox.config import ConfigError
    from ipybox.rules import ToolCall

    try:
        config = _load(workspace)
    except ConfigError as e:
        return fail(str(e), as_json)
    try:
        server, tool, args = parse_call(call_text)
        given = json.loads(annotations) if annotations is not None else None
        if given is not None and not isinstance(given, dict):
            raise ValueError("--annotations is a JSON object, e.g. '{\"readOnlyHint\": true}'")
        context = provenance_context(session_read, origins)
    except (ValueError, json.JSONDecodeError) as e:
        return fail(str(e), as_json)
    known = given if given is not None else (_pinned_annotations(workspace, server, tool) if tool else {})
    try:
        parts = explain_call(config.approval, ToolCall(server, tool, args, known, **context))
    except ValueError as e:  # a shell line that can't be read
        return fail(f"the command cannot be read: {e}", as_json)
    results = []
    for part, verdict in parts:
        matched = [
            v
            for v in config.approval.applying(part)
            if (v.rule_id, v.tier) != (verdict.rule_id, verdict.tier)
        ]
        results.append((part, verdict, matched))
    if as_json:
        print(
            json.dumps(
                {
                    "calls": [
                        {
                            "server": part.server,
                            "tool": part.tool,
                            "args": dict(part.args),
                            "annotations": dict(part.annotations),
                            **_verdict_json(verdict),
                            "also_matched": [_verdict_json(v) for v in matched],
                        }
                        for part, verdict, matched in results
                    ],
                    "tiers": [{"name": t.name, "source": t.source} for t in config.approval.admin],
                },
                indent=2,
            )
        )
        return 0
    for part, verdict, matched in results:
        shown = json.dumps(dict(part.args), ensure_ascii=True)
        print(printable(f"{part.server}.{part.tool} {shown}: {verdict.decision.upper()} by {_tier(verdict)}"))
        print(printable(f"  {verdict.reason}"))
        if verdict.explanation:
            print(printable(f"  reason given: {verdict.explanation}"))
        for other in matched:
            print(printable(f"  also applies: {_tier(other)} ({other.decision})"))
    return 0


@dataclass
class _Group:
    rule: str | None
    tier: str | None
    decision: str
    count: int = 0
    transitions: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)


def replay(workspace: Path, *, other: Path | None, since: str | None, as_json: bool) -> int:
    """`ipybox policy replay`: see the module."""
    from ipybox.approval.rule_approver import for_shell
    from ipybox.config import ConfigError
    from ipybox.rules import SHELL_SERVER, AuditFilter, AuditLog, ToolCall
    from ipybox.rules.calls import origins_of
    from ipybox.running.state import StatePaths

    try:
        home = _load(workspace)  # where its audit log is
        config = _load(other) if other is not None else home
    except ConfigError as e:
        return fail(str(e), as_json)
    try:
        where = AuditFilter(since=since) if since is not None else None
    except ValueError as e:
        return fail(f"--{e}", as_json)
    log = AuditLog(StatePaths(home.resolve(home.workspace.state_dir)).audit)
    policy = config.approval
    shell_policy = for_shell(policy)
    annotations = _lock_annotations(workspace)
    started = time.perf_counter()
    groups: dict[tuple[str | None, str | None, str], _Group] = {}
    records = changed = flips = 0
    try:
        for entry in log.iter_entries():
            if where is not None and not where.matches(entry):
                continue
            records += 1
            before = "ask" if entry.decided_by not in ("rule", "default") else entry.decision
            # Provenance as recorded with the decision, so `when` and `from` conditions replay too.
            read = origins_of({"": entry.session_read or []}).get("", ())
            call = ToolCall(
                entry.server,
                entry.tool,
                entry.args,
                annotations.get((entry.server, entry.tool), {}),
                provenance=origins_of(entry.provenance or {}),
                session_read=read,
            )
            verdict = (shell_policy if entry.server == SHELL_SERVER else policy).decide(call)
            if verdict.decision == before:
                continue
            changed += 1
            if {before, verdict.decision} == {"allow", "deny"}:
                flips += 1
            key = (verdict.rule_id, verdict.tier, verdict.decision)
            group = groups.get(key)
            if group is None:
                group = groups[key] = _Group(verdict.rule_id, verdict.tier, verdict.decision)
            group.count += 1
            group.transitions[f"{before} -> {verdict.decision}"] += 1
            if len(group.examples) < _EXAMPLES:
                group.examples.append(
                    {
                        "time": entry.time,
                        "server": entry.server,
                        "tool": entry.tool,
                        "args": entry.args,
                        "was": before,
                    }
                )
    except OSError as e:
        return fail(f"the audit log cannot be read: {e}", as_json)
    seconds = time.perf_counter() - started
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.rule or ""))
    under = str(other) if other is not None else "the workspace's policy"
    if as_json:
        print(
            json.dumps(
                {
                    "policy": under,
                    "records": records,
                    "changed": changed,
                    "flips": flips,
                    "seconds": round(seconds, 3),
                    "groups": [
                        {
                            "rule": g.rule,
                            "tier": g.tier or ("workspace" if g.rule is not None else None),
                            "decision": g.decision,
                            "count": g.count,
                            "transitions": dict(g.transitions),
                            "examples": g.examples,
                        }
                        for g in ordered
                    ],
                },
                indent=2,
            )
        )
    else:
        print(
            printable(
                f"replayed {records} call{'s' * (records != 1)} under {under}: {changed} would be decided "
                f"differently, {flips} between allow and deny ({seconds:.2f} s)"
            )
        )
        for g in ordered:
            who = (
                "the default"
                if g.rule is None
                else (f"rule {g.rule!r}" + (f" ({g.tier} admin policy)" if g.tier else ""))
            )
            moves = ", ".join(f"{k}: {v}" for k, v in sorted(g.transitions.items()))
            print(
                printable(f"{who} would decide {g.decision}: {g.count} call{'s' * (g.count != 1)} ({moves})")
            )
            for example in g.examples:
                args = json.dumps(example["args"], ensure_ascii=True)
                print(
                    printable(
                        f"  {example['time']} {example['server']}.{example['tool']} {args[:200]} (was {example['was']})"
                    )
                )
    return EXIT_FLIPS if flips else 0


def _lock_annotations(workspace: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Each pinned tool's annotations, by (server, tool): the log does not record them."""
    from ipybox.config.tool_lock import LOCK_FILE, LockFileError, read_lock

    try:
        lock = read_lock(workspace / LOCK_FILE)
    except LockFileError:
        return {}
    return {
        (server, name): dict(pin.annotations)
        for server, pins in lock.servers.items()
        for name, pin in pins.tools.items()
    }
