"""A long-lived connection to one MCP server, over stdio, streamable HTTP or SSE.

The `mcp` SDK's transports and `ClientSession` are anyio context managers whose task groups must be
entered and left by the same task, and which raise `ExceptionGroup`s. `MCPConnection` therefore runs
them in a task of its own, so `start()` and `stop()` may be called from any task, and turns every
failure into one [MCPServerError][ipybox.mcp_client.errors.MCPServerError] with a one-line message. That
task belongs to the task group of a `Service` (`ipybox.lifecycle`) that `start()` makes: `stop()` ends it
in order (the transport's own shutdown), then closes the group, which waits until the task ended.

Every tool call is bounded, and every one is answered:

- In time: `call_timeout` (the server's own, else the connection's). On expiry the call raises
  `CallTimeoutError`; the SDK sends the server `notifications/cancelled` for it and drops a late answer.
  The connection stays up: it is shared by other calls (other sessions' too), which a restart would fail,
  and a server that ignores the cancellation only keeps its own work running.
- In size: `max_result_size` (the server's own, else the connection's). Over stdio the answer is read past
  without being held (see `ipybox.mcp_client.stdio_transport`, which also answers lines the SDK would leave
  unanswered: lone surrogates, invalid UTF-8); over HTTP it is checked once read. Either way the call raises
  `ResultTooLargeError` and the connection stays up.

A stdio server with `limits` runs inside them ([Limiter][ipybox.limits.limiter.Limiter]): each start opens
a limiter of its own (a limit this machine can't enforce fails the start with `ServerStartError`, naming
it), its command line joins its control group and takes its rlimits before it runs (outside the sandbox's:
bubblewrap and everything under it are in the group), and when it stops everything left in the group is
killed and the group removed: a server can't leave processes behind, not even ones that left its process
group. A server the out-of-memory killer ended for going over its memory limit fails the call that was
running (or its start) with `ServerMemoryLimitError`, naming the limit and the peak, rather than "connection
lost"; the group's counters are read before it is removed, so the start's error can say so too.

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
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp.client._transport import TransportStreams
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from ipybox.lifecycle import Service
from ipybox.limits import Limited, Limiter, LimitUnavailableError, Usage
from ipybox.mcp_client.errors import (
    CallTimeoutError,
    MCPServerError,
    ResultTooLargeError,
    ServerConnectError,
    ServerMemoryLimitError,
    ServerNotRunningError,
    ServerStartError,
    ServerTimeoutError,
    ToolCallError,
    one_line,
)
from ipybox.mcp_client.params import (
    DEFAULT_MAX_RESULT_SIZE,
    HttpServerParams,
    ServerParams,
    StdioServerParams,
    parse_server_params,
)
from ipybox.mcp_client.stdio_transport import MESSAGE_TOO_LARGE, parse_message, stdio_transport

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
        call_timeout: Seconds a tool call waits for its answer when the server's parameters set no
            `call_timeout`; `None`: as long as the server takes.
        max_result_size: The largest message (tool answer) in bytes when the server's parameters set no
            `max_result_size`.
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
        call_timeout: float | None = None,
        max_result_size: int = DEFAULT_MAX_RESULT_SIZE,
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
        # The server's own limits win over the connection's defaults.
        self.call_timeout = server_params.call_timeout or call_timeout
        self.max_result_size = int(server_params.max_result_size or max_result_size)
        self._session: ClientSession | None = None
        # What the server said its version is when it started (`serverInfo.version`): `ipybox.lock` pins it.
        self.server_version: str | None = None
        self._tasks: Service | None = None  # the group `_task` runs in (`start()` makes it)
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._failure: MCPServerError | None = None
        self._output_schemas: dict[str, dict[str, Any] | None] = {}
        # The streamable HTTP transport turns HTTP errors into JSON-RPC errors without the status:
        # the responses are recorded here to report them.
        self._http_errors: list[httpx2.Response] = []
        # A stdio server's limits while it runs, its pid, and what it had used when it ended.
        self._limited: Limited | None = None
        self._pid: int | None = None
        self._last_usage: Usage | None = None

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
        self._tasks = Service(f"MCP connection {self.server_name!r}")
        await self._tasks.start()
        self._task = self._tasks.spawn(self._run(self._ready), name=f"mcp-connection-{self.server_name}")
        try:
            await asyncio.shield(self._ready)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close the connection; a stdio server process is stopped (its whole process group).

        Idempotent, and safe to call while `start()` is still waiting for the handshake. A caller cancelled
        while it waits sees its cancellation; the connection still ends on its own, and a later `stop()`
        finishes.
        """
        task = self._task
        if task is None:
            return
        self._stop.set()
        if self._scope is not None and not (self._ready is not None and self._ready.done()):
            self._scope.cancel()
        # The transport's own shutdown is bounded (stdio: stdin close, SIGTERM, SIGKILL), so waiting
        # for it here cannot hang. Shielded: a caller cancelled meanwhile leaves it to finish on its own.
        await asyncio.shield(task)
        self._session = None
        if self._tasks is not None:
            await self._tasks.aclose()  # `task` has ended: this only ends the group's host

    async def list_tools(self) -> list[types.Tool]:
        """All tools of the server, following pagination.

        Raises:
            ServerTimeoutError: A page did not come within `call_timeout` (a server that answers the
                handshake but not this would otherwise hold everyone waiting for it to start).
        """
        session = self._require_session()
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
            try:
                async with asyncio.timeout(self.call_timeout):
                    result = await self._request(session.list_tools(params=params), "listing tools")
            except TimeoutError:
                raise ServerTimeoutError(
                    self.server_name,
                    f"did not list its tools within {self.call_timeout:g} s (its call_timeout)",
                ) from None
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
            timeout: Seconds to wait for the result; `None`: the connection's `call_timeout` (when that
                is `None` too, as long as the server takes).

        Raises:
            ToolCallError: The server rejected the call (e.g. unknown tool, invalid structured output).
            ServerConnectError: The connection was lost.
            CallTimeoutError: No result within the timeout (the call was cancelled on the server).
            ResultTooLargeError: The result was larger than `max_result_size`.
        """
        session = self._require_session()
        if (where := _lone_surrogate(arguments or {}, "")) is not None:
            # It has no UTF-8 form: no transport could send it (the SDK's writers would fail mid-stream).
            raise ToolCallError(
                self.server_name,
                name,
                f"argument {where or 'value'} holds a lone surrogate (such as '\\ud800'), which is not valid "
                "Unicode and can't be sent: remove it (e.g. text.encode('utf-8', 'replace').decode())",
            )
        timeout = timeout if timeout is not None else self.call_timeout
        call = session.call_tool(name, dict(arguments or {}), read_timeout_seconds=timeout)
        result = await self._request(call, f"calling tool {name!r}", tool_name=name, timeout=timeout)
        if not isinstance(self.params, StdioServerParams):
            # Over stdio the transport enforced it before anything was held.
            size = _result_size(result)
            if size > self.max_result_size:
                raise ResultTooLargeError(self.server_name, name, size, self.max_result_size)
        return result

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

    async def _request(
        self, request: Awaitable[_T], what: str, tool_name: str | None = None, timeout: float | None = None
    ) -> _T:
        try:
            return await request
        except MCPError as e:
            if tool_name is not None and (match := _SSE_EVENT_TOO_LARGE.search(e.message)):
                # The SDK abandons the request with CONNECTION_CLOSED, but the connection is fine.
                raise ResultTooLargeError(self.server_name, tool_name, None, int(match.group(1))) from None
            if e.code == types.CONNECTION_CLOSED or self._failure is not None:
                raise (
                    self._failure
                    or self._memory_kill()
                    or ServerConnectError(self.server_name, f"connection lost while {what}: {e.message}")
                ) from None
            if e.code == types.REQUEST_TIMEOUT:
                if tool_name is not None and timeout is not None:
                    raise CallTimeoutError(self.server_name, tool_name, timeout) from None
                raise ServerTimeoutError(self.server_name, f"no answer while {what}: {e.message}") from None
            if isinstance(e.data, dict) and e.data.get("ipybox") == MESSAGE_TOO_LARGE:
                size, limit = int(e.data.get("size", 0)), int(e.data.get("limit", 0))
                if tool_name is not None:
                    raise ResultTooLargeError(self.server_name, tool_name, size, limit) from None
                raise MCPServerError(
                    self.server_name,
                    f"the answer while {what} was {size} bytes, over the limit of {limit} bytes "
                    "(max_result_size)",
                ) from None
            if tool_name is not None:
                raise ToolCallError(self.server_name, tool_name, e.message) from None
            raise MCPServerError(self.server_name, f"error while {what}: {e.message}") from None
        except RuntimeError as e:
            # The SDK raises RuntimeError for structured content that does not match the output schema.
            if tool_name is not None:
                raise ToolCallError(self.server_name, tool_name, str(e)) from None
            raise MCPServerError(self.server_name, f"error while {what}: {e}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            raise (
                self._failure
                or self._memory_kill()
                or ServerConnectError(self.server_name, f"connection lost while {what}")
            ) from None

    def _memory_kill(self) -> ServerMemoryLimitError | None:
        """The error for a stdio server the out-of-memory killer ended for going over its memory limit
        (read from its group while it runs, else from what it had used when it ended); `None` otherwise."""
        limits = self.params.limits if isinstance(self.params, StdioServerParams) else None
        if limits is None or limits.memory is None:
            return None
        limited = self._limited
        usage = limited.usage(self._pid) if limited is not None else self._last_usage
        if usage is None or not usage.oom_kills:
            return None
        return ServerMemoryLimitError(self.server_name, int(limits.memory), usage.memory_peak)

    async def _run(self, ready: asyncio.Future[None]) -> None:
        stderr = self._stderr_file()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                scope.deadline = anyio.current_time() + self.connect_timeout
                async with AsyncExitStack() as stack:
                    read, write = await stack.enter_async_context(self._transport(stderr))
                    session = await stack.enter_async_context(ClientSession(read, write))
                    initialized = await session.initialize()
                    self.server_version = initialized.server_info.version
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
            return self._stdio(params, stderr)
        if params.transport == "sse":
            return _reparsing(
                sse_client(params.url, headers=params.headers or None, timeout=self.connect_timeout)
            )
        # The HTTP read timeout must not end a call its call_timeout still allows.
        read_timeout = max(300, self.call_timeout + 30) if self.call_timeout is not None else 300
        return _streamable_http(
            params, self.connect_timeout, read_timeout, self.max_result_size, self._http_errors
        )

    @asynccontextmanager
    async def _stdio(self, params: StdioServerParams, stderr: IO[bytes]) -> AsyncIterator[TransportStreams]:
        """The stdio server's process: in its sandbox, if it has one, inside its limits, if it has any."""
        policy, limits = params.sandbox_policy(), params.limits
        limiter: Limiter | None = None
        if limits is not None and limits.any:
            try:
                # Off the event loop: it may wait for the groups of a host that died to empty. Shielded: a
                # parent group made for a start cancelled meanwhile must come back to be closed below.
                with anyio.CancelScope(shield=True):
                    limiter = await anyio.to_thread.run_sync(
                        partial(
                            Limiter.open,
                            limits,
                            sandboxed=policy is not None,
                            private_tmp=sys.platform.startswith("linux"),  # macOS's sandbox has none
                            source=f"[servers.{self.server_name}.limits]",
                        )
                    )
            except LimitUnavailableError as e:
                raise ServerStartError(self.server_name, str(e)) from None
            except OSError as e:
                raise ServerStartError(
                    self.server_name, f"cannot make the control group of its limits: {e}"
                ) from None
        limited: Limited | None = None
        try:
            async with AsyncExitStack() as stack:
                argv = [params.command, *params.args]
                if policy is not None:
                    if limiter is not None:
                        argv = limiter.sandbox_argv(argv)
                    from ipybox.sandbox.command import sandboxed

                    workspace = Path(params.cwd) if params.cwd else Path.cwd()
                    tmp_size = int(limits.tmp) if limits is not None and limits.tmp is not None else None
                    argv = await stack.enter_async_context(
                        sandboxed(argv, policy, workspace, tmp_size=tmp_size)
                    )
                if limiter is not None:
                    if policy is None:
                        _check_command(params)  # else the wrapper's shell would only say so on stderr
                    try:
                        limited = limiter.start("server")
                    except OSError as e:
                        raise ServerStartError(
                            self.server_name, f"cannot set the limits of its control group: {e}"
                        ) from None
                    # Outermost, so bubblewrap (and the network bridge under it) are limited too.
                    argv = limited.argv(argv, sandboxed=policy is not None)
                    self._limited = limited
                yield await stack.enter_async_context(
                    stdio_transport(
                        argv[0],
                        argv[1:],
                        env=params.env,
                        cwd=params.cwd,
                        errlog=stderr,
                        max_message_size=self.max_result_size,
                        started=self._started,
                    )
                )
        finally:
            # The transport has stopped the process; what is left of its tree goes with the group.
            with anyio.CancelScope(shield=True):
                if limited is not None:
                    self._last_usage = limited.usage(self._pid)
                    self._limited = None
                    await anyio.to_thread.run_sync(limited.release)
                if limiter is not None:
                    await anyio.to_thread.run_sync(limiter.close)

    def _started(self, pid: int) -> None:
        self._pid = pid

    def _translate(self, exc: BaseException, stderr: IO[bytes] | None) -> MCPServerError | None:
        """The one error to report for `exc` (an exception group is searched for its cause), or `None`
        for a cancellation that must propagate."""
        leaves = _leaves(exc)
        for leaf in leaves:
            if isinstance(leaf, MCPServerError):
                return leaf
        # Killed for its memory while starting: whatever broke next (the handshake, a pipe) is not news.
        cancelled = all(isinstance(leaf, asyncio.CancelledError) for leaf in leaves)
        if not cancelled and (killed := self._memory_kill()) is not None:
            return killed
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
async def _reparsing(
    transport: AbstractAsyncContextManager[TransportStreams],
) -> AsyncIterator[TransportStreams]:
    """`transport`'s streams, with the messages its parser refused parsed again as over stdio (lone
    surrogates and invalid UTF-8 become U+FFFD; a message that still is not JSON-RPC answers its request
    with an error): the SSE client hands the session such a message as an exception, which the session only
    logs, and the request it answered would never be answered."""
    async with transport as (read, write):
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def forward() -> None:
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):  # the session is gone
                async with send:
                    async for item in read:
                        await send.send(_reparsed(item))

        async with anyio.create_task_group() as tg:
            tg.start_soon(forward)
            try:
                yield receive, write
            finally:
                tg.cancel_scope.cancel()


