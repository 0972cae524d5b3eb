"""Our implementation's API generation in two halves, for apigen.py --split (never used by the peer).

`fetch_tools`: start the server, complete the handshake, list its tools (the server stop is not timed).
`generate`: generate the package from the fetched tool list alone, no server involved.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any


class SplitUnavailable(Exception):
    """Our implementation does not (yet) expose the pieces needed to time the halves apart."""


async def fetch_tools(name: str, params: dict[str, Any]) -> tuple[list[Any], Callable[[], Awaitable[None]]]:
    """The server's tools, and the coroutine function that stops the server (timed apart, if at all)."""
    try:
        from ipybox.mcp_client import MCPConnection
    except ImportError as e:
        raise SplitUnavailable(f"ipybox.mcp_client.MCPConnection: {e}") from e
    connection = MCPConnection(name, params)
    await connection.start()
    try:
        return await connection.list_tools(), connection.stop
    except BaseException:
        await connection.stop()
        raise


def generate(name: str, tools: list[Any], root: Path) -> int:
    """Generate `root/name` from `tools` (rendering and writing the files); returns the module count."""
    try:
        from ipybox.mcp_apigen import write_mcp_sources
    except ImportError as e:
        raise SplitUnavailable(f"ipybox.mcp_apigen.write_mcp_sources: {e}") from e
    return len(write_mcp_sources(name, tools, root))
