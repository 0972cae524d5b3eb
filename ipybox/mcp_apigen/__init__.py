"""Generating a typed Python tool API from MCP tool schemas.

`generate_mcp_sources` connects to a server and writes its package; `write_mcp_sources` and
`render_sources` do the pure generation step from tool schemas, without a server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ipybox.mcp_apigen.package import render_sources, write_mcp_sources
    from ipybox.mcp_apigen.render import ToolSchema
    from ipybox.mcp_apigen.sources import generate_mcp_sources

# Imported on first use: a module of this package that only reads the layout of generated code
# (`parsers`, which every executor imports) must not load the MCP SDK and jinja2 with it.
_EXPORTS = {
    "ToolSchema": "ipybox.mcp_apigen.render",
    "generate_mcp_sources": "ipybox.mcp_apigen.sources",
    "render_sources": "ipybox.mcp_apigen.package",
    "write_mcp_sources": "ipybox.mcp_apigen.package",
}

__all__ = ["ToolSchema", "generate_mcp_sources", "render_sources", "write_mcp_sources"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ipybox.mcp_apigen' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