def _reparsed(item: SessionMessage | Exception) -> SessionMessage | Exception:
    if isinstance(item, ValidationError):
        for problem in item.errors():
            if problem["type"] == "json_invalid" and isinstance(problem["input"], str | bytes):
                data = problem["input"]
                return parse_message(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return item


@asynccontextmanager
async def _streamable_http(
    params: HttpServerParams,
    timeout: float,
    read_timeout: float,
    max_result_size: int,
    http_errors: list[httpx2.Response],
) -> AsyncIterator[TransportStreams]:
    async def record(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            http_errors.append(response)

    # Read timeout stays long: a tool call may legitimately take minutes.
    client = httpx2.AsyncClient(
        headers=params.headers or None,
        timeout=httpx2.Timeout(timeout, read=read_timeout),
        event_hooks={"response": [record]},
    )
    # An answer sent as an SSE event is one event: the SDK's default limit (1 MiB) would refuse any larger
    # result, whatever max_result_size allows.
    async with (
        client,
        streamable_http_client(params.url, http_client=client, max_sse_event_size=max_result_size) as streams,
    ):
        yield streams


# httpx2's message for an SSE event over `max_sse_event_size`, as the streamable HTTP client reports it.
_SSE_EVENT_TOO_LARGE = re.compile(r"Server-sent event exceeded the (\d+) byte limit")


def _lone_surrogate(value: Any, where: str) -> str | None:
    """Where in `value` a string holds a lone surrogate (`args.text`), or `None`."""
    if isinstance(value, str):
        if value.isascii():  # constant time: the common case costs nothing
            return None
        try:
            value.encode("utf-8")  # 0.2 s for 50 MB, where a regex search takes 0.6 s
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _lone_surrogate(key, where) or _lone_surrogate(
                item, f"{where}.{key}" if where else str(key)
            )
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if (found := _lone_surrogate(item, f"{where}[{index}]")) is not None:
                return found
    return None


def _result_size(result: types.CallToolResult) -> int:
    """About the bytes `result` took on the wire: its text, its base64 data and its structured content as
    JSON (what a size limit is about; the envelope is left out)."""
    size = 0
    for block in result.content:
        match block:
            case types.TextContent():
                size += len(block.text)
            case types.ImageContent() | types.AudioContent():
                size += len(block.data)
            case types.EmbeddedResource(resource=types.TextResourceContents() as resource):
                size += len(resource.text)
            case types.EmbeddedResource(resource=types.BlobResourceContents() as resource):
                size += len(resource.blob)
    if result.structured_content is not None:
        size += len(json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False))
    return size


def _check_command(params: StdioServerParams) -> None:
    """Raise `FileNotFoundError` (as starting it would) when the server's command can't be found: started
    through the limits' wrapper, a missing command would only be the wrapper's message on stderr."""
    command, cwd = params.command, params.cwd or os.getcwd()
    if os.sep in command:
        path = os.path.join(cwd, command)
        found = os.path.isfile(path) and os.access(path, os.X_OK)
    else:
        environ = get_default_environment() | dict(params.env)
        found = shutil.which(command, path=environ.get("PATH", os.defpath)) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)


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
