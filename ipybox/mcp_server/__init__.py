"""ipybox as an MCP server: its tools (`register_mcp_server`, `execute_ipython_cell`, `install_package`,
`reset`) over a workspace. Served over stdio by `ipybox mcp` and over streamable HTTP by `ipybox up`
([supervisor][ipybox.supervisor])."""

from ipybox.mcp_server.workspace_mcp import WorkspaceMCP, create_server

__all__ = ["WorkspaceMCP", "create_server"]
