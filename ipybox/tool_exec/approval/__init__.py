"""Approval of MCP tool calls: the server side that asks, and the client side that decides."""

from ipybox.tool_exec.approval.client import ApprovalClient, ApprovalRequest
from ipybox.tool_exec.approval.server import ApprovalChannel

__all__ = ["ApprovalChannel", "ApprovalClient", "ApprovalRequest"]
