"""`ApprovalClient`: decides on tool calls from outside the tool server's process, over a websocket.

It speaks the [wire format][ipybox.approval.wire]: each `approve` request becomes an `ApprovalRequest` for
the callback, each decision goes back as an answer; a malformed request is answered with an error (the
server refuses that call) and never reaches the callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self

import aiohttp

from ipybox.approval.request import ApprovalRequest
from ipybox.approval.wire import ApprovalAnswer, ApprovalError, ApprovalMessageError, Decision, parse_ask

__all__ = ["ApprovalCallback", "ApprovalClient", "ApprovalRequest"]

logger = logging.getLogger(__name__)

ApprovalCallback = Callable[[ApprovalRequest], Awaitable[None]]


class ApprovalClient:
    """Receives approval requests from a tool server and passes each to `callback`.

    Each request is handled in its own task, so several pending calls can be decided in any order. When
    this client disconnects, the calls still waiting are rejected by the server.

    Args:
        callback: Called with each `ApprovalRequest`; it must `accept()` or `reject()` it (now or later).
        host: Host of the tool server (with `port`), when `address` is not given.
        port: Port of the tool server.
        address: The tool server's address, `unix:/path/to.sock` or `http://127.0.0.1:PORT`.
        token: The tool server's application token (`ToolServer.token`); a kernel's call token is refused.
        path: The websocket's path (a workspace supervisor serves one per kernel).

    Example:
        ```python
        async def on_request(request: ApprovalRequest) -> None:
            await (request.reject() if request.tool_name == "delete_file" else request.accept())

        async with ApprovalClient(on_request, address=server.address, token=server.token):
            ...
        ```
    """

    def __init__(
        self,
        callback: ApprovalCallback,
        host: str = "localhost",
        port: int = 8900,
        *,
        address: str | None = None,
        token: str = "",
        path: str = "/approval",
    ) -> None:
        self.callback = callback
        self.address = address or f"http://{host}:{port}"
        self.token = token
        self.path = path
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.disconnect()

    async def connect(self) -> None:
        """Connect to the tool server's approval channel."""
        if self.address.startswith("unix:"):
            connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=self.address[len("unix:") :])
            url = f"http://localhost{self.path}"
        else:
            connector = aiohttp.TCPConnector()
            url = f"{self.address.rstrip('/')}{self.path}"
        self._http = aiohttp.ClientSession(connector=connector)
        try:
            self._ws = await self._http.ws_connect(url, headers={"Authorization": f"Bearer {self.token}"})
        except BaseException:
            await self._http.close()
            self._http = None
            raise
        self._reader = asyncio.create_task(self._read(self._ws))

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for frame in ws:
            if frame.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                continue
            try:
                ask = parse_ask(frame.data)
            except ApprovalMessageError as e:
                # Answered with an error, which the server takes as a refusal of that call.
                logger.warning("the tool server sent a malformed approval request: %s", e)
                with contextlib.suppress(Exception):
                    await ws.send_str(ApprovalError.of(e).to_json())
                continue

            async def respond(accepted: bool, request_id: int = ask.id) -> None:
                answer = ApprovalAnswer(id=request_id, result=Decision(accept=accepted))
                await ws.send_str(answer.to_json())

            request = ApprovalRequest.of(ask.params.to_call(), respond)
            task = asyncio.create_task(self._handle(request))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _handle(self, request: ApprovalRequest) -> None:
        try:
            await self.callback(request)
        except Exception:
            logger.exception("the approval callback failed; rejecting %s", request)
            if request.decision is None:
                with contextlib.suppress(Exception):
                    await request.reject()

    async def disconnect(self) -> None:
        """Disconnect; the server rejects every call still waiting for this client."""
        for task in list(self._handlers):
            task.cancel()
        if self._ws is not None:
            await self._ws.close()
            self._ws = None
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None
        if self._http is not None:
            await self._http.close()
            self._http = None
