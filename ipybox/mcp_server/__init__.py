"""ipybox as an MCP server: its tools (`register_mcp_server`, `execute_ipython_cell`, `install_package`,
`reset`) over a workspace. Served over stdio by `ipybox mcp` and over streamable HTTP by `ipybox up`
([supervisor][ipybox.supervisor]).

`MCPServer` is ipybox 0.9's class of that name (`await MCPServer(...).run()` serves stdio for the current
directory). It runs a whole workspace, so it lives in the command line's layer,
[ipybox.cli.mcp_compat][ipybox.cli.mcp_compat], and is imported from there on first use: this package's
modules never depend on a layer above them (a published entry point; import-linter allows this one import).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ipybox.mcp_server.workspace_mcp import WorkspaceMCP, create_server

if TYPE_CHECKING:
    from ipybox.cli.mcp_compat import MCPServer

__all__ = ["MCPServer", "WorkspaceMCP", "create_server"]


def __getattr__(name: str) -> Any:
    if name == "MCPServer":
        from ipybox.cli.mcp_compat import MCPServer

        return MCPServer
    raise AttributeError(f"module 'ipybox.mcp_server' has no attribute {name!r}")
