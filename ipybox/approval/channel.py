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
  its pending calls unapproved. A client that declines a call (the wire's `declined`) answers nothing:
  that is `NoOneToAsk` too, with its reason.
- While a call waits for a person, `pause` (if set) stops the clock of the execution that made it: it is
  called when the wait starts and returns the function that resumes the clock, called when the wait ends
  however it ends. `CodeExecutor` passes its kernel client's timer this way; this package never sees it.
- One websocket client at a time; a second one is refused (close code 4409).
- A workspace also asks people (the console, `ipybox approve`) besides the application: `answers` says
  what the connected application can do (`application`: it decides; `elicitation`: it asks its MCP
  client; `none`: it only needs to know, to stop its clock). A question put to someone else is announced
  (`waiting()`), and an `approve` request answered elsewhere first is taken back: cancelling `decide()`
  sends the client a `withdrawn` notice, so it drops the question (an MCP client's dialog included).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal

from starlette.websockets import WebSocket, WebSocketDisconnect

from ipybox.approval.approver import Approval, Approved, NoOneToAsk, Rejected, TimedOut
from ipybox.approval.ask_events import AskView
from ipybox.approval.links import PathLink
from ipybox.approval.request import ApprovalRequest
from ipybox.approval.wire import (
    ApprovalAsk,
    ApprovalError,
    ApprovalMessageError,
    AskNotice,
    CallParams,
    NoticeParams,
    parse_reply,
)
from ipybox.errors import ApprovalFailedError
from ipybox.rules.calls import ToolCall

__all__ = ["Answers", "ApprovalChannel", "ApprovalHandler", "ApprovalRejected", "PauseTimer"]

Answers = Literal["application", "elicitation", "none"]
"""What the application on a channel does with an `approve` request (see the module's contracts)."""

logger = logging.getLogger(__name__)

ApprovalHandler = Callable[[ApprovalRequest], Awaitable[None]]
"""Gets each call to decide, in process; it must `accept()` or `reject()` the request (now or later)."""

PauseTimer = Callable[[], Callable[[], None]]
"""Pauses the clock of the execution waiting for a decision; returns the function that resumes it."""

SETTLED_ELSEWHERE = "the question was settled elsewhere first"

Settled = asyncio.Future[tuple[bool | None, str]]
"""How a question was settled elsewhere first: `(accept, by)`; `accept` is `None` when nobody answered."""

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
        answers: What the application does with a request (a workspace routes `ask`s by it).
    """

    def __init__(
        self,
        approval_required: bool = False,
        approval_timeout: float | None = 60,
        *,
        handler: ApprovalHandler | None = None,
        pause: PauseTimer | None = None,
        answers: Answers = "application",
    ) -> None:
        self.approval_required = approval_required
        self.approval_timeout = approval_timeout
        self.handler = handler
        self.pause = pause
        self.answers: Answers = answers
        self._websocket: WebSocket | None = None
        self._pending: dict[int, asyncio.Future[Approval]] = {}
        self._ids = itertools.count(1)
        self._closed = asyncio.Event()

    @property
    def open(self) -> bool:
        """Whether someone is connected to decide (an in-process handler or a websocket client)."""
        return self.handler is not None or self._websocket is not None

    async def decide(
        self,
        call: ToolCall,
        *,
        timeout: float | None = None,
        settled: Settled | None = None,
        links: Mapping[str, PathLink] | None = None,
        view: AskView | None = None,
    ) -> Approval:
        """Ask the connected application about `call` and wait up to `timeout` seconds (default:
        `approval_timeout`, which may be `None`: no limit) for its answer.

        Args:
            settled: Done when the question was settled elsewhere first (a person answered): the
                application is told to drop it, and the outcome returned is `Rejected` (not the decision:
                whoever settled it acts on it).
            links: Where path arguments lead through links, shown with the call (`ApprovalRequest.links`).
            view: The ask as people see it (the cell's code, the client, the rule), for the application
                to show (`ApprovalRequest.ask`; an MCP client's elicitation message is made of it).
        """
        if not self.approval_required:
            return Approved()
        handler, websocket = self.handler, self._websocket
        if handler is None and websocket is None:
            return NoOneToAsk(NO_CLIENT)
        seconds = self.approval_timeout if timeout is None else timeout
        resume = self.pause() if self.pause is not None else None
        try:
            if handler is not None:
                return await self._ask_handler(handler, call, seconds, settled, links, view)
            assert websocket is not None
            return await self._ask_client(websocket, call, seconds, settled, links, view)
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

    async def _ask_handler(
        self,
        handler: ApprovalHandler,
        call: ToolCall,
        timeout: float | None,
        settled: Settled | None,
        links: Mapping[str, PathLink] | None = None,
        view: AskView | None = None,
    ) -> Approval:
        decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def respond(accepted: bool) -> None:
            if not decided.done():
                decided.set_result(accepted)

        request = ApprovalRequest.of(call, respond, links, ask=view)
        await handler(request)
        # Decided right away (auto-approval): no timer needed.
        if not decided.done() and not await _first(decided, settled, timeout):
            accept, by = _settlement(settled)
            request.withdraw(accept, by)
            if settled is not None and settled.done():
                return Rejected(SETTLED_ELSEWHERE)
            assert timeout is not None  # no settlement and no answer: only a timeout ends the wait
            return TimedOut(timeout)
        return Approved() if decided.result() else Rejected()

    async def _ask_client(
        self,
        websocket: WebSocket,
        call: ToolCall,
        timeout: float | None,
        settled: Settled | None,
        links: Mapping[str, PathLink] | None = None,
        view: AskView | None = None,
    ) -> Approval:
        request_id = next(self._ids)
        decided: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = decided
        try:
            ask = ApprovalAsk(id=request_id, params=CallParams.of(call, links, view))
            try:
                await websocket.send_text(ask.to_json())
            except (WebSocketDisconnect, RuntimeError, OSError) as e:
                # Closed between the check and the send (starlette raises RuntimeError for a closed one).
                logger.debug("approval client gone before it was asked: %s", e)
                return NoOneToAsk(CLIENT_LEFT)
            try:
                answered = await _first(decided, settled, timeout)
            except asyncio.CancelledError:  # the call went away: the client drops its question
                await asyncio.shield(self._notify(websocket, "withdrawn", request_id))
                raise
            if answered:
                return decided.result()
            # Settled elsewhere first, or nobody answered in time: the client drops its question.
            await self._notify(websocket, "withdrawn", request_id, *_settlement(settled))
            if settled is not None and settled.done():
                return Rejected(SETTLED_ELSEWHERE)
            assert timeout is not None
            return TimedOut(timeout)
        finally:
            self._pending.pop(request_id, None)

    @contextlib.asynccontextmanager
    async def waiting(self, settled: Settled | None = None) -> AsyncIterator[None]:
        """While open, someone else is being asked about a call of this channel's application: its clock
        stops (in process through `pause`; over the websocket by a `waiting` notice, and a `withdrawn`
        notice on exit saying how `settled` ended, if it did)."""
        resume = self.pause() if self.pause is not None and self.handler is not None else None
        websocket = self._websocket if self.handler is None else None
        notice_id = next(self._ids)
        if websocket is not None:
            await self._notify(websocket, "waiting", notice_id)
        try:
            yield
        finally:
            if resume is not None:
                resume()
            if websocket is not None:
                await asyncio.shield(self._notify(websocket, "withdrawn", notice_id, *_settlement(settled)))

    async def refused(self, call: ToolCall, reason: str) -> None:
        """Tell an application that answers nothing itself (`answers="none"`) that nobody could be asked
        about `call` of its kernel, and why (it says so beside the cell's output)."""
        websocket = self._websocket
        if websocket is None or self.answers != "none":
            return
        params = NoticeParams(id=next(self._ids), call=CallParams.of(call), reason=reason)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.send_text(AskNotice(method="refused", params=params).to_json())

    async def _notify(
        self,
        websocket: WebSocket,
        method: Literal["waiting", "withdrawn"],
        request_id: int,
        accept: bool | None = None,
        by: str = "",
    ) -> None:
        notice = AskNotice(method=method, params=NoticeParams(id=request_id, accept=accept, by=by))
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.send_text(notice.to_json())

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
        elif reply.result.declined is not None and not reply.result.accept:
            # Not an answer: the application leaves the question to others (see `WorkspaceApprover`).
            self._settle(
                reply.id, NoOneToAsk(f"the application does not answer it ({reply.result.declined})")
            )
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


async def _first(decided: asyncio.Future[Any], settled: Settled | None, timeout: float | None) -> bool:
    """Wait for `decided`, `settled` or the timeout, whichever comes first; `True` when it was `decided`."""
    waiting: set[asyncio.Future[Any]] = {decided} if settled is None else {decided, settled}
    done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    return decided in done


def _settlement(settled: Settled | None) -> tuple[bool | None, str]:
    if settled is None or not settled.done() or settled.cancelled():
        return None, ""
    return settled.result()
