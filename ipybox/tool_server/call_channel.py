"""`CallChannel`: where kernels send tool calls, one JSON object per line each way.

A tool call from a kernel is on the critical path of agent code that loops over tools, so this path
carries no HTTP: the kernel writes `{"token", "op", ...}` and a newline, the channel answers with one
JSON line (`{"result": ...}` or `{"error": {"type", "message"}}`). `json.dumps` never emits a raw newline,
so a line is always one whole message. Every request carries the token; a request without the right one
is answered `unauthorized` and the connection is closed. The token also says who is calling: the channel
puts that identity into the request as `caller` (whatever the kernel sent there is replaced).

Requests, answered in order on each connection (kernels use one connection per thread):

- `{"op": "run", "server": str, "tool": str, "args": object}`: approve and run a tool (`run_call` reads it
  into the [ToolCall][ipybox.rules.calls.ToolCall] that approvers and the audit log see, `caller` included).
- `{"op": "reset"}`: reset the caller's MCP servers (the handler decides which; see `ToolServer`).

One caller's misbehaviour costs that caller only ([ChannelLimits][ipybox.tool_server.call_channel.ChannelLimits]
has the numbers). Measured on a `ToolServer` before these limits: 21,000 idle connections from one kernel
took the process to its descriptor limit (other kernels' calls hung, it could not even open a file);
four 200 MiB request lines without a newline grew its RSS from 86 to 885 MiB, 64 lines of 20 MiB to
1367 MiB, never returned. With them: the other kernels' calls are answered as usual; peak RSS 149 and
211 MiB, back to 87 once the attacker's connections close.

- A connection belongs to a caller from the first request that authenticates it (or, for a request
  longer than 512 bytes, from the token it starts with: `ToolRunner` sends `token` first, so a large
  request is charged to its caller before its bulk is read), and to another caller once a request carries
  that caller's token. A caller may hold `connections_per_caller` connections; one more is answered
  `too_many_connections` and closed.
- Until then it is unidentified: at most `unidentified_connections` of those exist at once (a new one
  closes the oldest, which has been silent longest; a kernel's own connection sends its request at once),
  each must send an authenticated request within `first_request_timeout`, and its line may grow to 64 KiB
  only unless it starts with the token.
- A request line is read in chunks and refused, unread, once it passes `max_request_bytes`
  (`request_too_large`, then the connection closes): never more than the limit plus one chunk is buffered.
  Past 64 KiB a line needs one of its caller's `large_requests_per_caller` slots, held until its answer
  is ready; without one the channel stops reading that connection (the kernel's send waits), so one
  caller's many connections cannot each buffer a limit's worth.
- A connection that sends no request for `idle_timeout` (authenticated) or `first_request_timeout`
  (unidentified) is closed after an `idle_timeout` error line. That line means "nothing of what you sent
  after your last answer was or will be run": `ToolRunner` then resends its request once on a new
  connection. No other close carries it, so a request that may have run is never sent twice.
- All connections together stay below `max_connections` (default: half the process's soft descriptor
  limit), so the rest of the process keeps descriptors. `asyncio` itself, when `accept()` fails for lack of
  descriptors, retries a second later while existing connections keep being served.
- A call still running after a second is watched: when its kernel closes the connection (a cell
  interrupted during the call; `ToolRunner` closes it then, since the answer may still come), the call is
  cancelled (the MCP server gets `notifications/cancelled`) instead of holding the server until its
  `call_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import resource
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

from ipybox.rules.calls import ToolCall

logger = logging.getLogger(__name__)

MiB = 1024 * 1024

# What one read takes from a connection, and the stream reader's limit: it stops reading a connection's
# socket once it holds twice this unconsumed, so a connection waiting for a slot buffers little.
_CHUNK = 64 * 1024
# Past this, a line needs a large-request slot of its caller (or, unidentified, starts with its token).
_SMALL = 64 * 1024
# The head of a line where its token must be, if it is charged to a caller before it is complete.
_HEAD = 512
# Seconds a call runs before its connection is watched for the kernel going away.
_WATCH_AFTER = 1.0
_TOKEN_PREFIX = re.compile(rb'\s*\{\s*"token"\s*:\s*"([A-Za-z0-9_\-]{1,256})"')

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


# An answer goes out in pieces of this size: one write() of a large answer copies it whole into the
# transport's buffer and sends it from there, measured superlinear (25 / 50 / 100 MB: 0.07 / 0.17 / 0.56 s);
# in pieces the copy is one piece and the time linear (0.04 / 0.06 / 0.20 s).
_ANSWER_PIECE = 1024 * 1024


def answer_pieces(answer: dict[str, Any]) -> list[memoryview | bytes]:
    """The answer line, in pieces to write one after the other.

    Encoded by pydantic-core, as UTF-8: for 50 MB of text 0.2 s where `json.dumps` takes 0.5 s (and turns
    each non-ASCII character into a 6-byte `\\uXXXX` escape). Strings with no UTF-8 form (lone surrogates)
    fall back to `json.dumps`, whose ASCII escapes carry them: every answer is sent. Neither emits a raw
    newline, so the line is one message.
    """
    try:
        body = to_json(answer)
    except (PydanticSerializationError, ValueError, TypeError):
        body = json.dumps(answer, separators=(",", ":")).encode()
    if len(body) < _ANSWER_PIECE:
        return [body + b"\n"]  # one write, one send: most answers
    view = memoryview(body)
    return [*(view[start : start + _ANSWER_PIECE] for start in range(0, len(view), _ANSWER_PIECE)), b"\n"]


def error(kind: str, message: str) -> dict[str, Any]:
    """An error answer."""
    return {"error": {"type": kind, "message": message}}


def run_call(request: dict[str, Any]) -> ToolCall:
    """The tool call a `run` request asks for, with the caller the channel authenticated (no annotations:
    the host knows those, not the kernel).

    Raises:
        ValueError: The request is not `{"server": str, "tool": str, "args": object}`.
    """
    server, tool, args = request.get("server"), request.get("tool"), request.get("args") or {}
    if not (isinstance(server, str) and isinstance(tool, str) and isinstance(args, dict)):
        raise ValueError("expected {'server': str, 'tool': str, 'args': object}")
    caller = request.get("caller", "")
    return ToolCall(server, tool, args, caller=caller if isinstance(caller, str) else "")


def _default_max_connections() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 32768
    return max(64, soft // 2)


@dataclass(frozen=True)
class ChannelLimits:
    """How much one caller (one kernel's token) may hold of the call channel.

    Attributes:
        max_request_bytes: Longest request line (a tool call's JSON, arguments included); longer ones are
            answered `request_too_large` unread. Pass large data as a file and its path instead.
        connections_per_caller: Open connections of one caller (a kernel uses one per thread that calls
            tools).
        large_requests_per_caller: Requests over 64 KiB of one caller that are read or run at a time; more
            wait, unread.
        unidentified_connections: Connections that have not yet sent an authenticated request, over all
            callers; a new one closes the oldest.
        first_request_timeout: Seconds a new connection has to send its first authenticated request.
        idle_timeout: Seconds an authenticated connection may stay without a request (`ToolRunner`
            reconnects transparently) or without reading its answer.
        max_connections: All connections together (default: half the soft `RLIMIT_NOFILE`).
    """

    max_request_bytes: int = 16 * MiB
    connections_per_caller: int = 64
    large_requests_per_caller: int = 4
    unidentified_connections: int = 256
    first_request_timeout: float = 5.0
    idle_timeout: float = 300.0
    max_connections: int = field(default_factory=_default_max_connections)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"ChannelLimits.{f.name} must be a positive number, not {value!r}")
        if self.max_request_bytes < _SMALL:
            raise ValueError(f"ChannelLimits.max_request_bytes must be at least {_SMALL} (64 KiB)")


class _Refused(Exception):
    """Ends a connection with one error line."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(answer["error"]["type"])
        self.answer = answer


@dataclass
class _Caller:
    large: asyncio.Semaphore  # its large-request slots
    connections: int = 0


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    first_deadline: float
    caller: str | None = None
    rest: bytes = b""  # read past the end of the last line (a pipelined next request)
    holds_large: bool = False
    forgotten: bool = False
    task: asyncio.Task[None] | None = None
    watcher: asyncio.Future[None] | None = None  # watches for a close during a long call
    # Read by the sweep (`CallChannel._sweep`), so a call costs no timer of its own:
    reading_until: float | None = None  # waiting for a request's bytes, which must come by then
    expired: bool = False  # the sweep cancelled the read: answered `idle_timeout`
    answering_since: float | None = None  # a call runs since then


class CallChannel:
    """Serves tool-call requests from kernels on a Unix socket or a loopback TCP port.

    Args:
        authenticate: The identity a token stands for, or `None` for a token that is not valid.
        handlers: The handler of each `op`; it gets the request and returns the answer.
        limits: What one caller may hold (see the module's description); default `ChannelLimits()`.
    """

    def __init__(
        self,
        authenticate: Callable[[str], str | None],
        handlers: dict[str, Handler],
        limits: ChannelLimits | None = None,
    ) -> None:
        self._authenticate = authenticate
        self._handlers = handlers
        self.limits = limits or ChannelLimits()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._connections: set[_Connection] = set()
        self._unidentified: dict[_Connection, None] = {}  # oldest first
        self._callers: dict[str, _Caller] = {}
        self._unix_socket: Path | None = None
        self.address: str | None = None

    def open_connections(self) -> dict[str | None, int]:
        """Open connections by caller (`None`: not identified yet)."""
        counts: dict[str | None, int] = {caller: state.connections for caller, state in self._callers.items()}
        if self._unidentified:
            counts[None] = len(self._unidentified)
        return counts

    async def start(self, *, unix_socket: Path | None = None, host: str = "127.0.0.1") -> str:
        """Listen on `unix_socket` (mode 0600), else on a free loopback port; returns the address kernels
        use (`unix:PATH` or `tcp://HOST:PORT`)."""
        if unix_socket is not None:
            self._server = await asyncio.start_unix_server(self._serve, str(unix_socket), limit=_CHUNK)
            os.chmod(unix_socket, 0o600)
            self._unix_socket = unix_socket
            self.address = f"unix:{unix_socket}"
        else:
            self._server = await asyncio.start_server(self._serve, host, 0, limit=_CHUNK)
            port = self._server.sockets[0].getsockname()[1]
            self.address = f"tcp://{host}:{port}"
        self._sweeper = asyncio.ensure_future(self._sweep())
        return self.address

    async def stop(self) -> None:
        """Stop listening, close every connection and end the calls still running on them."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self._server is not None:
            self._server.close()
            tasks = []
            for conn in list(self._connections):
                conn.writer.transport.abort()  # unsent answers are dropped: nobody is there to read them
                if conn.task is not None and conn.task is not asyncio.current_task():
                    conn.task.cancel()
                    tasks.append(conn.task)
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        if self._unix_socket is not None:
            self._unix_socket.unlink(missing_ok=True)
        self._server, self._unix_socket, self.address = None, None, None

    # -- a connection's life

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        conn = _Connection(reader, writer, loop.time() + self.limits.first_request_timeout)
        if not self._admit(conn):
            self._end(conn, self._too_many("the ipybox tool server has too many open connections"))
            return
        conn.task = asyncio.current_task()
        try:
            while (line := await self._read_request(conn)) is not None:
                # A call still running after a moment is watched (by the sweep): if its kernel goes away
                # (the cell was interrupted), the call is cancelled instead of holding its server until
                # call_timeout. Not from the start: most calls end within a millisecond.
                conn.answering_since = loop.time()
                try:
                    answer, keep_open = await self._answer(conn, line)
                finally:
                    conn.answering_since = None
                    if conn.watcher is not None:
                        await self._unwatch(conn)
                del line
                self._release_large(conn)
                for piece in answer_pieces(answer):
                    writer.write(piece)
                    if writer.transport.get_write_buffer_size():  # else all sent: nothing to wait for
                        # A kernel that never reads its answers must not hold it (and the answer) forever.
                        async with asyncio.timeout(self.limits.idle_timeout):
                            await writer.drain()
                if not keep_open:
                    break
        except _Refused as refused:
            self._end(conn, refused.answer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the kernel went away (restarted, interrupted mid-call) or never read: nothing to answer
        except asyncio.CancelledError:
            # `stop()`. Not re-raised: nothing awaits this task, and Python 3.11's stream server logs a
            # cancelled connection task as an "unhandled exception".
            pass
        finally:
            self._forget(conn)
            writer.close()

    async def _sweep(self) -> None:
        """Every moment, for all connections: end the reads past their deadline (idle, or no request
        since connecting) and watch the calls running past `_WATCH_AFTER`. One task instead of a timer
        per read and per call: those cost a call 25 us (of about 100 on the channel)."""
        loop = asyncio.get_running_loop()
        limits = self.limits
        every = min(0.5, limits.first_request_timeout / 4, limits.idle_timeout / 4)
        while True:
            await asyncio.sleep(every)
            now = loop.time()
            for conn in list(self._connections):
                if conn.reading_until is not None and now >= conn.reading_until and not conn.expired:
                    if conn.task is not None:
                        conn.expired = True
                        conn.task.cancel()
                elif (
                    conn.answering_since is not None
                    and conn.watcher is None
                    and now - conn.answering_since >= _WATCH_AFTER
                ):
                    self._watch(conn)

    def _watch(self, conn: _Connection) -> None:
        if not conn.rest:  # else the kernel already sent more: it is there
            conn.watcher = asyncio.ensure_future(self._watch_for_close(conn))

    async def _watch_for_close(self, conn: _Connection) -> None:
        """Cancel the connection's task (and the call it runs) when the kernel closes the connection."""
        try:
            data = await conn.reader.read(_CHUNK)
        except ConnectionError:
            data = b""
        if data:
            conn.rest += data  # a pipelined request: read by the connection's task after the answer
        elif conn.task is not None:
            logger.info("a kernel closed its connection during a call: cancelling the call")
            conn.task.cancel()

    async def _unwatch(self, conn: _Connection) -> None:
        watcher, conn.watcher = conn.watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
            # Done before the connection's task reads again: a stream has one reader at a time.
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    def _admit(self, conn: _Connection) -> bool:
        """Count a new connection in, closing the oldest unidentified one to make room; `False` when there
        is no room."""
        limits = self.limits
        if len(self._unidentified) >= limits.unidentified_connections or (
            len(self._connections) >= limits.max_connections
        ):
            if not self._unidentified:
                return False
            oldest = next(iter(self._unidentified))
            self._forget(oldest)
            self._end(oldest, self._too_many("too many connections sent no request: closing the oldest"))
        self._connections.add(conn)
        self._unidentified[conn] = None
        return True

    def _identify(self, conn: _Connection, caller: str) -> None:
        """Charge `conn` to `caller` from now on.

        A connection whose requests change token (code holding two, e.g. a test) moves to the new caller,
        within its limit too; the request that got a large-request slot for one caller by its first bytes
        must be that caller's.

        Raises:
            _Refused: The caller holds its limit of connections (`too_many_connections`), or the request
                is not the caller's its first bytes named (`unauthorized`).
        """
        if conn.caller == caller:
            return
        if conn.holds_large:
            raise _Refused(error("unauthorized", "a request's tokens disagree"))
        state = self._callers.get(caller)
        if state is None:
            state = self._callers[caller] = _Caller(asyncio.Semaphore(self.limits.large_requests_per_caller))
        limit = self.limits.connections_per_caller
        if state.connections >= limit:
            raise _Refused(
                self._too_many(
                    f"this kernel already has {limit} open connections to the ipybox tool server, its limit "
                    "(connections_per_caller); each thread that calls tools keeps one: use fewer threads"
                )
            )
        if conn.caller is not None:
            self._uncount(conn.caller)
        state.connections += 1
        conn.caller = caller
        self._unidentified.pop(conn, None)

    def _uncount(self, caller: str) -> None:
        state = self._callers[caller]
        state.connections -= 1
        if state.connections == 0:
            del self._callers[caller]

    def _forget(self, conn: _Connection) -> None:
        if conn.forgotten:
            return
        conn.forgotten = True
        self._release_large(conn)
        self._connections.discard(conn)
        self._unidentified.pop(conn, None)
        if conn.caller is not None:
            self._uncount(conn.caller)

    def _release_large(self, conn: _Connection) -> None:
        if conn.holds_large:
            conn.holds_large = False
            assert conn.caller is not None
            self._callers[conn.caller].large.release()

    @staticmethod
    def _end(conn: _Connection, answer: dict[str, Any]) -> None:
        # The line fits any socket buffer: written without waiting, sent before the close.
        with contextlib.suppress(Exception):
            conn.writer.write(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
        conn.writer.close()

    @staticmethod
    def _too_many(message: str) -> dict[str, Any]:
        return error("too_many_connections", message)

    # -- reading a request

    async def _read_request(self, conn: _Connection) -> bytearray | None:
        """The next request line, without its newline; `None` when the kernel closed the connection.

        Raises:
            _Refused: The line is too large, the connection idle too long, or over its caller's limit.
        """
        loop = asyncio.get_running_loop()
        limits = self.limits
        deadline = conn.first_deadline if conn.caller is None else loop.time() + limits.idle_timeout
        # One growing buffer, not a list of chunks: past the allocator's mmap threshold it is one mapping,
        # returned to the system when freed (64 KiB chunks freed together leave the heap fragmented: 64
        # connections x 20 MiB kept the RSS 78 MiB up after they closed).
        line = bytearray()
        while True:
            if conn.rest:
                chunk, conn.rest = conn.rest, b""
            else:
                chunk = await self._receive(conn, deadline)
                if not chunk:
                    return None  # closed; a partial line is dropped unanswered
            end = chunk.find(b"\n")
            if end >= 0:
                chunk, conn.rest = chunk[:end], chunk[end + 1 :]
            if len(line) + len(chunk) > limits.max_request_bytes:
                raise _Refused(self._too_large())
            line += chunk
            if end < 0 and len(line) - len(chunk) < _HEAD <= len(line):
                # Charged to the caller its token names before more is read (a connection may change
                # callers: a thread calling with two tokens).
                identified = conn.caller is not None
                self._identify_by_prefix(conn, bytes(line[:_HEAD]))
                if not identified and conn.caller is not None:
                    deadline = loop.time() + limits.idle_timeout
            del chunk
            if len(line) > _SMALL and not conn.holds_large and end < 0:
                if conn.caller is None:
                    raise _Refused(
                        self._too_large(
                            'a request over 64 KiB must start with its token ({"token": ...}), as '
                            "ToolRunner sends it"
                        )
                    )
                # Waiting here reads nothing more from this kernel's connection; it is not the kernel's
                # idle time.
                await self._callers[conn.caller].large.acquire()
                conn.holds_large = True
                deadline = loop.time() + limits.idle_timeout
            if end >= 0:
                return line

    async def _receive(self, conn: _Connection, deadline: float) -> bytes:
        conn.reading_until = deadline
        try:
            return await conn.reader.read(_CHUNK)
        except asyncio.CancelledError:
            if not conn.expired:
                raise  # `stop()`
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if conn.caller is None:
                why = f"no authenticated request within {self.limits.first_request_timeout:g} s of connecting"
            else:
                why = f"no request for {self.limits.idle_timeout:g} s"
            raise _Refused(
                error("idle_timeout", f"closed: {why}; nothing sent after the last answer was run")
            ) from None
        finally:
            conn.reading_until = None

    def _identify_by_prefix(self, conn: _Connection, head: bytes) -> None:
        match = _TOKEN_PREFIX.match(head)
        if match is None:
            return  # may still be a small request (a raw client's): authenticated once complete
        caller = self._authenticate(match.group(1).decode())
        if caller is None:
            raise _Refused(error("unauthorized", "the ipybox tool server rejected this kernel's token"))
        self._identify(conn, caller)

    def _too_large(self, why: str = "") -> dict[str, Any]:
        limit = self.limits.max_request_bytes
        size = f"{limit / MiB:g} MiB" if limit % (MiB // 16) == 0 else f"{limit} bytes"
        return error(
            "request_too_large",
            why
            or (
                f"a tool call's request (its arguments as JSON) may be {size} at most "
                "(the tool server's ChannelLimits.max_request_bytes): write large data to a file in the "
                "workspace and pass its path, or raise the limit"
            ),
        )

    # -- answering it

    async def _answer(self, conn: _Connection, line: bytearray) -> tuple[dict[str, Any], bool]:
        try:
            request = json.loads(line)
        except ValueError:
            return error("bad_request", "a request is one JSON object per line"), False
        if not isinstance(request, dict):
            return error("bad_request", "a request is one JSON object per line"), False
        token = request.pop("token", None)
        caller = self._authenticate(token) if isinstance(token, str) else None
        if caller is None:
            return error("unauthorized", "the ipybox tool server rejected this kernel's token"), False
        try:
            self._identify(conn, caller)
        except _Refused as refused:
            return refused.answer, False
        request["caller"] = caller
        handler = self._handlers.get(request.get("op", "run"))
        if handler is None:
            return error("bad_request", f"unknown op {request.get('op')!r}"), True
        try:
            return await handler(request), True
        except Exception as e:  # a bug must not hang the kernel: it gets an answer either way
            logger.exception("tool call failed unexpectedly")
            return error("internal_error", f"the tool server failed: {type(e).__name__}: {e}"), True
