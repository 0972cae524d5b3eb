"""`CallQuotas`: how many calls each rule with `max_calls` has let run, per session and per cell.

Contracts:

- Counts are keyed by the rule's tier and id, not by the rule object: a reload of the rules (a reconcile)
  keeps them, so editing `ipybox.toml` does not hand a session a fresh quota. A rule renamed is a new
  rule, with a fresh count.
- A call counts once it is let run by the rule: an `allow` rule's at once, an `ask` rule's once a yes
  came. `check` only reads; `count` adds. The approver checks and counts without awaiting between them
  (one event loop), so two concurrent calls can't both take a quota's last call.
- Per session: the session is the lease of an attached application, else the calling kernel. Per cell:
  the cell number the kernel reports (`ToolCall.cell`), held monotonic per caller here (a number lower than
  one seen counts as the newest), so going back does not reopen a cell's quota; going forward does, which
  is why `session` is the bound kernel code cannot reset. A call without a cell number counts against the
  kernel's newest cell.
- A session's counts go when the session ends (`forget_session`); a kernel's cells when it goes
  (`forget_caller`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ipybox.rules import ApprovalPolicy, ToolCall, Verdict
from ipybox.rules.models import Rule

__all__ = ["CallQuotas", "QuotaTrip"]

_RuleKey = tuple[str | None, str]


@dataclass(frozen=True, slots=True)
class QuotaTrip:
    """A rule's quota that a call went past.

    Attributes:
        verdict: What the rule decides now (its `over_quota`).
        text: For the audit log: `session 100/100` or `cell 10/10`.
        note: Why, for the calling code: `rule 'x' lets 100 calls run per session, and this session made
            them`.
    """

    verdict: Verdict
    text: str
    note: str


class CallQuotas:
    """The counts of the rules with `max_calls` (see the module)."""

    def __init__(self) -> None:
        # The rules with a quota of the policy seen last, by (tier, id): found once per policy, not per call.
        self._limited: tuple[ApprovalPolicy, dict[_RuleKey, Rule]] | None = None
        self._sessions: dict[_RuleKey, Counter[str]] = {}
        # Per caller: the newest cell number seen, and each rule's count in that cell.
        self._cells: dict[str, tuple[int, Counter[_RuleKey]]] = {}

    def _rule(self, policy: ApprovalPolicy, verdict: Verdict) -> Rule | None:
        if verdict.rule_id is None:
            return None
        if self._limited is None or self._limited[0] is not policy:
            tiers = [(None, policy.rules), *((tier.name, tier.rules) for tier in policy.admin)]
            limited = {
                (name, rule.id if rule.id is not None else f"rules[{index}]"): rule
                for name, rules in tiers
                for index, rule in enumerate(rules)
                if rule.max_calls is not None
            }
            self._limited = (policy, limited)
        return self._limited[1].get((verdict.tier, verdict.rule_id))

    def _cell(self, call: ToolCall) -> int:
        newest = self._cells.get(call.caller)
        seen = newest[0] if newest is not None else -1
        return max(seen, call.cell if call.cell is not None else seen)

    def check(
        self, policy: ApprovalPolicy, call: ToolCall, verdict: Verdict, session: str | None
    ) -> QuotaTrip | None:
        """The trip, when `verdict`'s rule has a quota and this call would go past it; else `None`."""
        rule = self._rule(policy, verdict)
        if rule is None or rule.max_calls is None:
            return None
        key = (verdict.tier, verdict.rule_id or "")
        limits = rule.max_calls
        used = self._sessions.get(key, Counter())[session or call.caller]
        scope, limit = "session", limits.session
        if limit is None or used < limit:
            cell = self._cell(call)
            newest = self._cells.get(call.caller)
            used = newest[1][key] if newest is not None and newest[0] == cell else 0
            scope, limit = "cell", limits.cell
            if limit is None or used < limit:
                return None
        decision = rule.quota_decision()
        note = (
            f"rule {verdict.rule_id!r} lets {limit} call{'s' * (limit != 1)} run per {scope}, and this {scope} "
            f"made them (over its quota it decides {decision})"
        )
        tripped = Verdict(
            decision, verdict.rule_id, f"{verdict.reason}, but {note}", verdict.tier, verdict.explanation
        )
        return QuotaTrip(tripped, f"{scope} {used}/{limit}", note)

    def count(self, policy: ApprovalPolicy, call: ToolCall, verdict: Verdict, session: str | None) -> None:
        """Count a call `verdict`'s rule let run (nothing when the rule has no quota)."""
        if self._rule(policy, verdict) is None:
            return
        key = (verdict.tier, verdict.rule_id or "")
        self._sessions.setdefault(key, Counter())[session or call.caller] += 1
        cell = self._cell(call)
        newest = self._cells.get(call.caller)
        if newest is None or newest[0] != cell:
            newest = (cell, Counter())
            self._cells[call.caller] = newest
        newest[1][key] += 1

    def forget_session(self, session: str) -> None:
        """The session ended: its counts go."""
        for counts in self._sessions.values():
            counts.pop(session, None)

    def forget_caller(self, caller: str) -> None:
        """The kernel went: its cells' counts (and, without a session, its session's) go."""
        self._cells.pop(caller, None)
        self.forget_session(caller)
