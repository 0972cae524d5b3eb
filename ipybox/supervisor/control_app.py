"""The supervisor's control endpoint (a Unix socket, bearer token): status, leases of kernels from the
warm pool for attached applications, their approval websockets, shutdown.

- `GET /status`: what runs (JSON).
- `POST /leases`: a new lease `{"lease": id}`; `DELETE /leases/{lease}`: release it and its kernels.
- `POST /leases/{lease}/kernels`: a ready kernel from the pool, `{"kernel_id": ...}`.
- `WS /leases/{lease}/approval`: where the lease's application answers `ask` decisions.
- `POST /shutdown`: stop the workspace.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp
from starlette.websockets import WebSocket

from ipybox.asgi_server import BearerAuth


class Controlled(Protocol):
    """What the control endpoint drives (the supervisor)."""

    def status(self) -> dict[str, Any]: ...
    def new_lease(self) -> str: ...
    async def lease_kernel(self, lease: str) -> str: ...
    async def release_lease(self, lease: str) -> None: ...
    async def serve_approvals(self, lease: str, websocket: WebSocket) -> None: ...
    def request_shutdown(self) -> None: ...


def control_app(target: Controlled, token: str) -> ASGIApp:
    """The control endpoint's ASGI app."""

    def endpoint(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def respond(request: Request) -> Response:
            try:
                return JSONResponse(await handler(request))
            except KeyError as e:
                return JSONResponse({"error": f"unknown lease {e.args[0]!r}"}, 404)
            except Exception as e:
                return JSONResponse({"error": f"{type(e).__name__}: {e}"}, 503)

        return respond

    async def status(request: Request) -> dict[str, Any]:
        return target.status()

    async def new_lease(request: Request) -> dict[str, Any]:
        return {"lease": target.new_lease()}

    async def kernel(request: Request) -> dict[str, Any]:
        return {"kernel_id": await target.lease_kernel(request.path_params["lease"])}

    async def release(request: Request) -> dict[str, Any]:
        await target.release_lease(request.path_params["lease"])
        return {"released": True}

    async def shutdown(request: Request) -> dict[str, Any]:
        target.request_shutdown()
        return {"stopping": True}

    async def approvals(websocket: WebSocket) -> None:
        await target.serve_approvals(websocket.path_params["lease"], websocket)

    routes = [
        Route("/status", endpoint(status)),
        Route("/leases", endpoint(new_lease), methods=["POST"]),
        Route("/leases/{lease}", endpoint(release), methods=["DELETE"]),
        Route("/leases/{lease}/kernels", endpoint(kernel), methods=["POST"]),
        WebSocketRoute("/leases/{lease}/approval", approvals),
        Route("/shutdown", endpoint(shutdown), methods=["POST"]),
    ]
    return BearerAuth(Starlette(routes=routes), token)
