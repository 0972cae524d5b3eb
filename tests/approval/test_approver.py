"""The `Approver` protocol and its simplest implementations."""

from __future__ import annotations

from pathlib import Path

from ipybox.approval import (
    Approval,
    ApprovalChannel,
    ApproveAll,
    Approved,
    Approver,
    FunctionApprover,
    Rejected,
)
from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall


async def test_approve_all_approves_every_call() -> None:
    assert await ApproveAll().decide(ToolCall("any", "thing", {"x": 1})) == Approved()


async def test_a_function_approver_is_the_function_it_wraps() -> None:
    async def read_only(call: ToolCall) -> Approval:
        return Approved() if call.annotations.get("readOnlyHint") is True else Rejected("not read-only")

    approver = FunctionApprover(read_only)
    assert await approver.decide(ToolCall("fs", "read", annotations={"readOnlyHint": True})) == Approved()
    assert await approver.decide(ToolCall("fs", "write")) == Rejected("not read-only")


def test_every_implementation_is_an_approver(tmp_path: Path) -> None:
    # Checked by mypy: each assignment type-checks against the protocol.
    approvers: list[Approver] = [
        ApproveAll(),
        FunctionApprover(ApproveAll().decide),
        ApprovalChannel(True),
        WorkspaceApprover(ApprovalPolicy(), AuditLog(tmp_path / "audit.jsonl"), lambda caller: None),
    ]
    assert all(callable(approver.decide) for approver in approvers)
