"""`KernelConnection`: one kernel on a kernel gateway, driven over the gateway's websocket.

A single reader task receives every message and routes it, by the request's message id, to the
execution waiting for it. Gateway notices that the kernel restarted or died, and the websocket closing,
end every waiting execution with [KernelDied][ipybox.code_exec.connection.KernelDied].
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from ipybox.code_exec.server import GatewayEndpoint

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = "5.3"


class KernelDied(Exception):
    """The kernel stopped existing under a request (its process exited, or the connection was lost)."""


class GatewayError(RuntimeError):
    """The kernel gateway refused or failed a request."""


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
    """A kernel on a gateway and the websocket to it. Create one with [open][ipybox.code_exec.connection.KernelConnection.open]."""

    def __init__(self, http: aiohttp.ClientSession, endpoint: GatewayEndpoint, kernel_id: str) -> None:
        self.http = http
        self.endpoint = endpoint
        self.kernel_id = kernel_id
        self.session_id = uuid.uuid4().hex
        self.dead = False
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._requests: dict[str, Request] = {}

    @classmethod
    async def open(
        cls,
        http: aiohttp.ClientSession,
        endpoint: GatewayEndpoint,
        *,
        kernel_name: str | None = None,
        env: dict[str, str] | None = None,
        ready_timeout: float = 60,
    ) -> KernelConnection:
        """Start a kernel on the gateway, connect to it and wait until it answers.

        Raises:
            GatewayError: The gateway refused to start the kernel.
            TimeoutError: The kernel did not answer within `ready_timeout` seconds.
        """
        body: dict[str, Any] = {}
        if kernel_name:
            body["name"] = kernel_name
        if env:
            body["env"] = env
        async with http.post(f"{endpoint.url}/api/kernels", json=body) as response:
            if response.status != 201:
                raise GatewayError(f"the kernel gateway could not start a kernel: {await _reason(response)}")
            kernel_id = (await response.json())["id"]
        return await cls.attach(http, endpoint, kernel_id, ready_timeout=ready_timeout)

    @classmethod
    async def attach(
        cls,
        http: aiohttp.ClientSession,
        endpoint: GatewayEndpoint,
        kernel_id: str,
        *,
        ready_timeout: float = 60,
    ) -> KernelConnection:
        """Connect to a kernel already running on the gateway and wait until it answers (on failure the
        kernel is deleted: a kernel that does not answer is of no use to anyone).

        Raises:
            TimeoutError: The kernel did not answer within `ready_timeout` seconds.
        """
        connection = cls(http, endpoint, kernel_id)
        try:
            async with asyncio.timeout(ready_timeout):
                await connection._connect()
                await connection.request("kernel_info_request", {}, channel="shell")
        except BaseException:
            await connection.shutdown()
            raise
        return connection

    async def _connect(self) -> None:
        url = f"{self.endpoint.ws_url}/api/kernels/{self.kernel_id}/channels?session_id={self.session_id}"
        self._ws = await self.http.ws_connect(url, max_msg_size=0, heartbeat=30, autoping=True)
        self._reader = asyncio.create_task(self._read(self._ws), name=f"ipybox-kernel-{self.kernel_id[:8]}")

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        try:
            async for frame in ws:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue  # binary frames carry comm buffers, which ipybox does not use
                self._dispatch(json.loads(frame.data))
        except (aiohttp.ClientError, ConnectionError) as e:
            logger.debug("kernel %s websocket failed: %s", self.kernel_id, e)
        finally:
            self._mark_dead("websocket closed")

    def _dispatch(self, msg: dict[str, Any]) -> None:
        msg_type = msg.get("msg_type") or msg.get("header", {}).get("msg_type", "")
        content = msg.get("content", {})
        if msg_type == "status" and content.get("execution_state") in ("restarting", "dead"):
            # Sent by the gateway itself when the kernel process died: its state is gone.
            self._mark_dead(f"kernel {content['execution_state']}")
            return
        parent = msg.get("parent_header", {}).get("msg_id")
        request = self._requests.get(parent) if parent else None
        if request is not None:
            request.queue.put_nowait(KernelMessage(msg.get("channel", ""), msg_type, content))

    def _mark_dead(self, why: str) -> None:
        if not self.dead:
            logger.debug("kernel %s is gone: %s", self.kernel_id, why)
        self.dead = True
        for request in self._requests.values():
            request.queue.put_nowait(_DIED)

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
        send = self._ws.send_str(json.dumps(message))
        # send_str only queues the frame; the task keeps a reference until it is written.
        task = asyncio.ensure_future(send)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
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

    async def interrupt(self) -> None:
        """Ask the gateway to interrupt the kernel (as configured by its kernelspec)."""
        async with self.http.post(f"{self.endpoint.url}/api/kernels/{self.kernel_id}/interrupt") as response:
            if response.status not in (200, 204):
                raise GatewayError(
                    f"the kernel gateway could not interrupt the kernel: {await _reason(response)}"
                )

    async def shutdown(self, delete: bool = True) -> None:
        """Close the websocket and (unless `delete` is false) delete the kernel on the gateway. Never raises."""
        self.dead = True
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        if delete:
            with contextlib.suppress(Exception):
                async with self.http.delete(f"{self.endpoint.url}/api/kernels/{self.kernel_id}"):
                    pass


async def _reason(response: aiohttp.ClientResponse) -> str:
    try:
        body = await response.json(content_type=None)
        detail = body.get("message") or body.get("reason") or ""
    except (ValueError, aiohttp.ContentTypeError, AttributeError):
        detail = (await response.text())[:200]
    return f"HTTP {response.status}" + (f" ({detail})" if detail else "")
