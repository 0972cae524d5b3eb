"""`stdio_transport`: an MCP server process, spoken to in newline-delimited JSON-RPC over its stdin and
stdout, in the `(read, write)` stream shape `mcp.client.session.ClientSession` takes.

Why not the SDK's `mcp.client.stdio.stdio_client` (mcp 2.3.0), measured:

- It splits stdout with `(buffer + chunk).split("\\n")`, copying the whole pending line for every 64 KiB
  read: quadratic. A 10 MB tool result took 1.5 s, 20 MB 6.1 s (and 50 MB through `ipybox up` 112 s).
- It decodes stdout strictly as UTF-8 in its reader task: one invalid byte ends the reader, and every
  pending and later call on that server waits forever.
- A line pydantic's JSON parser refuses reaches the session as an exception, which it only logs: the
  request that line answered is never answered. Lone surrogates (`"\\ud800"`, valid JSON that servers in
  other languages send) are such lines.
- A message may be any size: it is all held in memory, several times over.

The contract here:

- Lines are split in linear time, and no more than `max_message_size` bytes of one are ever held: a longer
  message is read past, and the request it answers gets an error response at once (`data` holds
  `{"ipybox": "message_too_large", "size", "limit"}`). Its id is read from the start or the end of the
  line, where the Python and TypeScript SDKs write it.
- A line pydantic refuses is parsed again leniently: invalid UTF-8 and lone surrogates become U+FFFD.
  A line that still is not a JSON-RPC message gets the request it answers an error response; one whose
  request can't be told is handed to the session as an exception (logged), and the call's own timeout ends
  the wait (`MCPConnection`'s `call_timeout`).
- A request that can't be written (its arguments hold a lone surrogate, which has no UTF-8 form) is answered
  with an error at once, and the connection stays up: a kernel can't break a shared server with one.
- The process lifecycle is the SDK's: a process group of its own; on exit stdin is closed, the process gets
  2 s to exit, then its group SIGTERM and 2 s later SIGKILL, all inside a cancellation shield.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import IO, Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.client._transport import TransportStreams
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage
from pydantic_core import PydanticSerializationError

from ipybox.mcp_client.errors import one_line

logger = logging.getLogger(__name__)

MESSAGE_TOO_LARGE = "message_too_large"
"""`error.data["ipybox"]` of the error response that stands in for a message over the size limit."""

# Bytes asked of the pipe per read (asyncio hands over what it has buffered, up to this).
_CHUNK = 1024 * 1024
# Bytes kept from each end of a line read past, to find the id of the request it answers.
_EDGE = 4096
# Lines from this size on are parsed with `json.loads` (see `parse_message`).
_LARGE = 1024 * 1024
_EXIT_GRACE = 2.0
_KILL_GRACE = 2.0
_WRITER_FLUSH = 0.5
_POLL = 0.01

_ID = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
# Python SDK (pydantic field order): {"jsonrpc":"2.0","id":1,"result":...}
_ID_AT_START = re.compile(
    rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID + rb'\s*,\s*"(?:result|error)"'
)
# TypeScript SDK (JSON.stringify order): {"result":...,"jsonrpc":"2.0","id":1}
_ID_AT_END = re.compile(rb'"id"\s*:\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')
_RESPONSE_START = re.compile(rb'^\s*\{\s*"(?:result|error)"\s*:')


@asynccontextmanager
async def stdio_transport(
    command: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    errlog: IO[bytes],
    max_message_size: int,
    started: Callable[[int], None] | None = None,
) -> AsyncIterator[TransportStreams]:
    """Start `command` and yield the `(read, write)` streams of its MCP messages (see the module docstring).

    Args:
        command: Executable (looked up on the `PATH` of its environment).
        args: Its arguments.
        env: Extra environment variables, over the SDK's minimal safe environment (`HOME`, `PATH`, ...).
        cwd: Its working directory (default: the current one).
        errlog: Where its stderr goes (a real file).
        max_message_size: The largest message, in bytes, the server may send.
        started: Called with the process's pid once it started (e.g. to read its usage).

    Raises:
        OSError: The process could not be started (e.g. command not found).
    """
    process = await anyio.open_process(
        [command, *args],
        env=get_default_environment() | dict(env or {}),
        stderr=errlog,
        cwd=cwd,
        start_new_session=True,
    )
    if started is not None:
        started(process.pid)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def deliver(item: SessionMessage | Exception) -> None:
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await read_writer.send(item)

    async def read_stdout() -> None:
        assert process.stdout is not None
        lines = _Lines(max_message_size)
        try:
            async with read_writer:
                while True:
                    try:
                        chunk = await process.stdout.receive(_CHUNK)
                    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                        return
                    for item in lines.feed(chunk):
                        await read_writer.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the session is gone
        finally:
            # Keep reading, so a server flushing output on its way out never blocks on a full pipe.
            with anyio.CancelScope(shield=True), suppress(Exception):
                while True:
                    await process.stdout.receive(_CHUNK)

    async def write_stdin(tg: anyio.abc.TaskGroup) -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    try:
                        line = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode()
                    except (PydanticSerializationError, UnicodeError) as e:
                        refusal = _unwritable(message.message, e)
                        if refusal is not None:
                            tg.start_soon(deliver, refusal)  # not awaited here: the reader may be sending
                        continue
                    await process.stdin.send(line + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server closed its stdin (it may still run): end the session's reads, so no request waits
            # for an answer that can't come.
            await read_writer.aclose()
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_stdout)
        tg.start_soon(write_stdin, tg)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(_WRITER_FLUSH):
                    await writer_done.wait()
                await _stop(process)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
            tg.cancel_scope.cancel()


async def _stop(process: anyio.abc.Process) -> None:
    """Close stdin; if the server does not exit within the grace period, end its process group."""
    assert process.stdin is not None
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, _EXIT_GRACE):
        await terminate_posix_process_tree(process, _KILL_GRACE)
        if not await _exited(process, _KILL_GRACE):
            logger.warning("MCP server process %d is still alive after SIGKILL; leaving it", process.pid)
            # Its stdout may stay open: end the reader's read anyway.
            assert process.stdout is not None
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await process.stdout.aclose()
            return
    # Closes the pipes and reaps the process (it has exited: this returns at once).
    with anyio.move_on_after(_KILL_GRACE), suppress(OSError):
        await process.aclose()


async def _exited(process: anyio.abc.Process, timeout: float) -> bool:
    # Not process.wait(): it also waits for the pipes' EOF, which a child holding them would delay.
    with anyio.move_on_after(timeout):
        while process.returncode is None:  # noqa: ASYNC110 (returncode has no event to wait on)
            await anyio.sleep(_POLL)
    return process.returncode is not None


class _Lines:
    """Splits a byte stream into parsed messages in linear time, holding at most `limit` bytes of one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending = bytearray()
        # A line over the limit being read past: its size so far, its first and last bytes.
        self._skipped = 0
        self._head = b""
        self._tail = b""

    def feed(self, chunk: bytes) -> list[SessionMessage | Exception]:
        items: list[SessionMessage | Exception] = []
        view = memoryview(chunk)
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(view[start:end])
            if self._skipped:
                items.append(_too_large(self._head, self._tail, self._skipped, self.limit))
                self._skipped, self._head, self._tail = 0, b"", b""
            elif self._pending and not self._pending.isspace():
                items.append(parse_message(self._pending))
            self._pending = bytearray()
            start = end + 1
        self._add(view[start:])
        return items

    def _add(self, data: memoryview) -> None:
        if not data:
            return
        if self._skipped:
            self._skipped += len(data)
            self._tail = (self._tail + bytes(data[-_EDGE:]))[-_EDGE:]
        elif len(self._pending) + len(data) > self.limit:
            held = self._pending
            self._skipped = len(held) + len(data)
            self._head = (bytes(held[:_EDGE]) + bytes(data[:_EDGE]))[:_EDGE]
            self._tail = (bytes(held[-_EDGE:]) + bytes(data[-_EDGE:]))[-_EDGE:]
            self._pending = bytearray()  # what was held goes at once
        else:
            self._pending += data


