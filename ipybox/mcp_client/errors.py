"""The one exception hierarchy for everything that can go wrong with an MCP server.

Every message is a single line that names the server, so it can be shown to a user or an agent as is.
"""

from __future__ import annotations

from ipybox.errors import IpyboxError
from ipybox.limits.spec import format_bytes


def one_line(text: str, limit: int = 2000) -> str:
    """Collapse `text` to one line of at most `limit` characters."""
    line = " | ".join(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class MCPServerError(IpyboxError):
    """Base class: something went wrong with MCP server `server_name`.

    Attributes:
        server_name: Name of the server, as given by the application.
        detail: What went wrong, without the server name.
    """

    def __init__(self, server_name: str, detail: str) -> None:
        self.server_name = server_name
        self.detail = one_line(detail)
        super().__init__(f"MCP server {server_name!r}: {self.detail}")


class ServerParamsError(MCPServerError):
    """The server parameters are invalid, or reference an environment variable that is not set."""


class ServerStartError(MCPServerError):
    """A stdio server could not be started: the command was not found, or it exited at once."""


class ServerCodeWritableError(ServerStartError):
    """A stdio server was not started: a kernel could write code it runs (its command, script, modules or
    environment), so it would run the kernel's code, and get its `${VAR}` secrets. The message names the
    path, who can write it and the fix (see `ipybox.config.executables`)."""


class ServerConnectError(MCPServerError):
    """The server could not be reached, refused the connection, answered with an HTTP error, or the
    connection was lost."""


class ServerMemoryLimitError(ServerConnectError):
    """A stdio server went over the memory limit of its `limits` and the system's out-of-memory killer
    ended it (a control group's limit: the process is killed, not refused an allocation). The call that
    was running fails with this; the server starts again on the next call, and the other servers never
    noticed.

    Attributes:
        limit: The memory limit, in bytes.
        peak: The most the server used, in bytes (`None`: not known).
    """

    def __init__(self, server_name: str, limit: int, peak: int | None) -> None:
        self.limit = limit
        self.peak = peak
        used = f", peak {format_bytes(peak)}" if peak is not None else ""
        super().__init__(
            server_name,
            f"went over its memory limit (limit {format_bytes(limit)}{used}) and was stopped; it starts "
            f"again on the next call. If it needs more, raise memory in [servers.{server_name}.limits] (or "
            "'limits' in its server_params)",
        )
        # "MCP server 'x' went over ...": the detail reads as the rest of the sentence.
        self.args = (f"MCP server {server_name!r} {self.detail}",)


class ServerTimeoutError(MCPServerError):
    """The server did not complete the MCP handshake, or answer a request, in time."""


class CallTimeoutError(ServerTimeoutError):
    """A tool call got no answer within its `call_timeout`. The server was sent `notifications/cancelled`
    for it, and its connection stays up for other calls (a late answer is dropped).

    Attributes:
        tool_name: Name of the tool.
        timeout: The call timeout, in seconds.
    """

    def __init__(self, server_name: str, tool_name: str, timeout: float) -> None:
        self.tool_name = tool_name
        self.timeout = timeout
        super().__init__(
            server_name,
            f"{server_name}.{tool_name} did not answer within {timeout:g} s and was cancelled; if the tool "
            f"needs longer, raise the server's call_timeout ([servers.{server_name}] call_timeout in "
            "ipybox.toml, or 'call_timeout' in its server_params)",
        )


class ResultTooLargeError(MCPServerError):
    """A tool's answer was larger than the server's `max_result_size`. It was dropped (over stdio, read
    past without being held), and the connection stays up for other calls.

    Attributes:
        tool_name: Name of the tool.
        size: Size of the answer in bytes, as the server sent it (`None`: not known, since it was not read
            to its end).
        limit: The limit, in bytes.
    """

    def __init__(self, server_name: str, tool_name: str, size: int | None, limit: int) -> None:
        self.tool_name = tool_name
        self.size = size
        self.limit = limit
        answered = f"with {_size(size)}, more than" if size is not None else "with more than"
        super().__init__(
            server_name,
            f"{server_name}.{tool_name} answered {answered} its max_result_size of {_size(limit)}: the answer "
            f"was dropped; ask the tool for less (e.g. a page or a range), or raise the server's "
            f"max_result_size ([servers.{server_name}] max_result_size in ipybox.toml, or 'max_result_size' "
            "in its server_params)",
        )


def _size(size: int) -> str:
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.1f} MiB"
    return f"{size / 1024:.0f} KiB" if size >= 1024 else f"{size} bytes"


class ServerNotRunningError(MCPServerError):
    """A request was made on a connection that was never started, or was already stopped."""


class ToolCallError(MCPServerError):
    """A tool call failed: the tool reported an error, or the server rejected the call.

    Attributes:
        tool_name: Name of the tool.
        message: The server's own error message, unchanged (it may span several lines).
    """

    def __init__(self, server_name: str, tool_name: str, message: str) -> None:
        self.tool_name = tool_name
        self.message = message
        super().__init__(server_name, f"tool {tool_name!r} failed: {message or 'no error message'}")


class ToolChangedError(MCPServerError):
    """The server restarted between a call's approval and the call, and the tool it names now differs
    from its pin in `ipybox.lock`: the call was not made (the next one is decided knowing the change)."""
