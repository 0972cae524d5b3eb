"""A long-lived connection to one MCP server, over stdio, streamable HTTP or SSE.

The `mcp` SDK's transports and `ClientSession` are anyio context managers whose task groups must be
entered and left by the same task, and which raise `ExceptionGroup`s. `MCPConnection` therefore runs
them in a task of its own, so `start()` and `stop()` may be called from any task, and turns every
failure into one [MCPServerError][ipybox.mcp_client.errors.MCPServerError] with a one-line message.

Example:
    ```python
    async with MCPConnection("time", {"command": "mcp-server-time"}) as conn:
        tools = await conn.list_tools()
        result = await conn.call_tool("get_current_time", {"timezone": "UTC"})
    ```
"""

from __future__ import annotations

import asyncio
import errno
import math
import tempfile
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TextIO, TypeVar, cast

import anyio
import httpx2
import mcp_types as types
from mcp.client._transport import TransportStreams
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from ipybox.mcp_client.errors import (
    MCPServerError,
    ServerConnectError,
    ServerNotRunningError,
    ServerStartError,
    ServerTimeoutError,
    ToolCallError,
    one_line,
)
from ipybox.mcp_client.params import HttpServerParams, ServerParams, StdioServerParams, parse_server_params
from ipybox.sandbox.policy import SandboxPolicy

_T = TypeVar("_T")

_STDERR_TAIL_LINES = 5
_STDERR_TAIL_BYTES = 4096


