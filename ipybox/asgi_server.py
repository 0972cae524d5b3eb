"""`EmbeddedServer`: an ASGI app served by uvicorn as a task of the running event loop, on a Unix socket
(mode 0600) or a loopback port, behind `BearerAuth`. Used for the tool server and the workspace supervisor's
control endpoint.

The server's task belongs to a task group the `EmbeddedServer` holds from `start()` to `stop()` (a
`Service` of `ipybox.lifecycle`); `stop()` asks uvicorn to exit and waits for it, and a caller cancelled
meanwhile sees its cancellation, with the server cancelled then.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import socket
from collections.abc import Generator
from pathlib import Path

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ipybox.errors import IpyboxError
from ipybox.lifecycle import Service


class ListenError(IpyboxError, OSError):
    """An endpoint cannot listen on the address it was given (the port is taken, the address is not this
    machine's). The message names the endpoint, the address and the system's reason."""


class BearerAuth:
    """Rejects every HTTP request and websocket that lacks `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    def set_token(self, token: str) -> None:
        """Accept `token` from now on, and no longer the one before (requests already let in go on)."""
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            supplied = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(supplied, self.expected):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 4401, "reason": "unauthorized"})
                else:
                    body = {"error": {"type": "unauthorized", "message": "missing or wrong bearer token"}}
                    await JSONResponse(body, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit_requested = asyncio.Event()

    # Signals belong to the application embedding ipybox: uvicorn must not capture Ctrl-C.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    def request_exit(self) -> None:
        self.should_exit = True
        self._exit_requested.set()

    async def main_loop(self) -> None:
        # uvicorn polls `should_exit` every 0.1 s, so each stop waited 50 ms on average (a workspace stops
        # two servers, and `ipybox mcp` must be gone within 500 ms of Claude Code's SIGINT). Woken at once
        # instead; the ticks (once a second: the Date header) stay as uvicorn counts them.
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_requested.wait(), 1.0)


class EmbeddedServer:
    """Serves `app` until `stop()`.

    Args:
        app: The ASGI application.
        name: Task name, for debugging.
        debug: Let uvicorn log at debug level (else warnings only: its INFO lines are noise inside an
            application).
        lifespan: Run the app's lifespan (startup/shutdown), for apps that need it.
    """

    def __init__(self, app: ASGIApp, name: str, *, debug: bool = False, lifespan: bool = False) -> None:
        self.app = app
        self.name = name
        self.debug = debug
        self.lifespan = lifespan
        self.port: int | None = None
        self._server: _Server | None = None
        self._tasks: Service | None = None  # the group of the serving task, from `start()` to `stop()`
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self, *, unix_socket: Path | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on `unix_socket`, else on `host:port` (0: a free port, then in `self.port`).

        Raises:
            RuntimeError: Already running.
            ListenError: The address is taken or not this machine's (the system's reason in the message).
        """
        if self._task is not None:
            raise RuntimeError(f"{self.name} is already running")
        config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            uds=str(unix_socket) if unix_socket is not None else None,
            log_level="debug" if self.debug else "warning",
            access_log=False,
            lifespan="on" if self.lifespan else "off",
            ws_ping_interval=None,
        )
        # Bound here rather than by uvicorn, which logs a failed bind and calls `sys.exit`: the caller gets
        # one error with the system's reason instead.
        sockets = [self._bind(host, port)] if unix_socket is None else None
        server = self._server = _Server(config)
        self._tasks = Service(self.name)
        try:
            await self._tasks.start()
            task = self._task = self._tasks.spawn(server.serve(sockets=sockets), name=self.name)
            while not server.started:
                if task.done():
                    task.result()  # raises what stopped it
                    raise RuntimeError(f"{self.name} stopped while starting")
                await asyncio.sleep(0.002)
        except BaseException:
            await self.stop()
            raise
        if unix_socket is not None:
            os.chmod(unix_socket, 0o600)
        else:
            self.port = self._server.servers[0].sockets[0].getsockname()[1]

    def _bind(self, host: str, port: int) -> socket.socket:
        # As uvicorn chooses: IPv6 for an address with a colon. The protocol is named, not left 0: asyncio
        # sets TCP_NODELAY only on sockets whose `proto` says TCP, and without it every response waits
        # for the client's delayed ACK (an ask reached the console in 50 ms instead of 10).
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except (OSError, UnicodeError) as e:  # UnicodeError: a host name IDNA cannot encode
            sock.close()
            taken = " (another program uses it; choose another port, or 0 for a free one)"
            hint = taken if getattr(e, "errno", None) == errno.EADDRINUSE else ""
            raise ListenError(
                f"{self.name} cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}{hint}"
            ) from None
        return sock

    async def join(self) -> None:
        """Wait until the server stops."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Stop serving (open connections are closed). A caller cancelled meanwhile sees its cancellation;
        the server is then cancelled rather than left serving."""
        server, task, tasks = self._server, self._task, self._tasks
        try:
            if server is not None and task is not None:
                server.request_exit()
                await asyncio.wait({task})  # what it failed with is `join()`'s to raise (and was logged)
        finally:
            if tasks is not None:
                await tasks.aclose()
            self._server, self._task, self._tasks = None, None, None
