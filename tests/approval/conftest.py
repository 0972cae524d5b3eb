"""Approval websockets served in this process by a real uvicorn server on a loopback port (no tool server,
no gateway, no kernels), for `ApprovalClient` or a raw websocket to connect to."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from ipybox.asgi_server import EmbeddedServer

WebSocketHandler = Callable[[WebSocket], Awaitable[None]]


@asynccontextmanager
async def serving(routes: dict[str, WebSocketHandler]) -> AsyncIterator[str]:
    """Serve each handler at its path; yields the address (`http://127.0.0.1:PORT`)."""
    app = Starlette(routes=[WebSocketRoute(path, handler) for path, handler in routes.items()])
    server = EmbeddedServer(app, "test-approval")
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()
