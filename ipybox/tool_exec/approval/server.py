"""`ipybox.tool_exec.approval.server`: the published import path, kept; the code lives in [ipybox.approval.channel][ipybox.approval.channel]."""

from ipybox.approval.channel import ApprovalChannel as ApprovalChannel
from ipybox.approval.channel import ApprovalHandler as ApprovalHandler
from ipybox.approval.channel import ApprovalRejected as ApprovalRejected
from ipybox.approval.request import ApprovalRequest as ApprovalRequest

__all__ = [
    "ApprovalChannel",
    "ApprovalHandler",
    "ApprovalRejected",
    "ApprovalRequest",
]
