"""`MCPEndpoint`: the workspace's MCP server over streamable HTTP (`[endpoints] mcp = true`).

Contract: an async context manager entered once by the supervisor. Entering creates the MCP server and
listens on `[endpoints] host/port` behind a bearer token (browsers may reach it only from a page on the
same machine); leaving stops listening and gives back every session's kernel. The token is the workspace's
persisted one (`ipybox.running.mcp_token`, passed in by the supervisor) and `set_token` replaces it while
serving: a request with the old one is refused from then on.

A session's kernel goes back to the pool as soon as the session ends (`ipybox.mcp_server`): when its client
DELETEs it (the MCP client's `streamable_http_client` does on exit), and when the MCP SDK closes a session
with no HTTP request in flight for `session_idle` seconds (a client that vanished without closing it).
Before, kernels of closed sessions stayed leased until a 30-minute sweep. `sweep()`, one of the
supervisor's watchers, stays as the backstop for sessions whose end was not seen.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path
from types import TracebackType
from typing import Self

from mcp.server.transport_security import TransportSecuritySettings

from ipybox.asgi_server import BearerAuth, EmbeddedServer, ListenError
from ipybox.config import EndpointsSection
from ipybox.mcp_server.workspace_mcp import WorkspaceMCP, create_server

logger = logging.getLogger("ipybox.supervisor")


class MCPEndpoint:
    """Serves a workspace's MCP server over streamable HTTP while entered.

    Args:
        workspace: The workspace directory (its supervisor must be answering on its control socket).
        endpoints: Where to listen.
        output_dir: Where complete outputs too long to return are saved.
        session_idle: Seconds without an HTTP request after which a session is closed and its kernel given
            back, and a 2026-07-28 client's kernel handle expires (default: `[endpoints] kernel_idle`).
        token: The bearer token clients must send (default: a new random one).
    """

    def __init__(
        self,
        workspace: Path,
        endpoints: EndpointsSection,
        output_dir: Path,
        session_idle: float | None = None,
        token: str | None = None,
    ) -> None:
        self.workspace = workspace
        self.endpoints = endpoints
        self.output_dir = output_dir
        self.session_idle = endpoints.kernel_idle if session_idle is None else session_idle
        self.token = token if token is not None else secrets.token_urlsafe(32)
        self._auth: BearerAuth | None = None
        self._mcp: WorkspaceMCP | None = None
        self._http: EmbeddedServer | None = None

    def set_token(self, token: str) -> None:
        """Accept `token` from now on instead of the one before."""
        self.token = token
        if self._auth is not None:
            self._auth.set_token(token)

    @property
    def url(self) -> str | None:
        """The endpoint's URL (`None` until it listens)."""
        if self._http is None or self._http.port is None:
            return None
        host = self.endpoints.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self._http.port}/mcp"

    async def __aenter__(self) -> Self:
        host = self.endpoints.host
        server = create_server(self.workspace, output_dir=self.output_dir, kernel_idle=self.session_idle)
        self._mcp = await server.__aenter__()
        local = [host, "127.0.0.1", "localhost", "[::1]"]
        # Browsers may only reach it from a page on the same machine; other hosts are refused.
        security = TransportSecuritySettings(
            allowed_hosts=[f"{name}:*" for name in local],
            allowed_origins=[f"http://{name}:*" for name in local],
        )
        app = self._mcp.server.streamable_http_app(
            transport_security=security, host=host, session_idle_timeout=self.session_idle
        )
        self._auth = BearerAuth(app, self.token)
        self._http = EmbeddedServer(self._auth, "ipybox-mcp", lifespan=True)
        try:
            await self._http.start(host=host, port=self.endpoints.port)
        except BaseException as e:
            await self.__aexit__(None, None, None)
            if isinstance(e, ListenError):
                # A pinned port (for clients configured once) may be another workspace's pinned port too.
                raise ListenError(
                    f"the MCP endpoint: {e} (set by [endpoints] port; each running workspace needs its own)"
                ) from None
            raise
        logger.info("MCP endpoint at %s", self.url)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.stop()
        mcp, self._mcp = self._mcp, None
        if mcp is not None:
            await mcp.aclose()

    async def sweep(self, every: float = 60, idle_for: float | None = None) -> None:
        """Give back the kernels of sessions without a tool call for `idle_for` seconds (default
        `session_idle`), every `every` seconds, until cancelled."""
        while True:
            await asyncio.sleep(every)
            if self._mcp is not None:
                await self._mcp.close_sessions(self.session_idle if idle_for is None else idle_for)
