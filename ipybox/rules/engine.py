"""The decision on a tool call: among the rules that apply, the strongest wins; otherwise the default.

Below [models][ipybox.rules.models], which builds an engine when a policy loads: rules are read through
[RuleFields][ipybox.rules.matching.RuleFields], so this module never imports the models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ipybox.rules.calls import Decision, ToolCall, Verdict
from ipybox.rules.matching import RuleFields, RuleMatcher

SEVERITY: Final[dict[Decision, int]] = {"allow": 0, "ask": 1, "deny": 2}
"""At equal priority the more cautious decision wins."""


def rule_id(rule: RuleFields, index: int) -> str:
    """How verdicts and messages name a rule: its `id`, or `rules[<index>]` (0-based, in file order)."""
    return rule.id if rule.id is not None else f"rules[{index}]"


class RuleEngine:
    """Rules compiled once, for deciding many calls.

    Rules are tried from strongest to weakest (highest `priority` first; at equal priority deny, then
    ask, then allow; then file order), so the first rule that applies is the verdict and the rest are
    never evaluated.

    Args:
        rules: The rules, in file order.
        default: The decision when no rule applies.
        tier: The admin tier the rules belong to (`Verdict.tier`), `None` for a workspace's.
    """

    __slots__ = ("_default", "_ordered", "default", "matchers", "order", "rules", "tier")

    def __init__(self, rules: Sequence[RuleFields], default: Decision, tier: str | None = None) -> None:
        self.rules = rules
        self.default = default
        self.tier = tier
        ids = [rule_id(rule, index) for index, rule in enumerate(rules)]
        self.matchers: tuple[RuleMatcher, ...] = tuple(
            RuleMatcher(rule, id_) for rule, id_ in zip(rules, ids, strict=True)
        )
        """One matcher per rule, in file order."""
        of = f" of the {tier} policy" if tier is not None else ""
        self.order: tuple[int, ...] = tuple(
            sorted(range(len(rules)), key=lambda i: (-rules[i].priority, -SEVERITY[rules[i].decision]))
        )
        """Rule indexes from strongest to weakest: the order rules are tried in."""
        self._ordered = tuple(
            (
                self.matchers[i].applies,
                Verdict(
                    rules[i].decision,
                    ids[i],
                    f"{self.matchers[i].label}{of} applies",
                    tier,
                    getattr(rules[i], "reason", None),
                ),
            )
            for i in self.order
            # A rule switched off (`enabled = false`) decides nothing; it stays in `rules` and `order`.
            if getattr(rules[i], "enabled", True)
        )
        self._default = Verdict(default, None, f"no rule applies; the default is {default}", tier)

    # An engine is a function of its rules and default: equal (so that policies holding one compare by
    # their fields) and picklable (recompiled on load) on those alone.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RuleEngine):
            return NotImplemented
        return (
            self.default == other.default
            and self.tier == other.tier
            and list(self.rules) == list(other.rules)
        )

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type[RuleEngine], tuple[Sequence[RuleFields], Decision, str | None]]:
        return RuleEngine, (self.rules, self.default, self.tier)

    def decide(self, call: ToolCall) -> Verdict:
        """The verdict on `call`."""
        for applies, verdict in self._ordered:
            if applies(call):
                return verdict
        return self._default

    def applying(self, call: ToolCall) -> list[Verdict]:
        """The verdict of every rule that applies to `call`, strongest first (the first decides)."""
        return [verdict for applies, verdict in self._ordered if applies(call)]
