"""`ipybox.tool_exec.server`: the published import path, kept; the code lives in [ipybox.tool_server.tool_server][ipybox.tool_server.tool_server]."""

from ipybox.approval.channel import ApprovalChannel as ApprovalChannel
from ipybox.asgi_server import BearerAuth as BearerAuth
from ipybox.asgi_server import EmbeddedServer as EmbeddedServer
from ipybox.mcp_client import MCPServerError as MCPServerError
from ipybox.mcp_client import ToolCallError as ToolCallError
from ipybox.mcp_client import tool_result_value as tool_result_value
from ipybox.mcp_client.pool import AnnotationsLookup as AnnotationsLookup
from ipybox.mcp_client.pool import MCPServers as MCPServers
from ipybox.mcp_client.pool import UnknownServerError as UnknownServerError
from ipybox.tool_server.approver import Approver as Approver
from ipybox.tool_server.approver import ToolCallRequest as ToolCallRequest
from ipybox.tool_server.call_channel import CallChannel as CallChannel
from ipybox.tool_server.tool_server import ToolServer as ToolServer

__all__ = [
    "AnnotationsLookup",
    "ApprovalChannel",
    "Approver",
    "BearerAuth",
    "CallChannel",
    "EmbeddedServer",
    "MCPServerError",
    "MCPServers",
    "ToolCallError",
    "ToolCallRequest",
    "ToolServer",
    "UnknownServerError",
    "tool_result_value",
]
