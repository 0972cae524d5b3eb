"""`ipybox.tool_exec.approval.client`: the published import path, kept; the code lives in [ipybox.approval.approval_client][ipybox.approval.approval_client]."""

from ipybox.approval.approval_client import ApprovalCallback as ApprovalCallback
from ipybox.approval.approval_client import ApprovalClient as ApprovalClient
from ipybox.approval.request import ApprovalRequest as ApprovalRequest

__all__ = [
    "ApprovalCallback",
    "ApprovalClient",
    "ApprovalRequest",
]
