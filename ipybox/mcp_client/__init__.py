"""The MCP client layer: server parameters, long-lived connections over stdio, streamable HTTP and SSE,
and turning tool results into the values sent to a kernel."""

from ipybox.mcp_client.connection import MCPConnection
from ipybox.mcp_client.errors import (
    CallTimeoutError,
    MCPServerError,
    ResultTooLargeError,
    ServerCodeWritableError,
    ServerConnectError,
    ServerMemoryLimitError,
    ServerNotRunningError,
    ServerParamsError,
    ServerStartError,
    ServerTimeoutError,
    ToolCallError,
)
from ipybox.mcp_client.params import (
    HttpServerParams,
    ServerParams,
    StdioServerParams,
    dump_server_params,
    parse_server_params,
    validate_server_params,
)
from ipybox.mcp_client.results import tool_result_value

__all__ = [
    "CallTimeoutError",
    "HttpServerParams",
    "MCPConnection",
    "MCPServerError",
    "ResultTooLargeError",
    "ServerCodeWritableError",
    "ServerConnectError",
    "ServerMemoryLimitError",
    "ServerNotRunningError",
    "ServerParams",
    "ServerParamsError",
    "ServerStartError",
    "ServerTimeoutError",
    "StdioServerParams",
    "ToolCallError",
    "dump_server_params",
    "parse_server_params",
    "tool_result_value",
    "validate_server_params",
]
