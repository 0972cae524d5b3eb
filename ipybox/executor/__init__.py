"""`CodeExecutor`, the SDK's entry point: a kernel with MCP tools, embedded or attached to a workspace."""
