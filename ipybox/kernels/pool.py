"""`KernelPool`: started, answering kernels kept in reserve on the workspace's gateway, each with a tool
token of its own, so an application that attaches gets a ready kernel in milliseconds.

Idle kernels stay connected, so one that dies while idle is noticed at once and replaced in the
background. A claim never waits longer than the kernel start it waits for: when that start fails (the
kernel died while starting, the gateway exited), the claim fails with the same error right away.

With `warm_up`, an idle kernel is warmed up in the background (`ipybox.kernels.warm_up`: what the first
tool call needs is imported) until it is claimed: a claim gets it at once, and its first request waits for
the warm-up's step in progress at most (tens of milliseconds). A kernel a claim waits for is not warmed up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp

from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.kernels.kernel_connection import GatewayError, GatewayUnreachableError, KernelConnection
from ipybox.kernels.warm_up import warm_up as warm_up_kernel
from ipybox.lifecycle import Service

logger = logging.getLogger(__name__)

READY_TIMEOUT = 60.0
"""Seconds a pool kernel gets to answer (unless the pool is given another), for one that neither answers
nor dies: a kernel that dies while starting fails at once."""

REFILL_DELAY = 0.3
"""Seconds from a claim to the start of its replacement. Starting a kernel keeps the gateway's event loop
busy (it spawns the process) and takes a core for most of a second, right when the application that claimed
the kernel connects to it and runs its first cells; measured on a 2-core machine, the connection took 45 ms
instead of 5. A claim that finds the pool empty meanwhile starts a kernel at once: no claim waits for this
delay. Claims in a row (within `IN_A_ROW` seconds of the one before: resets back to back, sessions opening
together) refill at once instead: there the replacement's head start is what the next claim waits on
(measured: back-to-back resets took 620-990 ms with the delay, 480 ms without)."""

IN_A_ROW = 1.0
"""Seconds from one claim's kernel to the next one's within which that claim counts as following it (see
`REFILL_DELAY`)."""

# Idle kernels that may die in a row (with no claim in between), and kernel starts that may fail in a
# row, and still be replaced right away; past that, the next claim starts the next kernel.
_MAX_DEATHS_IN_A_ROW = 3
_MAX_FAILURES_IN_A_ROW = 2


class PoolStoppedError(GatewayError):
    """The pool was stopped (the gateway is being restarted or the kernels recycled) during a claim."""


class KernelPool:
    """Keeps `size` idle kernels ready.

    Args:
        endpoint: The gateway.
        size: Idle kernels to keep (0: kernels are started on demand).
        kernel_env: The environment of a new kernel, given its caller id (the kernel's tool token is
            issued for that id).
        ready_timeout: Seconds a new kernel gets to answer (default `READY_TIMEOUT`).
        gateway_log: The gateway's log, whose end is added to the error about a kernel that died while
            starting.
        warm_up: Warm idle kernels up (see the module docstring), for kernels of ipybox's own kernel spec
            (the warm-up is Python).
        kernel_name: The kernel spec to start kernels from (`None`: the gateway's default).
        set_up: Called with each kernel that answers and its caller id, before it is pooled (a remote
            kernel's set-up: `ipybox.kernels.remote_setup`). A kernel whose set-up raises is deleted, and
            the start fails with that error.

    Attributes:
        version: The version of the gateway's kernel spec that kernels started now get (the caller's
            count, raised with `recycle(version)`); a kernel whose start was asked for under an older one
            is shut down when it is ready rather than pooled (it may have been started from the old spec).
        versions: Each kernel's version (idle and claimed, until released).
    """

    def __init__(
        self,
        endpoint: GatewayEndpoint,
        size: int,
        kernel_env: Callable[[str], dict[str, str]],
        ready_timeout: float | None = None,
        gateway_log: Path | None = None,
        warm_up: bool = False,
        kernel_name: str | None = None,
        set_up: Callable[[KernelConnection, str], Awaitable[None]] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.kernel_name = kernel_name
        self.set_up = set_up
        self.size = size
        self.kernel_env = kernel_env
        self.ready_timeout = READY_TIMEOUT if ready_timeout is None else ready_timeout
        self.gateway_log = gateway_log
        self.warm_up = warm_up
        self._claims_waiting = 0  # claims waiting for a kernel start: that kernel is not warmed up
        self._refill_timer: asyncio.TimerHandle | None = None  # the refill after a claim
        self._last_claim = -math.inf  # when the last claim got its kernel (the loop's clock)
        self.callers: dict[str, str] = {}  # kernel id -> caller id of its tool token
        self.version = 0
        self.versions: dict[str, int] = {}
        self._idle: dict[str, KernelConnection] = {}  # in the order they became ready
        # Connections of idle kernels that died, until closed: `stop()` closes those whose closing it cut
        # short or that died while it stopped (a connection owns a task group: dropping it leaks it).
        self._dead: set[KernelConnection] = set()
        # Kernel starts under way (each one's outcome, which a claim waiting for it reads), and the pool's
        # background work: all of it runs in the task group of `_tasks`, which `stop()` closes.
        self._starting: set[asyncio.Future[None]] = set()
        self._tasks = Service("kernel pool")
        self._http: aiohttp.ClientSession | None = None
        self._deaths_in_a_row = 0
        self._failures_in_a_row = 0
        self.failures = 0
        # How a gateway's restart shows to the pool (a remote gateway's watcher reads them): idle kernels
        # whose connection closed without the kernel dying, and starts that found the gateway unreachable.
        self.connection_losses = 0
        self.unreachable_starts = 0

    @property
    def gateway_trouble(self) -> int:
        """`connection_losses` + `unreachable_starts`: grows when the gateway went away under the pool."""
        return self.connection_losses + self.unreachable_starts

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def idle_kernels(self) -> list[str]:
        """The ids of the idle kernels, oldest first (the next claim takes the first)."""
        return list(self._idle)

    async def start(self) -> None:
        self._http = self.endpoint.session()
        await self._tasks.start()
        self.refill()

    def refill(self) -> None:
        """Start kernels until idle + starting reaches `size`."""
        while self._http is not None and self.idle + len(self._starting) < self.size:
            self._start_one()

    async def claim(self) -> str:
        """A ready kernel's id, taken out of the pool (which starts a replacement).

        Raises:
            GatewayError: The kernel start this claim waited for failed (`GatewayUnreachableError` when the
                gateway exited, `KernelStartError` when the kernel died while starting); or the pool was
                stopped (`PoolStoppedError`).
            TimeoutError: That kernel was alive but did not answer within `ready_timeout`.
        """
        while True:
            if self._http is None:
                raise PoolStoppedError("the kernel pool is stopped")
            while self._idle:
                kernel_id = next(iter(self._idle))
                kernel = self._idle.pop(kernel_id)
                if kernel.dead:  # its death is being handled (`_idle_died`)
                    continue
                try:
                    await kernel.shutdown(delete=False)  # the attaching client opens its own websocket
                except (
                    asyncio.CancelledError
                ):  # claimed by nobody after all: deleted, not left on the gateway
                    self.discard(kernel_id)
                    raise
                self._deaths_in_a_row = 0
                self._refill_after_claim()
                return kernel_id
            start = next(iter(self._starting), None) or self._start_one()
            self._claims_waiting += 1
            try:
                await asyncio.wait([start])
            finally:
                self._claims_waiting -= 1
            if start.cancelled():
                raise PoolStoppedError("the kernel pool was stopped while a kernel was starting")
            if (error := start.exception()) is not None:
                raise error
            # Its kernel is idle now, unless a claim that waited too took it: look again.

    async def release(self, kernel_id: str) -> None:
        """Delete a claimed kernel."""
        self.callers.pop(kernel_id, None)
        self.versions.pop(kernel_id, None)
        await self._delete(kernel_id)

    def discard(self, kernel_id: str) -> None:
        """Delete a claimed kernel in the background (one its holder replaced: whoever claims next need not
        wait for it to shut down)."""
        self.callers.pop(kernel_id, None)
        self.versions.pop(kernel_id, None)
        self._spawn(self._delete(kernel_id), "ipybox-pool-delete")

    async def recycle(self, version: int | None = None) -> None:
        """Replace the idle kernels (after the kernel environment or the sandbox changed); with `version`,
        the kernel spec changed: kernels started from now on have that version, and kernels still
        starting are not pooled."""
        if version is not None:
            self.version = version
        old, self._idle = self._idle, {}
        for kernel in old.values():
            self.callers.pop(kernel.kernel_id, None)
            self.versions.pop(kernel.kernel_id, None)
        await asyncio.gather(*(kernel.shutdown() for kernel in old.values()))
        self.refill()

    async def stop(self) -> None:
        """Stop starting kernels and close the idle kernels' connections (the gateway, stopped next, ends
        the kernels). Claims waiting for a start fail with `PoolStoppedError`."""
        http, self._http = self._http, None
        if self._refill_timer is not None:
            self._refill_timer.cancel()
            self._refill_timer = None
        await self._tasks.aclose()  # cancels the starts and the background work, and waits for them
        for start in list(self._starting):
            start.cancel()  # a claim waiting for it fails with PoolStoppedError
        idle, self._idle = self._idle, {}
        dead, self._dead = self._dead, set()
        await asyncio.gather(*(kernel.shutdown(delete=False) for kernel in [*idle.values(), *dead]))
        if http is not None:
            await http.close()

    def _refill_after_claim(self) -> None:
        """`refill()` in `REFILL_DELAY` seconds, or now for a claim in a row (see `REFILL_DELAY`): one whose
        kernel came within `IN_A_ROW` of the last claim's. (Counting from when a claim was asked instead
        made back-to-back resets slower: 837 ms against 499 in the same hour.)"""
        now = asyncio.get_running_loop().time()
        in_a_row, self._last_claim = now - self._last_claim < IN_A_ROW, now
        if in_a_row:
            self._refill_now()
        elif self._refill_timer is None and self._http is not None:
            self._refill_timer = asyncio.get_running_loop().call_later(REFILL_DELAY, self._refill_now)

    def _refill_now(self) -> None:
        if self._refill_timer is not None:
            self._refill_timer.cancel()
            self._refill_timer = None
        self.refill()

    def _start_one(self) -> asyncio.Future[None]:
        outcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._starting.add(outcome)
        outcome.add_done_callback(self._started)

        async def start() -> None:
            # The start's failure is its outcome's (a claim raises it), never the pool's group's.
            try:
                await self._add()
            except asyncio.CancelledError:
                outcome.cancel()
                raise
            except Exception as e:
                if not outcome.done():
                    outcome.set_exception(e)
                return
            if not outcome.done():
                outcome.set_result(None)

        try:
            self._tasks.spawn(start(), name="ipybox-pool-kernel")
        except RuntimeError:  # stopped meanwhile
            outcome.cancel()
        return outcome

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` in the pool's group; its failure is logged, never the group's (no other work ends)."""

        async def logged() -> None:
            try:
                await work
            except Exception as e:
                logger.warning("background work of the kernel pool failed (%s): %s", name, e)

        try:
            self._tasks.spawn(logged(), name=name)
        except RuntimeError:  # the pool is stopping: nothing more runs
            work.close()

    def _started(self, task: asyncio.Future[None]) -> None:
        self._starting.discard(task)
        if task.cancelled():
            return
        error = task.exception()  # logged by _add; a claim waiting for it raises it
        if error is None:
            self._failures_in_a_row = 0
            self.refill()  # a kernel dropped for an old spec is replaced
            return
        self._failures_in_a_row += 1
        if (
            not isinstance(error, GatewayUnreachableError)
            and self._failures_in_a_row <= _MAX_FAILURES_IN_A_ROW
        ):
            self.refill()  # a kernel that failed once may start the next time; one that keeps failing waits

    async def _add(self) -> None:
        http = self._http
        assert http is not None
        caller = uuid.uuid4().hex
        version = self.version  # before the start: the spec may change while it starts
        try:
            kernel = await KernelConnection.open(
                http,
                self.endpoint,
                kernel_name=self.kernel_name,
                env=self.kernel_env(caller),
                ready_timeout=self.ready_timeout,
                gateway_log=self.gateway_log,
            )
            if self.set_up is not None:
                try:
                    await self.set_up(kernel, caller)
                except BaseException:
                    await kernel.shutdown()  # never handed out half set up (fail closed)
                    raise
        except GatewayUnreachableError as e:
            self.failures += 1
            self.unreachable_starts += 1
            logger.warning("could not start a kernel for the pool (the gateway exited?): %s", e)
            raise
        except Exception as e:
            self.failures += 1
            logger.error("could not start a kernel for the pool: %s", e)
            raise
        if self._http is not http:  # stopped meanwhile
            await kernel.shutdown(delete=False)
            return
        if version != self.version:  # recycled meanwhile: it may run under the old spec
            await kernel.shutdown()
            return  # replaced when this start is done (`_started`)
        self.callers[kernel.kernel_id] = caller
        self.versions[kernel.kernel_id] = version
        self._idle[kernel.kernel_id] = kernel
        kernel.on_death(self._idle_died)
        if self.warm_up and not self._claims_waiting:
            self._spawn(self._warm_up(kernel), "ipybox-pool-warm-up")

    async def _warm_up(self, kernel: KernelConnection) -> None:
        """Warm an idle kernel up until it is claimed (or dies: `_idle_died` replaces it)."""
        await warm_up_kernel(kernel, lambda: self._idle.get(kernel.kernel_id) is kernel)

    async def _close_dead(self, kernel: KernelConnection) -> None:
        await kernel.shutdown(delete=False)
        self._dead.discard(kernel)

    def _idle_died(self, kernel: KernelConnection) -> None:
        if self._idle.get(kernel.kernel_id) is not kernel:
            return  # claimed (or dropped) before it died
        del self._idle[kernel.kernel_id]
        self.callers.pop(kernel.kernel_id, None)
        self.versions.pop(kernel.kernel_id, None)
        # Its connection is closed for good: it ends its own tasks (a connection owns a task group).
        self._dead.add(kernel)
        self._spawn(self._close_dead(kernel), "ipybox-pool-close-dead")
        if self._http is None or kernel.death_cause != "process":
            # The connection closed without the gateway saying the kernel died: the gateway exited (its
            # restart brings a new pool) or deleted the kernel; the next claim starts one if needed.
            self.connection_losses += 1
            return
        self._deaths_in_a_row += 1
        logger.warning("an idle kernel of the pool died (its process exited): replacing it")
        # The gateway restarts the dead process under the same id; a kernel that failed once is not
        # handed out, but deleted and replaced by a new one.
        self.discard(kernel.kernel_id)
        if self._deaths_in_a_row <= _MAX_DEATHS_IN_A_ROW:
            self.refill()
        # Otherwise the next claim starts one: no loop of kernels that die as soon as they are up.

    async def _delete(self, kernel_id: str) -> None:
        if self._http is None:
            return
        with contextlib.suppress(aiohttp.ClientError):
            async with self._http.delete(f"{self.endpoint.url}/api/kernels/{kernel_id}"):
                pass
