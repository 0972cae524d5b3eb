"""`ToolCallRequest`: a tool call waiting for approval, as an `Approver` sees it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call from a kernel, before it runs.

    Attributes:
        server_name: The MCP server, as registered on the host.
        tool_name: The tool.
        tool_args: Its arguments.
        annotations: The tool's MCP annotations (`readOnlyHint`, `destructiveHint`, ...) as the server
            declared them in its last listing known to the host (in this process, or recorded by
            `generate_mcp_sources`); empty (no hint declared) when none is known, since a call is decided
            before its server starts.
        caller: Who made the call: the name its token was issued under (`ToolServer.add_caller`), or ""
            for `ToolServer.call_token` (the token `kernel_env` hands out).
    """

    server_name: str
    tool_name: str
    tool_args: dict[str, Any]
    annotations: dict[str, Any] = field(default_factory=dict)
    caller: str = ""


Approver = Callable[[ToolCallRequest], Awaitable[str | None]]
"""Decides on a tool call: `None` lets it run, a string rejects it and says why."""
