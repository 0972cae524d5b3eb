"""The stdio wire of `ipybox mcp`: the process's stdin and stdout as asyncio pipes.

mcp's own stdio transport reads and writes through a worker thread (`anyio.wrap_file`), three thread
hand-offs per request and reply; on pipes the event loop can do that itself, which halves a round trip
(a ping: 0.9 ms -> 0.4 ms). The wire also moves off fds 0 and 1 as soon as the process starts, so no child
(gateway, MCP servers, bridges) inherits it: stray output cannot corrupt the protocol and the client sees
EOF as soon as this process exits.

A message whose JSON escapes a lone surrogate (`"\\ud800"`: valid JSON, which a client in JavaScript sends
for a string holding one) is read with U+FFFD in its place, as `ipybox.mcp_client.stdio_transport` reads
servers' answers: mcp's parser refuses it, and mcp then drops the message and never answers its request.
Invalid UTF-8 becomes U+FFFD too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from ipybox.mcp_client.stdio_transport import without_lone_surrogates

# A JSON-RPC message is one line; a cell's code or a registration can be large, so lines may be too.
MAX_LINE = 256 * 1024 * 1024

# A JSON escape of a surrogate, paired or not: only lines with one are looked at again.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass
class Wire:
    """The private descriptors of the client's pipes, after fds 0 and 1 were moved off them."""

    read_fd: int
    write_fd: int


def _is_streamable(fd: int) -> bool:
    # Pipes and sockets only. asyncio can't serve a regular file (`ipybox mcp < requests.jsonl`), and it
    # would leave a terminal non-blocking for the shell after us (the flag belongs to the terminal's open
    # file, which the shell shares): both are left to mcp's transport.
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def claim_wire() -> Wire | None:
    """Move the client's pipes off fds 0 and 1 (stdin reads EOF, stdout goes to stderr); `None` when they
    are not pipes or sockets and mcp's own transport should serve them in place."""
    try:
        if not (_is_streamable(0) and _is_streamable(1)):
            return None
    except OSError:
        return None
    wire = Wire(fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3), fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3))
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    os.dup2(2, 1)
    return wire


class _Lines:
    """Incoming messages, one per line, as mcp's transport iterates them."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        try:
            line = await self._reader.readline()
        except (ConnectionError, ValueError):  # the client went away, or sent a line past MAX_LINE
            raise StopAsyncIteration from None
        if not line:
            raise StopAsyncIteration
        text = line.decode("utf-8", errors="replace")
        return _without_lone_surrogate_escapes(text) if _SURROGATE_ESCAPE.search(line) else text


def _without_lone_surrogate_escapes(line: str) -> str:
    """`line` with the lone surrogates its JSON escapes replaced by U+FFFD; as it is when not JSON (mcp
    reports that as before)."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return line
    return json.dumps(without_lone_surrogates(value), ensure_ascii=False, separators=(",", ":")) + "\n"


class _Out:
    """Outgoing messages; `flush()` waits only while the client is slow to read."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        if self._writer.is_closing():
            raise anyio.ClosedResourceError  # mcp's writer ends quietly on this: the client is gone
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError:
            raise anyio.ClosedResourceError from None


@asynccontextmanager
async def wire_streams(wire: Wire) -> AsyncIterator[tuple[_Lines, _Out]]:
    """The wire as the `stdin`/`stdout` pair `mcp.server.stdio.stdio_server` takes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire.read_fd, "rb", buffering=0)
    )
    write_transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire.write_fd, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    try:
        yield _Lines(reader), _Out(writer)
    finally:
        read_transport.close()
        if not write_transport.is_closing():
            # What was written reaches the client before the pipe closes (unless it stopped reading).
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.drain(), timeout=5)
        write_transport.close()
