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
- `{"op": "reset"}`: stop all started MCP servers (they start again on their next call).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ipybox.rules.calls import ToolCall

logger = logging.getLogger(__name__)

# A request line holds tool arguments, which may be whole file contents.
MAX_LINE = 256 * 1024 * 1024

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


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


class CallChannel:
    """Serves tool-call requests from kernels on a Unix socket or a loopback TCP port.

    Args:
        authenticate: The identity a token stands for, or `None` for a token that is not valid.
        handlers: The handler of each `op`; it gets the request and returns the answer.
    """

    def __init__(self, authenticate: Callable[[str], str | None], handlers: dict[str, Handler]) -> None:
        self._authenticate = authenticate
        self._handlers = handlers
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._unix_socket: Path | None = None
        self.address: str | None = None

    async def start(self, *, unix_socket: Path | None = None, host: str = "127.0.0.1") -> str:
        """Listen on `unix_socket` (mode 0600), else on a free loopback port; returns the address kernels
        use (`unix:PATH` or `tcp://HOST:PORT`)."""
        if unix_socket is not None:
            self._server = await asyncio.start_unix_server(self._serve, str(unix_socket), limit=MAX_LINE)
            os.chmod(unix_socket, 0o600)
            self._unix_socket = unix_socket
            self.address = f"unix:{unix_socket}"
        else:
            self._server = await asyncio.start_server(self._serve, host, 0, limit=MAX_LINE)
            port = self._server.sockets[0].getsockname()[1]
            self.address = f"tcp://{host}:{port}"
        return self.address

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        if self._unix_socket is not None:
            self._unix_socket.unlink(missing_ok=True)
        self._server, self._unix_socket, self.address = None, None, None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while line := await reader.readline():
                answer, keep_open = await self._answer(line)
                writer.write(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
                await writer.drain()
                if not keep_open:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the kernel went away (restarted, interrupted mid-call): nothing to answer
        except ValueError:  # a line longer than MAX_LINE
            with contextlib.suppress(ConnectionError):
                writer.write(json.dumps(error("bad_request", "request too large")).encode() + b"\n")
                await writer.drain()
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, line: bytes) -> tuple[dict[str, Any], bool]:
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
        request["caller"] = caller
        handler = self._handlers.get(request.get("op", "run"))
        if handler is None:
            return error("bad_request", f"unknown op {request.get('op')!r}"), True
        try:
            return await handler(request), True
        except Exception as e:  # a bug must not hang the kernel: it gets an answer either way
            logger.exception("tool call failed unexpectedly")
            return error("internal_error", f"the tool server failed: {type(e).__name__}: {e}"), True
