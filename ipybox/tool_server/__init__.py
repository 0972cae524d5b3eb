"""The tool server: where kernels send MCP tool calls, each decided by an `Approver` before it runs."""
