"""`KernelPool`: started, answering kernels kept in reserve on the workspace's gateway, each with a tool
token of its own, so an application that attaches gets a ready kernel in milliseconds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

import aiohttp

from ipybox.code_exec.connection import KernelConnection
from ipybox.code_exec.server import GatewayEndpoint

logger = logging.getLogger(__name__)


class KernelPool:
    """Keeps `size` idle kernels ready.

    Args:
        endpoint: The gateway.
        size: Idle kernels to keep (0: kernels are started on demand).
        kernel_env: The environment of a new kernel, given its caller id (the kernel's tool token is
            issued for that id).
        ready_timeout: Seconds a new kernel gets to answer.
    """

    def __init__(
        self,
        endpoint: GatewayEndpoint,
        size: int,
        kernel_env: Callable[[str], dict[str, str]],
        ready_timeout: float = 60,
    ) -> None:
        self.endpoint = endpoint
        self.size = size
        self.kernel_env = kernel_env
        self.ready_timeout = ready_timeout
        self.callers: dict[str, str] = {}  # kernel id -> caller id of its tool token
        self._idle: asyncio.Queue[str] = asyncio.Queue()
        self._starting: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None
        self._start_lock = asyncio.Lock()
        self.failures = 0

    @property
    def idle(self) -> int:
        return self._idle.qsize()

    async def start(self) -> None:
        connector = (
            aiohttp.UnixConnector(path=str(self.endpoint.unix_socket)) if self.endpoint.unix_socket else None
        )
        headers = {"Authorization": f"token {self.endpoint.token}"} if self.endpoint.token else {}
        self._http = aiohttp.ClientSession(connector=connector, headers=headers)
        self.refill()

    def refill(self) -> None:
        """Start kernels until idle + starting reaches `size`."""
        while self._http is not None and self.idle + len(self._starting) < self.size:
            task = asyncio.create_task(self._add_in_background(), name="ipybox-pool-kernel")
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def claim(self) -> str:
        """A ready kernel's id, taken out of the pool (which starts a replacement)."""
        if self.idle == 0 and not self._starting:
            await self._add()
        kernel_id = await asyncio.wait_for(self._idle.get(), self.ready_timeout)
        self.refill()
        return kernel_id

    async def release(self, kernel_id: str) -> None:
        """Delete a claimed kernel."""
        self.callers.pop(kernel_id, None)
        await self._delete(kernel_id)

    async def recycle(self) -> None:
        """Replace the idle kernels (after the kernel environment or the sandbox changed)."""
        old = []
        while not self._idle.empty():
            old.append(self._idle.get_nowait())
        await asyncio.gather(*(self.release(kernel_id) for kernel_id in old))
        self.refill()

    async def stop(self) -> None:
        for task in list(self._starting):
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _add_in_background(self) -> None:
        with contextlib.suppress(Exception):  # logged by _add; the next claim or refill tries again
            await self._add()

    async def _add(self) -> None:
        assert self._http is not None
        caller = uuid.uuid4().hex
        try:
            # One start at a time: kernels on ipc transport pick their socket names by looking for free
            # ones, and two starting at once can pick the same and never answer.
            async with self._start_lock:
                kernel = await KernelConnection.open(
                    self._http, self.endpoint, env=self.kernel_env(caller), ready_timeout=self.ready_timeout
                )
        except Exception as e:
            self.failures += 1
            logger.error("could not start a kernel for the pool: %s", e)
            raise
        await kernel.shutdown(delete=False)  # ready: the attaching client opens its own websocket
        self.callers[kernel.kernel_id] = caller
        self._idle.put_nowait(kernel.kernel_id)

    async def _delete(self, kernel_id: str) -> None:
        if self._http is None:
            return
        with contextlib.suppress(aiohttp.ClientError):
            async with self._http.delete(f"{self.endpoint.url}/api/kernels/{kernel_id}"):
                pass
