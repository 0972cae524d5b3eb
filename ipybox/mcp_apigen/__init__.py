"""Generating a typed Python tool API from MCP tool schemas.

`generate_mcp_sources` connects to a server and writes its package; `write_mcp_sources` and
`render_sources` do the pure generation step from tool schemas, without a server.
"""

from ipybox.mcp_apigen.package import render_sources, write_mcp_sources
from ipybox.mcp_apigen.render import ToolSchema
from ipybox.mcp_apigen.sources import generate_mcp_sources

__all__ = ["ToolSchema", "generate_mcp_sources", "render_sources", "write_mcp_sources"]
