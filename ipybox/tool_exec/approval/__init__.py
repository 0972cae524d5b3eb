"""`ipybox.tool_exec.approval`: the published import path, kept; the code lives in [approval][ipybox.approval]."""

from ipybox.approval import ApprovalChannel as ApprovalChannel
from ipybox.approval import ApprovalClient as ApprovalClient
from ipybox.approval import ApprovalRequest as ApprovalRequest

__all__ = ["ApprovalChannel", "ApprovalClient", "ApprovalRequest"]
