"""`ApprovalClient`: decides on tool calls from outside the tool server's process, over a websocket.

It speaks the [wire format][ipybox.approval.wire]: each `approve` request becomes an `ApprovalRequest` for
the callback, each decision goes back as an answer; a malformed request is answered with an error (the
server refuses that call) and never reaches the callback. A `withdrawn` notice takes a request back (it was
settled elsewhere first: `ApprovalRequest.withdraw`); while a `waiting` notice is open, `on_waiting`'s pause
holds (someone else is being asked about a call of this application's kernel). A `refused` notice (sent
only to an application that answers nothing itself) reaches the callback as a request decided already:
rejected, `withdrawn_by` saying why nobody was asked. A request that `declines` says this application does
not answer is declined on the wire (`declined`, see the wire format) and never reaches the callback.

Each connection's background work (the websocket's reader, one task per request handed to the callback)
runs in the task group of a `Service` (`ipybox.lifecycle`) made by `connect()`: `disconnect()` cancels the
handlers still running, closes the websocket, then closes the group, waiting until every task of it ended
(a caller cancelled meanwhile sees its cancellation; a later `disconnect()` finishes). A reader that fails
is logged (`Service`'s failure), and ends the handlers with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self

import aiohttp

from ipybox.approval.channel import Answers, PauseTimer
from ipybox.approval.request import ApprovalRequest
from ipybox.approval.wire import (
    ApprovalAnswer,
    ApprovalError,
    ApprovalMessageError,
    AskNotice,
    Decision,
    parse_server_frame,
)
from ipybox.lifecycle import Service
from ipybox.rules.calls import ToolCall

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
        answers: What this application does with requests, for a workspace routing `ask`s (`application`:
            the callback decides; `elicitation`: it asks an MCP client; `none`: it gets no requests, only
            `waiting` notices).
        on_waiting: Pauses the application's execution clock while someone else is asked about one of its
            calls; returns the function that resumes it.
        declines: Asked first about each request: why the application does not answer it now (`None`: it
            does, through `callback`). A declined call is the workspace's to put to people, or to deny.

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
        answers: Answers = "application",
        on_waiting: PauseTimer | None = None,
        declines: Callable[[ToolCall], str | None] | None = None,
    ) -> None:
        self.callback = callback
        self.declines = declines
        self.address = address or f"http://{host}:{port}"
        self.token = token
        self.path = path
        self.answers: Answers = answers
        self.on_waiting = on_waiting
        self._requests: dict[int, ApprovalRequest] = {}  # undecided, by request id
        self._waits: dict[int, Callable[[], None]] = {}  # open `waiting` notices: their resume
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._tasks: Service | None = None  # this connection's reader and handlers (`connect()` makes it)
        self._handlers: set[asyncio.Task[None]] = set()  # tasks of `_tasks`, cancelled first on disconnect

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.disconnect()

    async def connect(self) -> None:
        """Connect to the tool server's approval channel.

        Raises:
            RuntimeError: It is connected already (`disconnect()` first).
        """
        if self._tasks is not None:
            raise RuntimeError(
                "the approval client is connected already: disconnect() before connecting again"
            )
        if self.address.startswith("unix:"):
            connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=self.address[len("unix:") :])
            url = f"http://localhost{self.path}"
        else:
            connector = aiohttp.TCPConnector()
            url = f"{self.address.rstrip('/')}{self.path}"
        if self.answers != "application":
            url += f"?answers={self.answers}"
        self._http = aiohttp.ClientSession(connector=connector)
        try:
            self._ws = await self._http.ws_connect(url, headers={"Authorization": f"Bearer {self.token}"})
        except BaseException:
            await self._http.close()
            self._http = None
            raise
        self._tasks = Service("approval client")
        await self._tasks.start()
        self._tasks.spawn(self._read(self._ws), name="ipybox-approval-client-reader")

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        try:
            await self._read_frames(ws)
        finally:
            self._resume_all()  # the server is gone: nobody is being asked for us any more

    async def _read_frames(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for frame in ws:
            if frame.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                continue
            try:
                ask = parse_server_frame(frame.data)
            except ApprovalMessageError as e:
                # Answered with an error, which the server takes as a refusal of that call.
                logger.warning("the tool server sent a malformed approval request: %s", e)
                with contextlib.suppress(Exception):
                    await ws.send_str(ApprovalError.of(e).to_json())
                continue
            if isinstance(ask, AskNotice):
                self._notice(ask)
                continue

            call = ask.params.to_call()
            declined = self.declines(call) if self.declines is not None else None
            if declined is not None:
                answer = ApprovalAnswer(id=ask.id, result=Decision(accept=False, declined=declined))
                with contextlib.suppress(Exception):
                    await ws.send_str(answer.to_json())
                continue

            async def respond(accepted: bool, request_id: int = ask.id) -> None:
                answer = ApprovalAnswer(id=request_id, result=Decision(accept=accepted))
                await ws.send_str(answer.to_json())

            request = ApprovalRequest.of(call, respond, ask.params.links, ask=ask.params.ask)
            self._requests[ask.id] = request
            request.add_done_callback(functools.partial(self._forget, ask.id))
            self._spawn_handler(request)

    def _forget(self, request_id: int, accepted: bool) -> None:
        self._requests.pop(request_id, None)

    def _notice(self, notice: AskNotice) -> None:
        params = notice.params
        if notice.method == "refused":
            if params.call is not None:  # for the callback to see, already decided: nobody was asked
                refused = ApprovalRequest.of(params.call.to_call(), _nobody_answers)
                refused.withdraw(False, params.reason)
                self._spawn_handler(refused)
            return
        if notice.method == "waiting":
            if self.on_waiting is not None and params.id not in self._waits:
                self._waits[params.id] = self.on_waiting()
            return
        resume = self._waits.pop(params.id, None)
        if resume is not None:
            resume()
        request = self._requests.pop(params.id, None)
        if request is not None:
            request.withdraw(params.accept, params.by)

    def _resume_all(self) -> None:
        waits, self._waits = self._waits, {}
        for resume in waits.values():
            resume()

    def _spawn_handler(self, request: ApprovalRequest) -> None:
        assert self._tasks is not None  # only the reader spawns, and it is a task of `_tasks`
        task = self._tasks.spawn(self._handle(request), name="ipybox-approval-client-handler")
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
        """Disconnect; the server rejects every call still waiting for this client. Idempotent.

        Raises:
            CancelledError: The caller was cancelled meanwhile (a later `disconnect()` finishes).
        """
        self._resume_all()
        # The handlers first: none of them answers on a websocket being closed.
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        if handlers:
            await asyncio.wait(handlers)
        if self._ws is not None:
            await self._ws.close()
            self._ws = None
        if self._tasks is not None:
            await self._tasks.aclose()  # the reader, ended by the close or cancelled now
            self._tasks = None
        if self._http is not None:
            await self._http.close()
            self._http = None


async def _nobody_answers(accepted: bool) -> None:
    """A refused call's request has nobody to answer to (it is decided already)."""