class MCPConnection:
    """A connection to one MCP server, safe for many concurrent calls.

    Args:
        server_name: Name of the server, used in every error message.
        server_params: Parsed [ServerParams][ipybox.mcp_client.params.ServerParams], or a raw
            `server_params` dict (then parsed with `environ` and `dotenv_path`).
        connect_timeout: Seconds allowed for starting or reaching the server and completing the MCP
            handshake.
        environ: Environment for `${VAR}` placeholders in a raw dict; defaults to `os.environ`.
        dotenv_path: `.env` file for placeholders missing from `environ`.

    Raises:
        ServerParamsError: A raw `server_params` dict is invalid.
    """

    def __init__(
        self,
        server_name: str,
        server_params: ServerParams | Mapping[str, Any],
        *,
        connect_timeout: float = 30,
        environ: Mapping[str, str] | None = None,
        dotenv_path: Path | None = None,
    ) -> None:
        if not isinstance(server_params, StdioServerParams | HttpServerParams):
            server_params = parse_server_params(
                server_name, server_params, environ=environ, dotenv_path=dotenv_path
            )
        self.server_name = server_name
        self.params: ServerParams = server_params
        self.connect_timeout = connect_timeout
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._failure: MCPServerError | None = None
        self._output_schemas: dict[str, dict[str, Any] | None] = {}
        # The streamable HTTP transport turns HTTP errors into JSON-RPC errors without the status:
        # the responses are recorded here to report them.
        self._http_errors: list[httpx2.Response] = []

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        """Whether the connection is up and usable."""
        return self._session is not None

    async def start(self) -> None:
        """Start (or reach) the server and complete the MCP handshake.

        Raises:
            ServerStartError: The command was not found, or the server exited at once.
            ServerConnectError: The server refused the connection or answered with an HTTP error.
            ServerTimeoutError: No completed handshake within `connect_timeout`.
        """
        if self._task is not None:
            raise RuntimeError(f"MCP server {self.server_name!r}: connection already started")
        self._ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(self._ready), name=f"mcp-connection-{self.server_name}")
        try:
            await asyncio.shield(self._ready)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close the connection; a stdio server process is stopped (its whole process group).

        Idempotent, and safe to call while `start()` is still waiting for the handshake.
        """
        task = self._task
        if task is None:
            return
        self._stop.set()
        if self._scope is not None and not (self._ready is not None and self._ready.done()):
            self._scope.cancel()
        # The transport's own shutdown is bounded (stdio: stdin close, SIGTERM, SIGKILL), so waiting
        # for it here cannot hang.
        await asyncio.shield(task)
        self._session = None

    async def list_tools(self) -> list[types.Tool]:
        """All tools of the server, following pagination."""
        session = self._require_session()
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
            result = await self._request(session.list_tools(params=params), "listing tools")
            tools.extend(result.tools)
            cursor = result.next_cursor
            if not cursor:
                break
        for tool in tools:
            self._output_schemas[tool.name] = tool.output_schema
        return tools

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> types.CallToolResult:
        """Call a tool and return its result as is (an `is_error` result is returned, not raised).

        Args:
            name: Tool name.
            arguments: Tool arguments.
            timeout: Seconds to wait for the result; `None` waits as long as the server takes.

        Raises:
            ToolCallError: The server rejected the call (e.g. unknown tool, invalid structured output).
            ServerConnectError: The connection was lost.
            ServerTimeoutError: No result within `timeout`.
        """
        session = self._require_session()
        call = session.call_tool(name, dict(arguments or {}), read_timeout_seconds=timeout)
        return await self._request(call, f"calling tool {name!r}", tool_name=name)

    def output_schema(self, tool_name: str) -> dict[str, Any] | None:
        """The output schema of a tool, as of the last `list_tools()` (`None` if it has none or was
        never listed)."""
        return self._output_schemas.get(tool_name)

    def _require_session(self) -> ClientSession:
        if self._session is None:
            if self._failure is not None:
                raise self._failure
            raise ServerNotRunningError(self.server_name, "the connection is not started")
        return self._session

    async def _request(self, request: Awaitable[_T], what: str, tool_name: str | None = None) -> _T:
        try:
            return await request
        except MCPError as e:
            if e.code == types.CONNECTION_CLOSED or self._failure is not None:
                raise self._failure or ServerConnectError(
                    self.server_name, f"connection lost while {what}: {e.message}"
                ) from None
            if e.code == types.REQUEST_TIMEOUT:
                raise ServerTimeoutError(self.server_name, f"no answer while {what}: {e.message}") from None
            if tool_name is not None:
                raise ToolCallError(self.server_name, tool_name, e.message) from None
            raise MCPServerError(self.server_name, f"error while {what}: {e.message}") from None
        except RuntimeError as e:
            # The SDK raises RuntimeError for structured content that does not match the output schema.
            if tool_name is not None:
                raise ToolCallError(self.server_name, tool_name, str(e)) from None
            raise MCPServerError(self.server_name, f"error while {what}: {e}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            raise self._failure or ServerConnectError(
                self.server_name, f"connection lost while {what}"
            ) from None

    async def _run(self, ready: asyncio.Future[None]) -> None:
        stderr = self._stderr_file()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                scope.deadline = anyio.current_time() + self.connect_timeout
                async with AsyncExitStack() as stack:
                    read, write = await stack.enter_async_context(self._transport(stderr))
                    session = await stack.enter_async_context(ClientSession(read, write))
                    await session.initialize()
                    scope.deadline = math.inf
                    self._session = session
                    ready.set_result(None)
                    await self._stop.wait()
            if scope.cancelled_caught and not ready.done() and not self._stop.is_set():
                raise ServerTimeoutError(
                    self.server_name,
                    f"no completed MCP handshake within {self.connect_timeout:g} s" + _tail(stderr),
                )
        except BaseException as e:  # every failure is reported through the error types
            error = self._translate(e, stderr)
            if error is None:
                raise
            self._failure = error
            if not ready.done():
                ready.set_exception(error)
        finally:
            self._session = None
            self._scope = None
            if not ready.done():
                ready.set_exception(ServerNotRunningError(self.server_name, "the connection was stopped"))
            if stderr is not None:
                stderr.close()

    def _stderr_file(self) -> IO[bytes] | None:
        if isinstance(self.params, StdioServerParams):
            # A real file: the server process writes to it directly, and its tail explains a failed start.
            return tempfile.TemporaryFile("w+b")
        return None

    def _transport(self, stderr: IO[bytes] | None) -> AbstractAsyncContextManager[TransportStreams]:
        params = self.params
        if isinstance(params, StdioServerParams):
            assert stderr is not None
            if (policy := params.sandbox_policy()) is not None:
                return _sandboxed_stdio(params, policy, stderr)
            stdio = StdioServerParameters(
                command=params.command, args=params.args, env=params.env or None, cwd=params.cwd
            )
            # stdio_client only needs a file descriptor to hand to the process.
            return stdio_client(stdio, errlog=cast(TextIO, stderr))
        if params.transport == "sse":
            return sse_client(params.url, headers=params.headers or None, timeout=self.connect_timeout)
        return _streamable_http(params, self.connect_timeout, self._http_errors)

    def _translate(self, exc: BaseException, stderr: IO[bytes] | None) -> MCPServerError | None:
        """The one error to report for `exc` (an exception group is searched for its cause), or `None`
        for a cancellation that must propagate."""
        leaves = _leaves(exc)
        for leaf in leaves:
            if isinstance(leaf, MCPServerError):
                return leaf
        name, params = self.server_name, self.params
        for leaf in leaves:
            if (
                isinstance(params, StdioServerParams)
                and isinstance(leaf, OSError)
                and leaf.filename is not None
            ):
                reason = "command not found" if leaf.errno == errno.ENOENT else (leaf.strerror or str(leaf))
                return ServerStartError(name, f"cannot start {params.command!r}: {reason}")
            if isinstance(leaf, httpx2.HTTPStatusError):
                return _http_status_error(name, leaf.response)
            if isinstance(leaf, httpx2.ConnectError):
                url = params.url if isinstance(params, HttpServerParams) else ""
                return ServerConnectError(name, f"cannot connect to {url}: {_connect_reason(leaf)}")
            if isinstance(leaf, httpx2.TimeoutException):
                return ServerTimeoutError(name, f"timed out: {type(leaf).__name__}")
            if isinstance(leaf, MCPError):
                if self._http_errors:
                    return _http_status_error(name, self._http_errors[-1])
                if isinstance(params, StdioServerParams):
                    return ServerStartError(
                        name,
                        f"{params.command!r} exited or closed stdout before completing the MCP handshake"
                        + _tail(stderr),
                    )
                return ServerConnectError(name, f"MCP handshake failed: {leaf.message}")
        interesting = [leaf for leaf in leaves if not isinstance(leaf, asyncio.CancelledError)]
        if not interesting:
            return None
        leaf = interesting[0]
        return ServerConnectError(name, f"{type(leaf).__name__}: {leaf}" + _tail(stderr))


@asynccontextmanager
async def _sandboxed_stdio(
    params: StdioServerParams, policy: SandboxPolicy, stderr: IO[bytes]
) -> AsyncIterator[TransportStreams]:
    from ipybox.sandbox.command import sandboxed

    workspace = Path(params.cwd) if params.cwd else Path.cwd()
    async with sandboxed([params.command, *params.args], policy, workspace) as argv:
        stdio = StdioServerParameters(command=argv[0], args=argv[1:], env=params.env or None, cwd=params.cwd)
        async with stdio_client(stdio, errlog=cast(TextIO, stderr)) as streams:
            yield streams


@asynccontextmanager
async def _streamable_http(
    params: HttpServerParams, timeout: float, http_errors: list[httpx2.Response]
) -> AsyncIterator[TransportStreams]:
    async def record(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            http_errors.append(response)

    # Read timeout stays long: a tool call may legitimately take minutes.
    client = httpx2.AsyncClient(
        headers=params.headers or None,
        timeout=httpx2.Timeout(timeout, read=300),
        event_hooks={"response": [record]},
    )
    async with client, streamable_http_client(params.url, http_client=client) as streams:
        yield streams


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _http_status_error(server_name: str, response: httpx2.Response) -> ServerConnectError:
    status, url = response.status_code, str(response.request.url)
    hint = {
        401: "check the credentials (e.g. the Authorization header)",
        403: "check the credentials and their permissions",
        404: "check the URL (streamable HTTP servers usually serve /mcp, SSE servers /sse)",
    }.get(status, "")
    reason = response.reason_phrase or ""
    return ServerConnectError(
        server_name, f"HTTP {status} {reason} from {url}" + (f": {hint}" if hint else "")
    )


def _connect_reason(error: BaseException) -> str:
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError) or "refused" in str(cause).lower():
            return "connection refused (is the server running?)"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    return one_line(str(error))


def _tail(stderr: IO[bytes] | None) -> str:
    if stderr is None:
        return ""
    try:
        stderr.flush()
        size = stderr.seek(0, 2)
        stderr.seek(max(0, size - _STDERR_TAIL_BYTES))
        text = stderr.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()][-_STDERR_TAIL_LINES:]
    return f"; stderr: {' | '.join(lines)}" if lines else "; no stderr output"
