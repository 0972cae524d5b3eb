"""`ipybox.tool_exec.approval.request`: the published import path, kept; the code lives in [ipybox.approval.request][ipybox.approval.request]."""

from ipybox.approval.request import ApprovalRequest as ApprovalRequest

__all__ = [
    "ApprovalRequest",
]
