"""Approval of MCP tool calls: one `Approver` protocol the tool server asks about every call, its
implementations, and the websocket protocol an application decides over.

- [approver][ipybox.approval.approver]: `Approver`, its outcomes (`Approved`, `Rejected`, `TimedOut`,
  `NoOneToAsk`), `ApproveAll` and `FunctionApprover`.
- [channel][ipybox.approval.channel]: `ApprovalChannel`, the interactive approver (in process or over a
  websocket).
- [rule_approver][ipybox.approval.rule_approver]: `WorkspaceApprover`, a workspace's rules and audit log.
- [wire][ipybox.approval.wire]: the messages on the approval websocket, as pydantic models.
- [approval_client][ipybox.approval.approval_client]: `ApprovalClient`, the application's end.
- [request][ipybox.approval.request]: `ApprovalRequest`, one call as the application decides it.

This layer sits below the tool server (which holds one approver) and above the kernels; it never imports
either: the execution timer it pauses while a person decides is passed in as a callback.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ipybox.approval.approval_client import ApprovalClient, ApprovalRequest
    from ipybox.approval.approver import (
        Approval,
        ApproveAll,
        Approved,
        Approver,
        FunctionApprover,
        NoOneToAsk,
        Rejected,
        TimedOut,
    )
    from ipybox.approval.channel import ApprovalChannel

# Imported on first use: the application's end (`approval_client`) loads aiohttp, which the tool server's end
# (every executor) does not need.
_EXPORTS = {
    "ApprovalClient": "ipybox.approval.approval_client",
    "ApprovalRequest": "ipybox.approval.approval_client",
    "ApprovalChannel": "ipybox.approval.channel",
    **dict.fromkeys(
        (
            "Approval",
            "ApproveAll",
            "Approved",
            "Approver",
            "FunctionApprover",
            "NoOneToAsk",
            "Rejected",
            "TimedOut",
        ),
        "ipybox.approval.approver",
    ),
}

__all__ = [
    "Approval",
    "ApprovalChannel",
    "ApprovalClient",
    "ApprovalRequest",
    "ApproveAll",
    "Approved",
    "Approver",
    "FunctionApprover",
    "NoOneToAsk",
    "Rejected",
    "TimedOut",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ipybox.approval' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
