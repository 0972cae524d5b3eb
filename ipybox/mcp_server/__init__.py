"""ipybox as an MCP server: stdio (`ipybox mcp`) and streamable HTTP (served by `ipybox up`)."""

from ipybox.mcp_server.server import WorkspaceMCP, create_server
from ipybox.mcp_server.stdio import serve_stdio

__all__ = ["WorkspaceMCP", "create_server", "serve_stdio"]
