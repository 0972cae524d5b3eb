"""The approver under a policy people can trust: quotas that trip and survive a reload, admin tiers a
workspace can't loosen, tools changed since their pins, and refusals that tell the calling code why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ipybox.approval.approver import Approved, NoOneToAsk, Rejected
from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall
from ipybox.rules.models import AdminTier, Rule


def policy(rules: list[dict[str, Any]], **settings: Any) -> ApprovalPolicy:
    return ApprovalPolicy.model_validate({"default": "deny", "ask_timeout": 1, "rules": rules, **settings})


def audited(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


QUOTA = {"id": "echo-few", "server": "s", "tool": "echo", "decision": "allow", "max_calls": {"session": 2}}


def approver_for(tmp_path: Path, approval: ApprovalPolicy, **kwargs: Any) -> WorkspaceApprover:
    return WorkspaceApprover(approval, AuditLog(tmp_path / "audit.jsonl"), lambda caller: None, **kwargs)


async def test_a_rule_past_its_session_quota_decides_its_over_quota_and_the_audit_says_so(
    tmp_path: Path,
) -> None:
    approver = approver_for(tmp_path, policy([{**QUOTA, "over_quota": "deny"}]))
    outcomes = [await approver.decide(ToolCall("s", "echo", caller="k1")) for _ in range(3)]
    assert outcomes[:2] == [Approved(), Approved()]
    assert isinstance(outcomes[2], Rejected) and outcomes[2].rule_id == "echo-few"
    assert "rule 'echo-few' lets 2 calls run per session, and this session made them" in outcomes[2].reason
    entries = audited(tmp_path / "audit.jsonl")
    assert [e.get("quota") for e in entries] == [None, None, "session 2/2"]
    assert entries[2]["decision"] == "deny"
    # Another kernel (without a lease: its own session) has its own count.
    assert await approver.decide(ToolCall("s", "echo", caller="k2")) == Approved()


async def test_quota_counts_survive_a_reload_of_the_rules(tmp_path: Path) -> None:
    approver = approver_for(tmp_path, policy([QUOTA]))
    for _ in range(2):
        assert await approver.decide(ToolCall("s", "echo", caller="k")) == Approved()
    # A reconcile swaps the policy for a new object (here with another rule added): the count stays.
    approver.policy = policy([QUOTA, {"id": "other", "tool": "x", "decision": "deny"}])
    outcome = await approver.decide(ToolCall("s", "echo", caller="k"))
    assert isinstance(outcome, NoOneToAsk)  # an allow rule over its quota asks; nobody is there
    assert audited(tmp_path / "audit.jsonl")[-1]["quota"] == "session 2/2"


async def test_a_cell_quota_resets_in_the_next_cell_but_not_in_an_earlier_one(tmp_path: Path) -> None:
    rule = {**QUOTA, "max_calls": {"cell": 1}, "over_quota": "deny"}
    approver = approver_for(tmp_path, policy([rule]))
    assert await approver.decide(ToolCall("s", "echo", caller="k", cell=3)) == Approved()
    assert isinstance(await approver.decide(ToolCall("s", "echo", caller="k", cell=3)), Rejected)
    # A kernel claiming an earlier cell is held to its newest one.
    assert isinstance(await approver.decide(ToolCall("s", "echo", caller="k", cell=2)), Rejected)
    assert await approver.decide(ToolCall("s", "echo", caller="k", cell=4)) == Approved()


async def test_an_admin_deny_stands_over_a_workspace_allow_and_names_its_tier_and_reason(
    tmp_path: Path,
) -> None:
    tier = AdminTier(
        "system",
        "/etc/ipybox/policy.toml",
        [Rule.model_validate({"id": "no-echo", "tool": "echo", "decision": "deny", "reason": "echo leaks"})],
    )
    workspace = policy([{"id": "echo-ok", "tool": "echo", "decision": "allow", "priority": 100}])
    approver = approver_for(tmp_path, workspace.with_admin((tier,)))
    outcome = await approver.decide(ToolCall("s", "echo"))
    assert isinstance(outcome, Rejected)
    assert (outcome.rule_id, outcome.tier, outcome.explanation) == ("no-echo", "system", "echo leaks")
    assert "rule 'no-echo' of the system admin policy: echo leaks" in outcome.reason
    entry = audited(tmp_path / "audit.jsonl")[-1]
    assert (entry["rule_id"], entry["tier"]) == ("no-echo", "system")


async def test_a_workspace_deny_is_stricter_than_an_admin_ask(tmp_path: Path) -> None:
    tier = AdminTier(
        "user", "~/.config/ipybox/policy.toml", [Rule.model_validate({"tool": "*", "decision": "ask"})]
    )
    workspace = policy(
        [{"id": "no-echo", "tool": "echo", "decision": "deny", "reason": "use print"}], default="allow"
    )
    verdict = workspace.with_admin((tier,)).decide(ToolCall("s", "echo"))
    assert (verdict.decision, verdict.rule_id, verdict.tier) == ("deny", "no-echo", None)
    verdict = workspace.with_admin((tier,)).decide(ToolCall("s", "other"))
    assert (verdict.decision, verdict.tier) == ("ask", "user")


async def test_a_denied_call_tells_the_calling_code_the_rule_and_its_reason(tmp_path: Path) -> None:
    rule = {"id": "no-writes", "tool": "write_*", "decision": "deny", "reason": "write under out/ instead"}
    outcome = await approver_for(tmp_path, policy([rule])).decide(ToolCall("fs", "write_file"))
    assert outcome == Rejected(
        "denied by rule 'no-writes': write under out/ instead", "no-writes", None, "write under out/ instead"
    )


@pytest.mark.parametrize(("changed_tools", "expected"), [("ask", NoOneToAsk), ("deny", Rejected)])
async def test_a_tool_changed_since_its_pin_is_decided_changed_tools_until_accepted(
    tmp_path: Path, changed_tools: str, expected: type
) -> None:
    pending: dict[tuple[str, str], str] = {("s", "read"): "changed"}
    rules = [{"id": "reads", "tool": "read", "decision": "allow"}]
    approver = approver_for(
        tmp_path,
        policy(rules, changed_tools=changed_tools),
        pending_tool=lambda server, tool: pending.get((server, tool)),
    )
    outcome = await approver.decide(ToolCall("s", "read"))
    assert isinstance(outcome, expected)
    assert "s.read is changed since it was pinned in ipybox.lock" in str(outcome)
    assert "add an allow rule" not in str(outcome)
    assert "changed since it was pinned" in audited(tmp_path / "audit.jsonl")[-1]["reason"]
    pending.clear()  # accepted
    assert await approver.decide(ToolCall("s", "read")) == Approved()


def test_quota_settings_that_cannot_work_are_refused_when_the_rules_load() -> None:
    bad = [
        ({"decision": "deny", "max_calls": {"session": 1}}, "a deny rule lets no call run"),
        ({"decision": "allow", "over_quota": "deny"}, "add max_calls"),
        ({"decision": "ask", "max_calls": {"cell": 1}, "over_quota": "ask"}, "only gets stricter"),
        ({"decision": "allow", "max_calls": {}}, "max_calls needs session, cell or both"),
        ({"decision": "allow", "max_calls": {"session": 0}}, "greater than or equal to 1"),
    ]
    for rule, message in bad:
        with pytest.raises(ValueError, match=message):
            Rule.model_validate(rule)
