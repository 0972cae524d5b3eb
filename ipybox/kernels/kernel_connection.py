"""`KernelConnection`: one kernel on a kernel gateway, driven over the gateway's websocket.

A single reader task receives every message and routes it, by the request's message id, to the
execution waiting for it; a single writer task sends the requests, in the order they were submitted.
Both belong to the connection's task group (a `Service`, `ipybox.lifecycle`), which `shutdown()` cancels
and waits for: a caller cancelled meanwhile sees its `CancelledError`. Gateway notices that the kernel
restarted or died, and the websocket closing, end every waiting execution with
[KernelDied][ipybox.kernels.kernel_connection.KernelDied].

A kernel being opened is watched on the gateway's REST API while it starts: one that the gateway reports
dead or has removed (its process kept exiting, so the gateway gave up restarting it) fails at once with
[KernelStartError][ipybox.kernels.kernel_connection.KernelStartError], instead of after the ready timeout,
which is left for a kernel that is alive but never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ipybox.errors import KernelError
from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.lifecycle import Service, first_of

if TYPE_CHECKING:
    # aiohttp is imported where it is used, not here: it is a third of what `from ipybox import
    # CodeExecutor` would load, and nothing here runs before a `KernelClient` made its session.
    import aiohttp

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = "5.3"

# Seconds between two looks at a starting kernel's state on the gateway.
_START_WATCH_INTERVAL = 0.2

ready_timeouts = 0
"""How many times, in this process, a kernel's ready timeout fired: a kernel that was neither ready nor
reported dead in time. Every kernel that failed is reported at once instead, so this stays 0 unless a
kernel hangs (the tests assert it)."""


class KernelDied(KernelError):
    """The kernel stopped existing under a request (its process exited, or the connection was lost)."""


class GatewayError(KernelError, RuntimeError):
    """The kernel gateway refused or failed a request."""


class GatewayUnreachableError(GatewayError):
    """The kernel gateway does not accept connections (it exited, or is not running yet)."""


class KernelStartError(GatewayError):
    """A new kernel died while starting (or the gateway gave up on it); the message carries the reason."""


DeathCause = Literal["process", "connection"]


@dataclass(frozen=True)
class KernelMessage:
    channel: str
    msg_type: str
    content: dict[str, Any]


_DIED = KernelMessage("", "__died__", {})


class Request:
    """The messages of one request, in arrival order, up to its shell reply and its iopub idle status."""

    def __init__(self, msg_id: str) -> None:
        self.msg_id = msg_id
        self.queue: asyncio.Queue[KernelMessage] = asyncio.Queue()
        self.replied = False
        self.idle = False

    @property
    def done(self) -> bool:
        # ipykernel may send stream output after the execute_reply: the iopub idle status is the
        # request's true end on iopub, the reply its end on shell, and output is lost unless both arrive.
        return self.replied and self.idle

    async def next(self, timeout: float | None) -> KernelMessage:
        """The next message of this request.

        Raises:
            TimeoutError: None arrived within `timeout` seconds.
            KernelDied: The kernel died or the connection was lost.
        """
        message = await asyncio.wait_for(self.queue.get(), timeout)
        if message is _DIED:
            self.queue.put_nowait(_DIED)  # later calls fail the same way
            raise KernelDied()
        if message.channel == "shell" and message.msg_type.endswith("_reply"):
            self.replied = True
        elif message.msg_type == "status" and message.content.get("execution_state") == "idle":
            self.idle = True
        return message


class KernelConnection:
    """A kernel on a gateway and the websocket to it. Create one with [open][ipybox.kernels.kernel_connection.KernelConnection.open].

    Call `shutdown()` once done with it, also after it died: its task group lives until then.
    """

    def __init__(self, http: aiohttp.ClientSession, endpoint: GatewayEndpoint, kernel_id: str) -> None:
        self.http = http
        self.endpoint = endpoint
        self.kernel_id = kernel_id
        self.session_id = uuid.uuid4().hex
        self.dead = False
        # Why the kernel is gone: "process" when the gateway said the kernel process died, "connection"
        # when the websocket closed without that (the gateway exited, or deleted the kernel).
        self.death_cause: DeathCause | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        # The reader and the writer of the websocket; started by `attach()`, closed by `shutdown()`.
        self._tasks = Service(f"kernel connection {kernel_id[:8]}")
        self._outgoing: asyncio.Queue[str] = asyncio.Queue()  # frames for the writer, in submit order
        self._requests: dict[str, Request] = {}
        self._on_death: list[Callable[[KernelConnection], None]] = []

    @classmethod
    async def open(
        cls,
        http: aiohttp.ClientSession,
        endpoint: GatewayEndpoint,
        *,
        kernel_name: str | None = None,
        env: dict[str, str] | None = None,
        ready_timeout: float | None = 60,
        gateway_log: Path | None = None,
    ) -> KernelConnection:
        """Start a kernel on the gateway, connect to it and wait until it answers.

        Raises:
            GatewayUnreachableError: The gateway does not accept connections.
            GatewayError: The gateway refused to start the kernel.
            KernelStartError: The kernel died while starting (with the end of `gateway_log`, where the
                kernel's own error goes, if given).
            TimeoutError: The kernel was alive but did not answer within `ready_timeout` seconds.
        """
        import aiohttp

        body: dict[str, Any] = {}
        if kernel_name:
            body["name"] = kernel_name
        if env:
            body["env"] = env
        try:
            async with http.post(f"{endpoint.url}/api/kernels", json=body) as response:
                if response.status != 201:
                    raise GatewayError(
                        f"the kernel gateway could not start a kernel: {await _reason(response)}"
                    )
                kernel_id = (await response.json())["id"]
        except aiohttp.ClientConnectionError as e:
            raise _unreachable(endpoint, e) from None
        return await cls.attach(
            http, endpoint, kernel_id, ready_timeout=ready_timeout, gateway_log=gateway_log
        )

    @classmethod
    async def attach(
        cls,
        http: aiohttp.ClientSession,
        endpoint: GatewayEndpoint,
        kernel_id: str,
        *,
        ready_timeout: float | None = 60,
        gateway_log: Path | None = None,
    ) -> KernelConnection:
        """Connect to a kernel already running on the gateway and wait until it answers (on failure the
        kernel is deleted: a kernel that does not answer is of no use to anyone).

        While it starts, the kernel's state on the gateway is watched, so a kernel that died fails in a
        fraction of a second rather than after `ready_timeout`.

        Raises:
            GatewayUnreachableError: The gateway does not accept connections (it exited).
            KernelStartError: The kernel died while starting, or the gateway does not know it (the message
                ends with the end of `gateway_log`, where the kernel's own error goes, if given).
            TimeoutError: The kernel was alive but did not answer within `ready_timeout` seconds.
        """
        import aiohttp

        global ready_timeouts
        connection = cls(http, endpoint, kernel_id)
        try:
            try:
                async with asyncio.timeout(ready_timeout):
                    await connection._tasks.start()
                    # Ready, unless the watch sees the kernel die first (it never returns otherwise).
                    await first_of(connection._become_ready(), connection._watch_start())
            except TimeoutError:
                ready_timeouts += 1
                limit = f"{ready_timeout:g} s" if ready_timeout is not None else "its time"  # None: no limit
                logger.warning("kernel %s did not become ready within %s", kernel_id, limit)
                raise TimeoutError(f"kernel {kernel_id} did not become ready within {limit}") from None
            except KernelDied:
                # Closed while starting: the kernel died after all, or the gateway did.
                if connection.death_cause == "connection" and (down := await gateway_down(http, endpoint)):
                    raise GatewayUnreachableError(down) from None
                raise KernelStartError(
                    f"kernel {kernel_id} died while starting{log_tail(gateway_log)}"
                ) from None
            except KernelStartError as e:
                raise KernelStartError(f"{e}{log_tail(gateway_log)}") from None
            except aiohttp.ClientConnectionError as e:
                raise _unreachable(endpoint, e) from None
        except BaseException:
            await connection.shutdown()
            raise
        return connection

    async def _become_ready(self) -> None:
        await self._connect()
        await self.request("kernel_info_request", {}, channel="shell")

    async def _watch_start(self) -> None:
        """Raise as soon as the gateway reports this (starting) kernel dead or no longer has it; never
        returns otherwise.

        The websocket says nothing until the kernel answers: the gateway accepts it only then. A kernel
        whose process exits while starting is restarted by the gateway (and may still come up), and
        removed once restarting it failed a few times: this is what tells the two apart.
        """
        url = f"{self.endpoint.url}/api/kernels/{self.kernel_id}"
        while True:
            await asyncio.sleep(_START_WATCH_INTERVAL)
            async with self.http.get(url) as response:
                if response.status == 404:
                    raise KernelStartError(
                        f"kernel {self.kernel_id} died while starting: its process exited, also after the "
                        "gateway restarted it, and the gateway removed it"
                    )
                if response.status != 200:
                    continue
                model = await response.json(content_type=None)
            if isinstance(model, dict) and model.get("execution_state") == "dead":
                reason = model.get("reason") or "no reason given"
                raise KernelStartError(f"the gateway reports kernel {self.kernel_id} dead: {reason}")

    async def _connect(self) -> None:
        import aiohttp

        url = f"{self.endpoint.ws_url}/api/kernels/{self.kernel_id}/channels?session_id={self.session_id}"
        try:
            self._ws = await self.http.ws_connect(url, max_msg_size=0, heartbeat=30, autoping=True)
        except aiohttp.WSServerHandshakeError as e:
            if e.status == 404:
                raise KernelStartError(f"the gateway has no kernel {self.kernel_id} (it died)") from None
            raise GatewayError(
                f"the kernel gateway refused a connection to the kernel: HTTP {e.status}"
            ) from None
        # The writer ends with the reader (the websocket closed): a connection that died holds no task but
        # its group's host until `shutdown()`.
        self._tasks.spawn(
            first_of(self._read(self._ws), self._write(self._ws)), name=f"ipybox-kernel-{self.kernel_id[:8]}"
        )

    def on_death(self, callback: Callable[[KernelConnection], None]) -> None:
        """Call `callback(self)` when the kernel dies or its connection is lost (not when shut down)."""
        self._on_death.append(callback)

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        import aiohttp

        try:
            async for frame in ws:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue  # binary frames carry comm buffers, which ipybox does not use
                self._dispatch(json.loads(frame.data))
        except (aiohttp.ClientError, ConnectionError) as e:
            logger.debug("kernel %s websocket failed: %s", self.kernel_id, e)
        finally:
            self._mark_dead("websocket closed", "connection")

    async def _write(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            frame = await self._outgoing.get()
            try:
                await ws.send_str(frame)
            except Exception as e:  # the websocket closed under it: the reader ends the waiting requests
                logger.debug("kernel %s websocket send failed: %s", self.kernel_id, e)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        msg_type = msg.get("msg_type") or msg.get("header", {}).get("msg_type", "")
        content = msg.get("content", {})
        if msg_type == "status" and content.get("execution_state") in ("restarting", "dead"):
            # Sent by the gateway itself when the kernel process died: its state is gone.
            self._mark_dead(f"kernel {content['execution_state']}", "process")
            return
        parent = msg.get("parent_header", {}).get("msg_id")
        request = self._requests.get(parent) if parent else None
        if request is not None:
            request.queue.put_nowait(KernelMessage(msg.get("channel", ""), msg_type, content))

    def _mark_dead(self, why: str, cause: DeathCause) -> None:
        first = not self.dead
        if first:
            logger.debug("kernel %s is gone: %s", self.kernel_id, why)
            self.death_cause = cause
        self.dead = True
        for request in self._requests.values():
            request.queue.put_nowait(_DIED)
        if first:
            for callback in self._on_death:
                try:
                    callback(self)
                except Exception:
                    logger.exception("a kernel death callback failed")

    def submit(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> Request:
        """Send a request and return the handle its messages arrive on. Call `finish()` when done with it."""
        if self.dead or self._ws is None or self._ws.closed:
            raise KernelDied()
        msg_id = uuid.uuid4().hex
        request = Request(msg_id)
        self._requests[msg_id] = request
        message = {
            "header": {
                "msg_id": msg_id,
                "msg_type": msg_type,
                "username": "ipybox",
                "session": self.session_id,
                "date": datetime.now(UTC).isoformat(),
                "version": PROTOCOL_VERSION,
            },
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": channel,
            "buffers": [],
        }
        self._outgoing.put_nowait(json.dumps(message))
        return request

    def finish(self, request: Request) -> None:
        self._requests.pop(request.msg_id, None)

    async def request(
        self, msg_type: str, content: dict[str, Any], channel: str = "shell", timeout: float | None = None
    ) -> dict[str, Any]:
        """Send a request and return its reply's content."""
        request = self.submit(msg_type, content, channel)
        try:
            while True:
                message = await request.next(timeout)
                if message.channel == channel and message.msg_type.endswith("_reply"):
                    return message.content
        finally:
            self.finish(request)

    def execute(self, code: str) -> Request:
        return self.submit(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        )

    async def report(self) -> dict[str, Any] | None:
        """What the gateway tells about this kernel's limits and usage (`"ipybox"` of its kernel model:
        mechanism, limits, usage), or `None` when it tells nothing (another gateway, the kernel is gone).
        Never raises."""
        import aiohttp

        try:
            async with (
                asyncio.timeout(5),
                self.http.get(f"{self.endpoint.url}/api/kernels/{self.kernel_id}") as response,
            ):
                if response.status != 200:
                    return None
                model = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        report = model.get("ipybox") if isinstance(model, dict) else None
        return report if isinstance(report, dict) else None

    async def interrupt(self) -> None:
        """Ask the gateway to interrupt the kernel (as configured by its kernelspec)."""
        async with self.http.post(f"{self.endpoint.url}/api/kernels/{self.kernel_id}/interrupt") as response:
            if response.status not in (200, 204):
                raise GatewayError(
                    f"the kernel gateway could not interrupt the kernel: {await _reason(response)}"
                )

    async def shutdown(self, delete: bool = True) -> None:
        """Close the websocket, stop its reader and writer, and (unless `delete` is false) delete the kernel
        on the gateway. Raises nothing but the caller's own cancellation (the kernel is then not deleted:
        a later `shutdown()` finishes; the reader and writer are cancelled all the same, so a connection
        dropped after a shutdown cut short leaves no task behind)."""
        self.dead = True
        try:
            if self._ws is not None:
                with contextlib.suppress(Exception):
                    await self._ws.close()
        finally:
            # A caller cancelled while the websocket closes (a claim of the pool's kernel, cut short) never
            # comes back: without this its task group would wait forever, until the garbage collector
            # destroyed it pending (seen: "Task was destroyed but it is pending!" in the test suite).
            await self._tasks.aclose()
        if delete:
            with contextlib.suppress(Exception):
                async with self.http.delete(f"{self.endpoint.url}/api/kernels/{self.kernel_id}"):
                    pass


async def gateway_down(http: aiohttp.ClientSession, endpoint: GatewayEndpoint) -> str | None:
    """Why the gateway does not answer (it exited, or is unreachable), or `None` when it does."""
    import aiohttp

    try:
        async with asyncio.timeout(5), http.get(f"{endpoint.url}/api") as response:
            await response.read()
    except aiohttp.ClientConnectionError as e:
        return str(_unreachable(endpoint, e))
    except TimeoutError:
        return f"the kernel gateway at {endpoint.url} does not answer"
    return None


def log_tail(path: Path | None, lines: int = 12) -> str:
    """The last lines of the log at `path`, introduced for the end of an error message ("" without one)."""
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    tail = _without_traceback_frames([line for line in text.strip().splitlines() if line.strip()])[-lines:]
    return ("; the kernel gateway's log ends with:\n" + "\n".join(tail)) if tail else ""


def _without_traceback_frames(lines: list[str]) -> list[str]:
    """`lines` without the indented lines of Python tracebacks (frames, source lines, `^^^` markers, and the
    nested exceptions of chained ones and of exception groups), their headers and unindented exception lines
    kept: a traceback of the gateway's own (a websocket handler finding its kernel gone, logged once per
    restart of a kernel that can't start) would otherwise push the kernel's error out of the tail. A
    kernel's own error line is unindented, so it stays."""
    return [line for line in lines if line[:1] not in (" ", "\t")]


def _unreachable(endpoint: GatewayEndpoint, error: Exception) -> GatewayUnreachableError:
    return GatewayUnreachableError(f"cannot reach the kernel gateway at {endpoint.url}: {error}")


async def _reason(response: aiohttp.ClientResponse) -> str:
    import aiohttp

    try:
        body = await response.json(content_type=None)
        detail = body.get("message") or body.get("reason") or ""
    except (ValueError, aiohttp.ContentTypeError, AttributeError):
        detail = (await response.text())[:200]
    return f"HTTP {response.status}" + (f" ({detail})" if detail else "")
