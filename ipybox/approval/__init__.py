"""Approval of MCP tool calls: the server side that asks, and the client side that decides."""

from ipybox.approval.approval_client import ApprovalClient, ApprovalRequest
from ipybox.approval.channel import ApprovalChannel

__all__ = ["ApprovalChannel", "ApprovalClient", "ApprovalRequest"]
