"""`AskStreams`: the console's server-sent event stream `/events`, one per open page.

Each stream sends, as SSE:

- first `event: hello` with `{"pending": [ids]}`: the asks pending now (a page that reconnects drops the
  cards of asks that closed while it was away);
- then one default (`message`) event per pending ask and per board event, the JSON of
  `ipybox.approval.ask_events.message_of` (`{"type": "opened", "ask": {...}}`, `{"type": "closed", ...}`);
- a comment (`: keep-alive`) after `KEEPALIVE_S` without events, so proxies and the browser keep the
  connection and a client that went away is noticed by a failed write;
- `event: bye` when the console stops, and the stream ends.

Contracts: while a stream is open it holds `board.present("console")`, which is what lets the console be
asked. A stream ends, and lets go of its subscription and its presence, when the client goes away
(starlette cancels the response when the server reports the disconnect), when the board cuts the
subscriber off for not reading (the browser reconnects after `retry` and gets the pending asks again), and
when `stop()` is called (the endpoint calls it before it stops its server, which waits for open responses
to end). No task is left behind: the stream is the response's own coroutine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Final

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ipybox.approval.ask_events import AskClosedMessage, AskOpenedMessage, message_of
from ipybox.approval.asks import AskBoard, AskEvent, AskOpened, Subscription
from ipybox.display_text import printable

__all__ = ["KEEPALIVE_S", "RETRY_MS", "AskStreams"]

KEEPALIVE_S: Final = 15.0
RETRY_MS: Final = 2000
"""How long a browser waits before it reconnects a stream that ended."""


def _message(event: AskEvent) -> str:
    """The JSON of a board event, with the text the page's script shows as it is (`why`, `by`) escaped
    visibly (`ipybox.display_text`): `textContent` keeps bidi overrides and zero-width characters."""
    message: AskOpenedMessage | AskClosedMessage = message_of(event)
    if isinstance(message, AskClosedMessage):
        answer = message.answer
        if answer is not None:
            answer = answer.model_copy(update={"by": printable(answer.by)})
        message = message.model_copy(update={"why": printable(message.why), "answer": answer})
    return message.to_json()


def _event(data: str, event: str | None = None) -> str:
    head = f"event: {event}\n" if event is not None else ""
    # The data is JSON without newlines (pydantic and json.dumps write none), so one `data:` line.
    return f"{head}data: {data}\n\n"


class AskStreams:
    """The open event streams of one console.

    Args:
        board: The workspace's ask board.
        keepalive_s: Seconds between keep-alive comments when nothing happens.
    """

    def __init__(self, board: AskBoard, *, keepalive_s: float = KEEPALIVE_S) -> None:
        self.board = board
        self.keepalive_s = keepalive_s
        self.stopping = False
        self._open: set[Subscription] = set()

    @property
    def open(self) -> int:
        """How many streams are open now."""
        return len(self._open)

    def response(self, request: Request) -> Response:
        """The `/events` response."""
        del request  # starlette watches the connection itself (see the module docstring)
        if self.stopping:
            return Response("the console is stopping\n", 503, media_type="text/plain")
        return StreamingResponse(
            self.stream(),
            media_type="text/event-stream",
            headers={"X-Accel-Buffering": "no"},
        )

    async def stream(self) -> AsyncIterator[str]:
        """The text of one stream (see the module docstring)."""
        with self.board.subscribe() as subscription, self.board.present("console"):
            self._open.add(subscription)
            try:
                yield f"retry: {RETRY_MS}\n\n"
                yield _event(json.dumps({"pending": [ask.id for ask in subscription.pending]}), "hello")
                for ask in subscription.pending:
                    yield _event(_message(AskOpened(ask)))
                while not self.stopping:
                    try:
                        async with asyncio.timeout(self.keepalive_s):
                            event = await subscription.events.get()
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if event is None:  # cut off for not reading, or the console stops
                        break
                    yield _event(_message(event))
                if self.stopping:
                    yield _event('"the console stopped"', "bye")
            finally:
                self._open.discard(subscription)

    def stop(self) -> None:
        """End every open stream (and refuse new ones)."""
        self.stopping = True
        for subscription in self._open:
            # Wakes the stream's `get()`; the board never reads a subscriber's queue, so this is safe.
            subscription.events.put_nowait(None)
