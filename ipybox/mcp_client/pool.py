"""`MCPServers`: the MCP servers behind a tool server, by name.

A server starts on its first call, is shared by concurrent calls, is started again on the next call
after it crashed, and stops on `stop()`. Names are the only thing callers choose: parameters are set on
the host side, so a kernel cannot make the tool server start a command or reach a URL of its choosing.
Whether a name is known (`resolve`) and what its tools declare (`known_annotations`: from the server's
last listing in this process, else from annotations recorded on the host for its parameters) can be
asked without starting anything, so a call can be approved before its server starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import mcp_types as types

from ipybox.errors import IpyboxError
from ipybox.mcp_client import MCPConnection, MCPServerError, ServerConnectError, parse_server_params
from ipybox.mcp_client.params import ServerParams

logger = logging.getLogger(__name__)


class UnknownServerError(IpyboxError, LookupError):
    """No MCP server is registered under the requested name."""


AnnotationsLookup = Callable[[str, Mapping[str, Any]], Mapping[str, Mapping[str, Any]] | None]
"""`(server_name, server_params) -> {tool_name: annotations}`, or `None` when none are known for those
parameters; e.g. `ServerRegistry.recorded_annotations` for a package root (as `CodeExecutor` uses it)."""


def annotations_of(tool: types.Tool | None) -> dict[str, Any]:
    """A tool's MCP annotations as a dict (`{"readOnlyHint": True, ...}`), `{}` when it declares none."""
    if tool is None or tool.annotations is None:
        return {}
    return tool.annotations.model_dump(by_alias=True, exclude_none=True)


