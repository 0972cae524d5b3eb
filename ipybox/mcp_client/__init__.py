"""The MCP client layer: server parameters, long-lived connections over stdio, streamable HTTP and SSE,
and turning tool results into the values sent to a kernel."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Imported on first use: the MCP SDK (which `connection` and `results` load) takes longer to import than the
# rest of ipybox together, and what only reads or checks server parameters (`ipybox.config`, constructing a
# `CodeExecutor`) must not pay for it.
_EXPORTS = {
    "MCPConnection": "ipybox.mcp_client.connection",
    **dict.fromkeys(
        (
            "CallTimeoutError",
            "MCPServerError",
            "ResultTooLargeError",
            "ServerCodeWritableError",
            "ServerConnectError",
            "ServerMemoryLimitError",
            "ServerNotRunningError",
            "ServerParamsError",
            "ServerStartError",
            "ServerTimeoutError",
            "ToolCallError",
        ),
        "ipybox.mcp_client.errors",
    ),
    **dict.fromkeys(
        (
            "HttpServerParams",
            "ServerParams",
            "StdioServerParams",
            "dump_server_params",
            "parse_server_params",
            "validate_server_params",
        ),
        "ipybox.mcp_client.params",
    ),
    "tool_result_value": "ipybox.mcp_client.results",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ipybox.mcp_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
