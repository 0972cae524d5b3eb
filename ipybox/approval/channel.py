"""`ApprovalChannel`: the interactive approver: asks an application about each tool call, and waits.

The application answers in one of two ways:

- in process: `handler` gets an [ApprovalRequest][ipybox.approval.request.ApprovalRequest] per call (the
  SDK's `CodeExecutor` puts it on its `stream()` queue, or accepts it at once for `execute()`);
- over a websocket: an [ApprovalClient][ipybox.approval.approval_client.ApprovalClient] connects (`connect`
  serves it; the tool server's `/approval` endpoint, a workspace's per-lease one) and gets each call in the
  [wire format][ipybox.approval.wire].

Contracts:

- Only an explicit accept approves. A call nobody can be asked about is `NoOneToAsk`; one that got no
  answer within the timeout is `TimedOut`; a client that goes away, or sends a malformed answer, leaves
  its pending calls unapproved.
- While a call waits for a person, `pause` (if set) stops the clock of the execution that made it: it is
  called when the wait starts and returns the function that resumes the clock, called when the wait ends
  however it ends. `CodeExecutor` passes its kernel client's timer this way; this package never sees it.
- One websocket client at a time; a second one is refused (close code 4409).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from ipybox.approval.approver import Approval, Approved, NoOneToAsk, Rejected, TimedOut
from ipybox.approval.request import ApprovalRequest
from ipybox.approval.wire import (
    ApprovalAsk,
    ApprovalError,
    ApprovalMessageError,
    CallParams,
    parse_reply,
)
from ipybox.errors import ApprovalFailedError
from ipybox.rules.calls import ToolCall

__all__ = ["ApprovalChannel", "ApprovalHandler", "ApprovalRejected", "PauseTimer"]

logger = logging.getLogger(__name__)

ApprovalHandler = Callable[[ApprovalRequest], Awaitable[None]]
"""Gets each call to decide, in process; it must `accept()` or `reject()` the request (now or later)."""

PauseTimer = Callable[[], Callable[[], None]]
"""Pauses the clock of the execution waiting for a decision; returns the function that resumes it."""

NO_CLIENT = "no approval client is connected to decide on this tool call"
CLIENT_LEFT = "the approval client disconnected before deciding"


class ApprovalRejected(ApprovalFailedError):
    """The call was rejected (by the application, or because no one could decide)."""


class ApprovalChannel:
    """Asks a connected application about each tool call (an [Approver][ipybox.approval.approver.Approver]).

    Args:
        approval_required: When `False`, every call is approved at once.
        approval_timeout: Seconds to wait for a decision (unless `decide` is given another timeout);
            `None` (ipybox 0.9.2's default) waits as long as it takes: until the decision, the calling
            kernel going away, or the application disconnecting.
        handler: Decides in process; takes precedence over a websocket client.
        pause: Pauses the calling execution's clock while a call waits (see the module's contracts).
    """

    def __init__(
        self,
        approval_required: bool = False,
        approval_timeout: float | None = 60,
        *,
        handler: ApprovalHandler | None = None,
        pause: PauseTimer | None = None,
    ) -> None:
        self.approval_required = approval_required
        self.approval_timeout = approval_timeout
        self.handler = handler
        self.pause = pause
        self._websocket: WebSocket | None = None
        self._pending: dict[int, asyncio.Future[Approval]] = {}
        self._ids = itertools.count(1)
        self._closed = asyncio.Event()

    @property
    def open(self) -> bool:
        """Whether someone is connected to decide (an in-process handler or a websocket client)."""
        return self.handler is not None or self._websocket is not None

    async def decide(self, call: ToolCall, *, timeout: float | None = None) -> Approval:
        """Ask the connected application about `call` and wait up to `timeout` seconds (default:
        `approval_timeout`, which may be `None`: no limit) for its answer."""
        if not self.approval_required:
            return Approved()
        handler, websocket = self.handler, self._websocket
        if handler is None and websocket is None:
            return NoOneToAsk(NO_CLIENT)
        seconds = self.approval_timeout if timeout is None else timeout
        resume = self.pause() if self.pause is not None else None
        try:
            if handler is not None:
                return await self._ask_handler(handler, call, seconds)
            assert websocket is not None
            return await self._ask_client(websocket, call, seconds)
        finally:
            if resume is not None:
                resume()

    async def request(
        self,
        server_name: str,
        tool_name: str,
        tool_args: dict[str, Any],
        annotations: dict[str, Any] | None = None,
    ) -> bool:
        """`decide` as ipybox 0.9 offered it: `True` if accepted, `False` if rejected.

        Raises:
            RuntimeError: Nobody is connected to decide.
            TimeoutError: No decision within `approval_timeout` (never when it is `None`).
        """
        outcome = await self.decide(ToolCall(server_name, tool_name, tool_args, annotations or {}))
        match outcome:
            case Approved():
                return True
            case Rejected():
                return False
            case TimedOut(timeout):
                raise TimeoutError(f"no decision within {timeout:g} s")
            case NoOneToAsk(reason):
                raise RuntimeError(reason)

    async def _ask_handler(self, handler: ApprovalHandler, call: ToolCall, timeout: float | None) -> Approval:
        decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def respond(accepted: bool) -> None:
            if not decided.done():
                decided.set_result(accepted)

        await handler(ApprovalRequest.of(call, respond))
        if not decided.done():  # else decided right away (auto-approval): no timer needed
            try:
                await asyncio.wait_for(decided, timeout)
            except TimeoutError:
                assert timeout is not None  # wait_for(..., None) never times out
                return TimedOut(timeout)
        return Approved() if decided.result() else Rejected()

    async def _ask_client(self, websocket: WebSocket, call: ToolCall, timeout: float | None) -> Approval:
        request_id = next(self._ids)
        decided: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = decided
        try:
            ask = ApprovalAsk(id=request_id, params=CallParams.of(call))
            try:
                await websocket.send_text(ask.to_json())
            except (WebSocketDisconnect, RuntimeError, OSError) as e:
                # Closed between the check and the send (starlette raises RuntimeError for a closed one).
                logger.debug("approval client gone before it was asked: %s", e)
                return NoOneToAsk(CLIENT_LEFT)
            try:
                return await asyncio.wait_for(decided, timeout)
            except TimeoutError:
                assert timeout is not None  # wait_for(..., None) never times out
                return TimedOut(timeout)
        finally:
            self._pending.pop(request_id, None)

    async def connect(self, websocket: WebSocket) -> None:
        """Serve an approval client on `websocket` until it disconnects (one client at a time)."""
        if self._websocket is not None:
            await websocket.close(code=4409, reason="another approval client is connected")
            return
        await websocket.accept()
        self._websocket = websocket
        self._closed.clear()
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                frame = message.get("text")
                await self._receive(websocket, frame if frame is not None else message.get("bytes") or b"")
        except (WebSocketDisconnect, RuntimeError, OSError) as e:  # the connection broke
            logger.debug("approval client disconnected: %s", e)
        finally:
            self._websocket = None
            self._settle_all(NoOneToAsk(CLIENT_LEFT))
            self._closed.set()

    async def _receive(self, websocket: WebSocket, frame: str | bytes) -> None:
        try:
            reply = parse_reply(frame)
        except ApprovalMessageError as e:
            # Never a crash and never an approval: the call it was about (if it says) is refused, and
            # the client is told what was wrong.
            logger.warning("approval client sent a malformed message: %s", e)
            self._settle(e.message_id, Rejected(f"the approval client sent a malformed answer: {e}"))
            await websocket.send_text(ApprovalError.of(e).to_json())
            return
        if isinstance(reply, ApprovalError):
            reason = f"the approval client could not decide: {reply.error.message}"
            self._settle(reply.id, Rejected(reason))
        else:
            self._settle(reply.id, Approved() if reply.result.accept else Rejected())

    def _settle(self, request_id: int | None, outcome: Approval) -> None:
        decided = self._pending.get(request_id) if request_id is not None else None
        if decided is None or decided.done():
            logger.debug("approval answer for no pending call (id %r) ignored", request_id)
            return
        decided.set_result(outcome)

    def _settle_all(self, outcome: Approval) -> None:
        # A lost decision-maker never approves: every call still waiting gets `outcome`.
        for decided in self._pending.values():
            if not decided.done():
                decided.set_result(outcome)

    async def disconnect(self) -> None:
        """Close the client's websocket; its pending calls are not approved (`NoOneToAsk`)."""
        websocket = self._websocket
        if websocket is not None:
            with contextlib.suppress(Exception):
                await websocket.close()
        self._settle_all(NoOneToAsk(CLIENT_LEFT))

    async def join(self, timeout: float = 5) -> None:
        """Wait for the connected approval client to go away."""
        if self._websocket is not None:
            await asyncio.wait_for(self._closed.wait(), timeout)
