"""Former home of the approver types, kept so that their published names import.

The tool server's approver is an [Approver][ipybox.approval.approver.Approver] (`decide(call) -> Approval`)
and a call is a [ToolCall][ipybox.rules.calls.ToolCall]; `ToolCallRequest` is that same type under its old
name (its fields are `server`, `tool`, `args`, `annotations`, `caller`).
"""

from __future__ import annotations

from ipybox.approval.approver import Approver
from ipybox.rules.calls import ToolCall

__all__ = ["Approver", "ToolCallRequest"]

ToolCallRequest = ToolCall
"""The old name of `ToolCall`."""
