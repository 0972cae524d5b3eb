"""Tool execution: the host-side tool server that runs MCP tools with approval, and the small client that
generated tool modules use from inside a kernel."""