class MCPServers:
    """Named MCP servers, started lazily.

    Args:
        servers: Server parameters by name (`{"command", "args", "env"}` or `{"url", "headers", "type"}`),
            with `${VAR}` placeholders resolved here, on the host, from `environ` and `dotenv_path`.
        connect_timeout: Seconds a server gets to start and complete the MCP handshake.
        environ: Environment for placeholders (default: the host's).
        dotenv_path: A `.env` file for placeholders missing from `environ`.
        lookup: Consulted for a name not in `servers`, to find servers registered on the host later.
        annotations_lookup: Consulted for the annotations of a server's tools while it has not listed
            them in this process, with its name and parameters (see `known_annotations`).
    """

    def __init__(
        self,
        servers: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        connect_timeout: float = 30,
        environ: Mapping[str, str] | None = None,
        dotenv_path: Path | None = None,
        lookup: Callable[[str], Mapping[str, Any] | None] | None = None,
        annotations_lookup: AnnotationsLookup | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.lookup = lookup
        self.annotations_lookup = annotations_lookup
        self.environ = environ
        self.dotenv_path = dotenv_path
        self._params: dict[str, Mapping[str, Any]] = dict(servers or {})
        self._connections: dict[str, MCPConnection] = {}
        self._tools: dict[str, dict[str, types.Tool]] = {}
        # The last listing of each server, kept after it stops (until its parameters change).
        self._listed: dict[str, dict[str, types.Tool]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def names(self) -> list[str]:
        return sorted(self._params)

    def register(self, server_name: str, server_params: Mapping[str, Any]) -> None:
        """Add or replace a server. A replaced server that is running keeps running until `stop(name)`."""
        if self._params.get(server_name) != server_params:
            self._listed.pop(server_name, None)  # another server may stand behind the name now
        self._params[server_name] = dict(server_params)

    async def unregister(self, server_name: str) -> None:
        """Remove a server and stop it if it runs."""
        self._params.pop(server_name, None)
        self._listed.pop(server_name, None)
        await self.stop(server_name)

    def started(self, server_name: str) -> MCPConnection | None:
        """The running connection of a server, if it was started."""
        return self._connections.get(server_name)

    async def connection(self, server_name: str) -> MCPConnection:
        """The running connection to a server, starting it if needed.

        Raises:
            UnknownServerError: No server has that name.
            MCPServerError: It could not be started.
        """
        connection = self._connections.get(server_name)
        if connection is not None and connection.running:
            return connection
        self.resolve(server_name)
        async with self._locks.setdefault(server_name, asyncio.Lock()):
            connection = self._connections.get(server_name)
            if connection is not None and connection.running:
                return connection
            if connection is not None:
                logger.warning("MCP server %r stopped unexpectedly: starting it again", server_name)
                await self._close(server_name)
            params: ServerParams = parse_server_params(
                server_name, self._params[server_name], environ=self.environ, dotenv_path=self.dotenv_path
            )
            connection = MCPConnection(server_name, params, connect_timeout=self.connect_timeout)
            await connection.start()
            try:
                tools = await connection.list_tools()
            except BaseException:
                await connection.stop()
                raise
            self._connections[server_name] = connection
            self._tools[server_name] = self._listed[server_name] = {tool.name: tool for tool in tools}
            return connection

    def resolve(self, server_name: str) -> Mapping[str, Any]:
        """The parameters of a server (from `servers`, else `lookup`), without starting anything.

        Raises:
            UnknownServerError: No server has that name.
        """
        if server_name not in self._params and self.lookup is not None:
            found = self.lookup(server_name)
            if found is not None:
                self._params[server_name] = dict(found)
        if server_name not in self._params:
            known = ", ".join(self.names) or "none"
            raise UnknownServerError(
                f"no MCP server named {server_name!r} is registered with this ipybox (registered: {known})"
            )
        return self._params[server_name]

    def known_tool(self, server_name: str, tool_name: str) -> types.Tool | None:
        """A tool's definition as the server listed it when it last started in this process (it need not
        run now), without starting it; `None` when it has not been listed (or lists no such tool)."""
        return self._listed.get(server_name, {}).get(tool_name)

    def known_annotations(self, server_name: str, tool_name: str) -> dict[str, Any]:
        """A tool's annotations as far as they are known without starting its server: from the server's
        last listing in this process, else from `annotations_lookup` for the server's current parameters
        (e.g. recorded when its package was generated), else `{}` (no hint declared, as far as known)."""
        listed = self._listed.get(server_name)
        if listed is not None:
            return annotations_of(listed.get(tool_name))
        params = self._params.get(server_name)
        if params is None or self.annotations_lookup is None:
            return {}
        try:
            recorded = self.annotations_lookup(server_name, params)
        except Exception:  # unknown annotations are "none declared": the call is still decided
            logger.exception("looking up the recorded tool annotations of MCP server %r failed", server_name)
            return {}
        return dict(recorded.get(tool_name) or {}) if recorded else {}

    def tools(self, server_name: str) -> list[types.Tool]:
        """The tools a started server listed when it started, in its order; empty when it is not running.

        Example:
            ```python
            await servers.connection("time")
            names = [tool.name for tool in servers.tools("time")]
            ```
        """
        return list(self._tools.get(server_name, {}).values())

    async def tool(self, server_name: str, tool_name: str) -> types.Tool | None:
        """A tool's definition (annotations, output schema), starting the server if needed."""
        await self.connection(server_name)
        return self._tools.get(server_name, {}).get(tool_name)

    async def call(
        self, server_name: str, tool_name: str, arguments: Mapping[str, Any]
    ) -> types.CallToolResult:
        """Call a tool. A server whose connection broke is dropped, to be started again on the next call.

        Raises:
            UnknownServerError: No server has that name.
            MCPServerError: The server could not be started or the call failed.
        """
        connection = await self.connection(server_name)
        try:
            return await connection.call_tool(tool_name, arguments)
        except ServerConnectError:
            await self._close(server_name)
            raise

    async def stop(self, server_name: str | None = None) -> None:
        """Stop one server, or all of them (they start again on their next call)."""
        names = [server_name] if server_name is not None else list(self._connections)
        await asyncio.gather(*(self._close(name) for name in names))

    async def _close(self, server_name: str) -> None:
        connection = self._connections.pop(server_name, None)
        self._tools.pop(server_name, None)
        if connection is not None:
            with contextlib.suppress(MCPServerError, OSError):
                await connection.stop()