def parse_message(line: bytes | bytearray) -> SessionMessage | Exception:
    """One line of a server's stdout as a message (see the module docstring for the lenient second try).

    A small line goes to pydantic's JSON parser first (11 us for a typical answer, against 29 us the other
    way). A large one goes to `json.loads` and is then validated as Python objects: for 50 MB of text
    0.16 s and no memory beyond the line and the value, where pydantic's parser takes 0.31 s and 200 MB more
    for a moment.
    """
    if len(line) < _LARGE:
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError:
            pass
    try:
        try:
            value = json.loads(line)
        except UnicodeDecodeError:
            value = json.loads(line.decode("utf-8", "replace"))
        value = without_lone_surrogates(value)
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(value, by_name=False))
    except (ValueError, RecursionError) as e:
        problem = one_line(str(e), 300)
    request_id = _request_id(line[:_EDGE], line[-_EDGE:])
    if request_id is None:
        logger.warning("an MCP server sent a line that is not a JSON-RPC message: %s", problem)
        return ValueError(f"the server sent a line that is not a JSON-RPC message: {problem}")
    return _error_response(
        request_id, types.PARSE_ERROR, f"the server's answer is not a valid JSON-RPC message: {problem}"
    )


def without_lone_surrogates(value: Any) -> Any:
    """`value` (parsed JSON) with each lone surrogate in its strings replaced by U+FFFD."""
    if isinstance(value, str):
        if value.isascii():  # constant time: the common case costs nothing
            return value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # Pairs were joined by the JSON parser already: what is left are lone halves.
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_lone_surrogates(item) for item in value]
    return value


def _request_id(head: bytes | bytearray, tail: bytes | bytearray) -> int | str | None:
    """The id of the request a (response) line answers, from its first and last bytes; `None` when it
    can't be told, or the line is a request of the server's own (whose id is in another id space)."""
    match = _ID_AT_START.match(head)
    if match is None and _RESPONSE_START.match(head):
        match = _ID_AT_END.search(tail)
    if match is None:
        return None
    request_id: int | str = json.loads(bytes(match.group(1)))
    return request_id


def _too_large(head: bytes, tail: bytes, size: int, limit: int) -> SessionMessage | Exception:
    request_id = _request_id(head, tail)
    message = f"the server sent a message of {size} bytes, over the limit of {limit} bytes"
    if request_id is None:
        logger.warning("%s; it answers no request that can be told, so it was dropped", message)
        return ValueError(message)
    return _error_response(
        request_id, types.INTERNAL_ERROR, message, {"ipybox": MESSAGE_TOO_LARGE, "size": size, "limit": limit}
    )


def _unwritable(message: types.JSONRPCMessage, error: Exception) -> SessionMessage | None:
    problem = one_line(str(error), 300)
    if isinstance(message, types.JSONRPCRequest):
        return _error_response(
            message.id,
            types.INVALID_PARAMS,
            f"the request can't be sent: it is not valid Unicode (e.g. a lone surrogate): {problem}",
        )
    logger.warning("dropped a message to an MCP server that can't be encoded: %s", problem)
    return None


def _error_response(
    request_id: int | str, code: int, message: str, data: dict[str, Any] | None = None
) -> SessionMessage:
    error = types.ErrorData(code=code, message=message, data=data)
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
