"""The client that generated tool modules use, inside the kernel, to run MCP tools on the tool server.

It imports only the standard library, so that the first tool call in a fresh kernel costs milliseconds,
and keeps one persistent HTTP/1.1 connection per thread to the tool server (a Unix socket by default).
The kernel only ever sends a server *name*, a tool name and arguments: which process or URL backs that
name is decided on the host.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import threading
from typing import Any

SERVER_ENV = "IPYBOX_TOOL_SERVER"
TOKEN_ENV = "IPYBOX_TOOL_TOKEN"


class ToolRunnerError(Exception):
    """Raised when a tool call fails: the tool reported an error, the server is unknown or unreachable,
    or the call was not approved."""


class ApprovalRejectedError(ToolRunnerError):
    """Raised when the application (or an approval rule) rejected the tool call."""


class ApprovalTimeoutError(ToolRunnerError):
    """Raised when nobody decided on the tool call within the approval timeout."""


_ERRORS: dict[str, type[ToolRunnerError]] = {
    "approval_rejected": ApprovalRejectedError,
    "approval_timeout": ApprovalTimeoutError,
}


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class _Connections(threading.local):
    conn: http.client.HTTPConnection | None = None
    address: str | None = None


_local = _Connections()


def _open(address: str) -> http.client.HTTPConnection:
    # Tool calls may wait on a human approval, so there is no socket timeout: the server enforces the
    # approval timeout and always answers.
    if address.startswith("unix:"):
        unix = _UnixHTTPConnection(address[len("unix:") :], timeout=None)
        unix.connect()
        return unix
    if address.startswith("http://"):
        host, _, port = address[len("http://") :].rstrip("/").rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=None)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn
    raise ToolRunnerError(
        f"unsupported tool server address {address!r} (expected 'unix:PATH' or 'http://HOST:PORT')"
    )


class ToolRunner:
    """Runs the tools of one MCP server on the tool server.

    Generated modules under `mcptools/` create one of these per call; it is cheap, since connections are
    shared per thread.

    Args:
        server_name: Name of the MCP server, as registered on the host.
        server_params: Accepted for compatibility with ipybox 0.9 and ignored: the host alone decides how
            a server is started, so code in the kernel cannot make it start a process of its choosing.
        address: Tool server address (`unix:/path` or `http://127.0.0.1:PORT`); defaults to the
            `IPYBOX_TOOL_SERVER` environment variable set by ipybox in the kernel.
        token: Bearer token; defaults to `IPYBOX_TOOL_TOKEN`.

    Example:
        ```python
        runner = ToolRunner("filesystem")
        listing = runner.run_sync("list_directory", {"path": "."})
        ```
    """

    def __init__(
        self,
        server_name: str,
        server_params: dict[str, Any] | None = None,
        *,
        address: str | None = None,
        token: str | None = None,
    ) -> None:
        self.server_name = server_name
        self._address = address
        self._token = token

    def run_sync(self, tool_name: str, tool_args: dict[str, Any]) -> dict[str, Any] | str | None:
        """Run a tool and return its result: structured content as a dict, else text.

        Raises:
            ApprovalRejectedError: The call was rejected.
            ApprovalTimeoutError: Nobody decided in time.
            ToolRunnerError: The tool failed, or the tool server could not be reached.
        """
        address = self._address or os.environ.get(SERVER_ENV)
        token = self._token or os.environ.get(TOKEN_ENV, "")
        if not address:
            raise ToolRunnerError(
                f"no tool server is configured ({SERVER_ENV} is not set): run this code through an "
                "ipybox CodeExecutor or a running ipybox workspace"
            )
        body = json.dumps({"server": self.server_name, "tool": tool_name, "args": tool_args})
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        payload = self._post(address, body, headers)
        if "error" in payload:
            error = payload["error"]
            raise _ERRORS.get(error.get("type", ""), ToolRunnerError)(
                error.get("message", "tool call failed")
            )
        result: dict[str, Any] | str | None = payload.get("result")
        return result

    async def run(self, tool_name: str, tool_args: dict[str, Any]) -> dict[str, Any] | str | None:
        """Async variant of [run_sync][ipybox.tool_exec.client.ToolRunner.run_sync]."""
        return await asyncio.to_thread(self.run_sync, tool_name, tool_args)

    @staticmethod
    def _post(address: str, body: str, headers: dict[str, str]) -> dict[str, Any]:
        for attempt in (1, 2):
            if _local.conn is None or _local.address != address:
                try:
                    _local.conn, _local.address = _open(address), address
                except OSError as e:
                    raise ToolRunnerError(f"cannot reach the ipybox tool server at {address}: {e}") from None
            conn = _local.conn
            try:
                conn.request("POST", "/run", body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as e:
                # A kept-alive connection may have been closed by a restarted server: reconnect once.
                conn.close()
                _local.conn = None
                if attempt == 2:
                    raise ToolRunnerError(f"lost the connection to the ipybox tool server: {e}") from None
                continue
            if response.status == 401:
                raise ToolRunnerError("the ipybox tool server rejected this kernel's token")
            try:
                payload: dict[str, Any] = json.loads(data)
            except ValueError:
                raise ToolRunnerError(
                    f"unexpected answer from the tool server (HTTP {response.status}): {data[:200]!r}"
                ) from None
            return payload
        raise AssertionError("unreachable")
