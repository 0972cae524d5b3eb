"""`ApproverConnection`: a person's connection to a running workspace's `ask`s (`ipybox approve`).

It speaks the protocol of `ipybox.approval.ask_events` over the control endpoint's websocket
`/approvers?who=<who>` (the Unix socket and bearer token of `state.json`). While it is open, the workspace
counts the terminal as a route that can answer (`terminal`), so an `ask` routed to it waits for a person
instead of being denied.

Contracts:

- `async for message in connection` yields `AskOpenedMessage` and `AskClosedMessage`, in the order the
  workspace sent them: first one `opened` per ask pending when it connected, then every `opened` and
  `closed`. The server's `answered` frames are not yielded: each settles the `answer()` call waiting for
  it.
- `answer(ask_id, accept, scope)` returns the workspace's `AnswerResult`: `ok`, or why not in one line
  (answered elsewhere first, an `always` rule that would not load, ...). The ask's `closed` message is
  yielded by the iteration as for any other answer.
- The workspace going away (stopped, killed, its socket gone) ends the iteration, and fails every
  `answer()` waiting, with `NotRunningError` ("ipybox in DIR stopped"); a workspace that refuses the
  connection, closes it while it keeps running, or sends what this version does not understand, with
  `ControlRequestError`. Closing the connection ourselves (leaving the `async with`) ends the iteration
  quietly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from types import TracebackType
from typing import Final, Self

import aiohttp
from pydantic import ValidationError

from ipybox.approval.ask_events import (
    AnswerMessage,
    AnswerResult,
    AskClosedMessage,
    AskOpenedMessage,
    parse_server_message,
)
from ipybox.approval.asks import Scope
from ipybox.lifecycle import Service
from ipybox.running.control_client import ControlRequestError
from ipybox.running.state import NotRunningError, SupervisorState

__all__ = ["ApproverConnection", "ApproverMessage"]

ApproverMessage = AskOpenedMessage | AskClosedMessage

# Seconds to connect and upgrade: the endpoint is a local Unix socket, so this only bounds a supervisor
# that accepts but hangs. The websocket itself has no receive timeout: an approver waits for asks for hours.
_HANDSHAKE_TIMEOUT_S: Final = 30.0
# How the websocket ends when the workspace goes away: uvicorn closes it with 1012 (service restart) when
# the supervisor stops (measured), 1001 is "going away", and a killed supervisor closes the socket without
# a close frame (no code, or 1006). Any other code is the workspace closing this connection while it runs
# (1000: e.g. cut off for not reading; 4000 and up: its own refusals, e.g. BearerAuth's 4401).
_GONE: Final = frozenset({None, 1001, 1006, 1012})


class ApproverConnection:
    """A person approving `ask`s of the workspace whose state is `state`.

    Args:
        state: The supervisor's state (`read_state(workspace)`).
        who: Who answers, for the audit log and the other approvers, e.g. `"alice on /dev/pts/3"`.

    Example:
        ```python
        async with ApproverConnection(read_state(Path("ws")), "alice on /dev/pts/3") as approver:
            async for message in approver:
                if isinstance(message, AskOpenedMessage):
                    result = await approver.answer(message.ask.id, accept=True, scope="once")
        ```
    """

    def __init__(self, state: SupervisorState, who: str) -> None:
        self.state = state
        self.who = who
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._tasks: Service | None = None
        self._reader: asyncio.Task[None] | None = None
        self._messages: asyncio.Queue[ApproverMessage | None] = asyncio.Queue()
        self._waiting: dict[str, deque[asyncio.Future[AnswerResult]]] = {}
        self._error: Exception | None = None  # why the connection ended, when not by us
        self._closing = False

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def _workspace(self) -> str:
        return self.state.workspace

    def _stopped(self, detail: str = "") -> NotRunningError:
        return NotRunningError(f"ipybox in {self._workspace} stopped" + (f" ({detail})" if detail else ""))

    async def connect(self) -> None:
        """Open the websocket.

        Raises:
            NotRunningError: The workspace's control endpoint can't be reached.
            ControlRequestError: The workspace refused the connection (the message says why).
        """
        if self._http is not None:
            raise RuntimeError("already connected")
        self._http = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.state.control_socket),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=_HANDSHAKE_TIMEOUT_S),
        )
        try:
            self._ws = await asyncio.wait_for(
                self._http.ws_connect(
                    "http://localhost/approvers",
                    params={"who": self.who},
                    headers={"Authorization": f"Bearer {self.state.control_token}"},
                    autoping=True,
                ),
                _HANDSHAKE_TIMEOUT_S,
            )
        except aiohttp.WSServerHandshakeError as e:
            await self._drop_session()
            raise ControlRequestError(
                f"ipybox in {self._workspace} refused the approver connection (HTTP {e.status}"
                f"{': ' + e.message if e.message else ''}): is it the same ipybox version?"
            ) from None
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            await self._drop_session()
            raise NotRunningError(f"cannot reach ipybox in {self._workspace}: {e or 'timed out'}") from None
        except BaseException:
            await self._drop_session()
            raise
        # The reader outlives this call: it runs in a task group of the connection's (closed by `close()`).
        self._tasks = Service("approver connection")
        await self._tasks.start()
        self._reader = self._tasks.spawn(self._read(self._ws), name="ipybox-approver-reader")

    async def answer(
        self, ask_id: str, accept: bool, scope: Scope = "once", choices: dict[str, str] | None = None
    ) -> AnswerResult:
        """Answer the pending ask `ask_id`; the workspace's verdict on the answer. `choices`: for
        `always`, what the rule requires of each argument (`AskAnswer.choices`).

        Raises:
            NotRunningError: The workspace stopped before it replied.
            ControlRequestError: The connection failed otherwise.
        """
        if self._ws is None or self._reader is None or self._reader.done():
            raise self._error or RuntimeError("use 'async with ApproverConnection(...)'")
        reply: asyncio.Future[AnswerResult] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(ask_id, deque()).append(reply)
        try:
            message = AnswerMessage(id=ask_id, accept=accept, scope=scope, choices=choices)
            await self._ws.send_str(message.to_json())
            return await reply
        except (aiohttp.ClientConnectionError, ConnectionResetError):
            # The reader sees the same end and says why; this waits for it to do so.
            if self._reader is not None:
                await asyncio.wait({self._reader})
            raise self._error or self._stopped() from None
        finally:
            queue = self._waiting.get(ask_id)
            if queue is not None:
                with contextlib.suppress(ValueError):
                    queue.remove(reply)
                if not queue:
                    del self._waiting[ask_id]

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ApproverMessage:
        message = await self._messages.get()
        if message is None:
            self._messages.put_nowait(None)  # every later call ends the same way
            if self._error is not None and not self._closing:
                raise self._error
            raise StopAsyncIteration
        return message

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        try:
            while True:
                frame = await ws.receive()
                if frame.type in (
                    aiohttp.WSMsgType.CLOSE,
                    aiohttp.WSMsgType.CLOSING,
                    aiohttp.WSMsgType.CLOSED,
                ):
                    reason = frame.extra if frame.type == aiohttp.WSMsgType.CLOSE else None
                    self._error = self._error or self._ended(ws.close_code, reason)
                    return
                if frame.type == aiohttp.WSMsgType.ERROR:
                    self._error = self._error or self._stopped(str(frame.data or ""))
                    return
                if frame.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    continue
                try:
                    message = parse_server_message(frame.data)
                except ValidationError:
                    self._error = ControlRequestError(
                        f"ipybox in {self._workspace} sent an approver message this version does not know "
                        f"({str(frame.data)[:200]!r}): is it the same ipybox version?"
                    )
                    await ws.close()
                    return
                if isinstance(message, AnswerResult):
                    self._settle(message)
                else:
                    self._messages.put_nowait(message)
        except (aiohttp.ClientError, ConnectionError) as e:
            self._error = self._error or self._stopped(str(e))
        finally:
            error = self._error or self._stopped()
            for queue in self._waiting.values():
                for reply in queue:
                    if not reply.done():
                        reply.set_exception(error)
            self._messages.put_nowait(None)

    def _ended(self, code: int | None, reason: object) -> Exception:
        """Why the server closed the websocket: the workspace going away, or closing this connection while
        it runs (with the close frame's reason)."""
        if code in _GONE:
            return self._stopped()
        text = str(reason) if reason else ""
        return ControlRequestError(
            f"ipybox in {self._workspace} closed the approver connection (code {code}"
            f"{': ' + text if text else ''}); connect again"
        )

    def _settle(self, result: AnswerResult) -> None:
        queue = self._waiting.get(result.id)
        while queue:
            reply = queue.popleft()
            if not reply.done():
                reply.set_result(result)
                return

    async def close(self) -> None:
        """Close the connection (the workspace stops counting this approver); idempotent."""
        self._closing = True
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
            self._ws = None
        if self._tasks is not None:
            await self._tasks.aclose()  # cancels the reader and waits for it (a cancelled caller sees it)
            self._tasks = None
        self._reader = None
        await self._drop_session()

    async def _drop_session(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
