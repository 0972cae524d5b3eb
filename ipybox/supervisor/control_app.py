"""The supervisor's control endpoint (a Unix socket, bearer token): status, leases of kernels from the
warm pool for attached applications, their approval websockets, applying a server, shutdown.

- `GET /status`: what runs (`WorkspaceStatus`), with each kernel's usage asked of the gateway (`kernels`;
  within 2 s also when the gateway does not answer).
- `POST /leases`: a new lease (`LeaseCreated`); with the body `{"check": true}` (`LeaseRequest`) one whose
  kernels check agent-written code, whose `ask`s are refused without asking anyone; `{"client": name}`
  names it for the people asked about its calls; `DELETE /leases/{lease}`: release it and its kernels
  (`LeaseReleased`).
- `POST /leases/{lease}/kernels`: a ready kernel from the pool (`KernelLeased`).
- `POST /leases/{lease}/cells`: the cell the lease's application executes next (`CellSubmitted`), which asks
  about its calls show as verified (`CellRegistered`; see `ipybox.approval.ask_context`).
- `WS /leases/{lease}/approval`: where the lease's application answers `ask` decisions.
- `POST /servers/{name}/apply`: apply the current `ipybox.toml` now and answer with server `name`'s
  outcome (`ServerOutcome`) once it has one: no polling. With `Accept: application/x-ndjson` the answer
  is a stream: one JSON line per `ProgressEvent` of that server as the workspace reaches it (connecting,
  listing tools, generating, ...), then the outcome as the last line, or a `StreamFailure` line if
  applying failed after the stream began (each line's `kind` says which model it is).
- `WS /approvers?who=...`: where `ipybox approve` waits for `ask`s and answers them (the protocol of
  `ipybox.approval.ask_events`).
- `WS /asks`: a question put to the workspace's people by another process (the MCP server, about a
  `register_mcp_server` call), as `ipybox.approval.ask_events` describes.
- `POST /console/login`: a new one-time login link for the web console (`ConsoleLogin`).
- `POST /mcp/token`: replace the HTTP MCP endpoint's persisted bearer token; the old one is refused from
  then on (`TokenRotated`).
- `POST /shutdown`: stop the workspace (`ShutdownAccepted`).

Contract: every answer is a model of `ipybox.running.status`, as JSON (`model_dump(mode="json")`). An
unknown lease is 404, anything else that fails 503, both with a `ControlError` body. The app drives a
`Controlled` (a small protocol), not the supervisor itself, so it is tested in process. Its place among
the protocols: `docs/design.md`, "Protocols".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from ipybox.asgi_server import BearerAuth
from ipybox.lifecycle import first_of, task_scope
from ipybox.progress import Progress, ProgressEvent
from ipybox.running.status import (
    CellRegistered,
    CellSubmitted,
    ConsoleLogin,
    ControlError,
    KernelLeased,
    LeaseCreated,
    LeaseId,
    LeaseReleased,
    LeaseRequest,
    LockAccepted,
    ServerOutcome,
    ShutdownAccepted,
    StreamFailure,
    TokenRotated,
    WorkspaceStatus,
)

NDJSON = "application/x-ndjson"
"""The media type of a streamed answer: one JSON document per line."""

logger = logging.getLogger(__name__)


class Controlled(Protocol):
    """What the control endpoint drives (the supervisor)."""

    def status(self) -> WorkspaceStatus: ...
    async def status_with_kernels(self) -> WorkspaceStatus: ...
    def new_lease(self, check: bool = False, client: str | None = None) -> LeaseId: ...
    def register_cell(self, lease: LeaseId, code: str) -> str: ...
    async def lease_kernel(self, lease: LeaseId) -> KernelLeased: ...
    async def release_lease(self, lease: LeaseId) -> None: ...
    async def serve_approvals(self, lease: LeaseId, websocket: WebSocket) -> None: ...
    async def apply_server(self, name: str, progress: Progress | None = None) -> ServerOutcome:
        """Apply `ipybox.toml` now and return server `name`'s outcome; the apply finishes also when the
        caller is cancelled (a client of a streamed apply that went away)."""
        ...

    async def serve_approver(self, websocket: WebSocket, who: str) -> None: ...
    async def serve_asker(self, websocket: WebSocket) -> None: ...
    def console_login(self) -> str: ...
    def rotate_mcp_token(self) -> TokenRotated: ...
    def request_shutdown(self) -> None: ...
    async def accept_pins(self, server: str | None) -> list[str]: ...


def control_app(target: Controlled, token: str) -> ASGIApp:
    """The control endpoint's ASGI app."""

    def endpoint(
        handler: Callable[[Request], Awaitable[BaseModel]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def respond(request: Request) -> Response:
            try:
                answer = await handler(request)
            except KeyError as e:  # UnknownLeaseError says what to do; a bare KeyError names the key
                error = str(e) if type(e) is not KeyError else f"unknown lease {e.args[0]!r}"
                return _json(ControlError(error=error), 404)
            except Exception as e:
                logger.warning("control request %s %s failed: %s", request.method, request.url.path, e)
                return _json(ControlError(error=f"{type(e).__name__}: {e}"), 503)
            return _json(answer, 200)

        return respond

    async def status(request: Request) -> WorkspaceStatus:
        return await target.status_with_kernels()

    async def new_lease(request: Request) -> LeaseCreated:
        body = await request.body()
        asked = LeaseRequest.model_validate_json(body) if body.strip() else LeaseRequest()
        return LeaseCreated(lease=target.new_lease(check=asked.check, client=asked.client))

    async def register_cell(request: Request) -> CellRegistered:
        submitted = CellSubmitted.model_validate_json(await request.body())
        return CellRegistered(sha=target.register_cell(LeaseId(request.path_params["lease"]), submitted.code))

    async def kernel(request: Request) -> KernelLeased:
        return await target.lease_kernel(LeaseId(request.path_params["lease"]))

    async def release(request: Request) -> LeaseReleased:
        await target.release_lease(LeaseId(request.path_params["lease"]))
        return LeaseReleased()

    async def apply_server(request: Request) -> ServerOutcome:
        return await target.apply_server(request.path_params["name"])

    apply_once = endpoint(apply_server)

    async def apply_server_streaming(request: Request) -> Response:
        if NDJSON not in request.headers.get("accept", ""):
            return await apply_once(request)
        return _ApplyStream(target, request.path_params["name"], request.url.path)

    async def accept_pins(request: Request) -> LockAccepted:
        return LockAccepted(accepted=await target.accept_pins(request.query_params.get("server")))

    async def shutdown(request: Request) -> ShutdownAccepted:
        target.request_shutdown()
        return ShutdownAccepted()

    async def approvals(websocket: WebSocket) -> None:
        await target.serve_approvals(LeaseId(websocket.path_params["lease"]), websocket)

    async def approvers(websocket: WebSocket) -> None:
        who = websocket.query_params.get("who", "")
        # Shown to other people and written to the audit log: one short printable line.
        who = "".join(c for c in who if c.isprintable())[:80]
        await target.serve_approver(websocket, who)

    async def asks(websocket: WebSocket) -> None:
        await target.serve_asker(websocket)

    async def console_login(request: Request) -> Response:
        try:
            return _json(ConsoleLogin(url=target.console_login()), 200)
        except RuntimeError as e:  # the console is off: the one line says where to turn it on
            return _json(ControlError(error=str(e)), 409)

    async def rotate_mcp_token(request: Request) -> TokenRotated:
        return target.rotate_mcp_token()

    routes = [
        Route("/status", endpoint(status)),
        Route("/mcp/token", endpoint(rotate_mcp_token), methods=["POST"]),
        Route("/leases", endpoint(new_lease), methods=["POST"]),
        Route("/leases/{lease}", endpoint(release), methods=["DELETE"]),
        Route("/leases/{lease}/kernels", endpoint(kernel), methods=["POST"]),
        Route("/leases/{lease}/cells", endpoint(register_cell), methods=["POST"]),
        WebSocketRoute("/leases/{lease}/approval", approvals),
        WebSocketRoute("/approvers", approvers),
        WebSocketRoute("/asks", asks),
        Route("/console/login", console_login, methods=["POST"]),
        Route("/servers/{name}/apply", apply_server_streaming, methods=["POST"]),
        Route("/shutdown", endpoint(shutdown), methods=["POST"]),
        Route("/lock/accept", endpoint(accept_pins), methods=["POST"]),
    ]
    return BearerAuth(Starlette(routes=routes), token)


class _ApplyStream(Response):
    """A streamed apply: each event of server `name` as it comes, then its outcome (or why applying failed),
    one JSON line each. The apply, the writing of the lines and the wait for the client leaving run in a
    task group of this response's scope; a client that goes away cancels the apply's caller here, and the
    target finishes the apply (`Controlled.apply_server`)."""

    def __init__(self, target: Controlled, name: str, path: str) -> None:
        super().__init__(media_type=NDJSON)
        # Streamed: no length (`Response` gives its empty body one).
        self.raw_headers = [(key, value) for key, value in self.raw_headers if key != b"content-length"]
        self.target, self.name, self.path = target, name, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await first_of(self._respond(send), _disconnected(receive))

    async def _respond(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        lines: asyncio.Queue[bytes | None] = asyncio.Queue()
        async with task_scope() as group:
            group.create_task(self._apply(lines))
            while (line := await lines.get()) is not None:
                await send({"type": "http.response.body", "body": line, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _apply(self, lines: asyncio.Queue[bytes | None]) -> None:
        try:
            last: BaseModel = await self.target.apply_server(
                self.name, progress=lambda e: lines.put_nowait(_line(e))
            )
        except Exception as e:
            logger.warning("control request POST %s failed: %s", self.path, e)
            last = StreamFailure(error=f"{type(e).__name__}: {e}")
        lines.put_nowait(_line(last))
        lines.put_nowait(None)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _line(model: BaseModel | ProgressEvent) -> bytes:
    text = model.to_json() if isinstance(model, ProgressEvent) else model.model_dump_json()
    return text.encode() + b"\n"


def _json(model: BaseModel, status_code: int) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json"), status_code)
