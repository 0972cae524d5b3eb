"""`StartupReport`: the progress events of `Supervisor.start()`, one part at a time (`ipybox.progress`).

Contract: `part(what)` emits `what` `starting`, then `ready` with what the body appended (joined by
commas), or `failed` with why the body raised (`interrupted` when cancelled). The warm pool has no events
of its own: `pool_while()` looks at it every `POOL_PROGRESS_INTERVAL` seconds while the rest starts (`k of
N`), and then ends the `kernels` part as it stands when `start()` ends (the pool is not waited for).
Nothing waits for a listener: `up` takes as long with one as without.

The parts of `Supervisor.start()`, in order: `tool server`, `gateway` (its pid), `kernels` (the warm pool,
`k of N` as kernels become ready; polled while starting only: the pool is not waited for, and the last
event says how many are ready), `endpoints` (what is served) and each `server <name>` (the reconciler's
steps).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

from ipybox.kernels.pool import KernelPool
from ipybox.lifecycle import cancel_and_wait
from ipybox.progress import PartTimer, ProgressHub, ProgressStep

POOL_PROGRESS_INTERVAL = 0.1
"""How often the warm pool is looked at while `start()` reports it (seconds)."""


class StartupReport:
    """The events of a start, emitted on `hub`; see the module docstring."""

    def __init__(self, hub: ProgressHub) -> None:
        self.hub = hub
        self._timer = PartTimer()

    def emit(self, what: str, step: ProgressStep, detail: str | None = None) -> None:
        self.hub.emit(self._timer.event(what, step, detail))

    @contextlib.contextmanager
    def part(self, what: str) -> Iterator[list[str]]:
        self.emit(what, "starting")
        detail: list[str] = []
        try:
            yield detail
        except BaseException as e:
            reason = "interrupted" if isinstance(e, asyncio.CancelledError) else str(e) or type(e).__name__
            self.emit(what, "failed", reason)
            raise
        self.emit(what, "ready", ", ".join(detail) or None)

    async def pool(self, idle: Callable[[], int], size: int) -> None:
        """Emits the `kernels` part until the warm pool holds `size` ready kernels (`k of N`)."""
        shown = -1
        while True:
            ready = idle()
            if ready >= size:
                self.emit("kernels", "ready", f"{size} of {size}" if size else "no warm pool")
                return
            if ready != shown:
                self.emit("kernels", "starting", f"{ready} of {size}")
                shown = ready
            await asyncio.sleep(POOL_PROGRESS_INTERVAL)

    @contextlib.asynccontextmanager
    async def pool_while(
        self,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        pool: Callable[[], KernelPool | None],
        size: int,
    ) -> AsyncIterator[None]:
        """While open, the `kernels` part follows the warm pool (`pool()`) in a task `spawn` runs; at the
        end it ends as it stands, `failed` when the body raised."""
        task = spawn(self.pool(lambda: p.idle if (p := pool()) is not None else 0, size))
        started = False
        try:
            yield
            started = True
        finally:
            if not task.done():
                await cancel_and_wait(task)
                now = pool()
                idle, failures = (now.idle, now.failures) if now is not None and started else (0, 0)
                self.pool_ended(started=started, size=size, idle=idle, failures=failures)

    def pool_ended(self, *, started: bool, size: int, idle: int, failures: int) -> None:
        """The `kernels` part ends as it stands: `started` says whether the workspace came up."""
        if not started:  # the part that failed says why
            self.emit("kernels", "failed", "stopped: the workspace did not start")
        elif idle >= size:  # filled since it last looked
            self.emit("kernels", "ready", f"{size} of {size}")
        else:
            failed = f", {failures} failed to start (see the log)" if failures else ""
            self.emit(
                "kernels", "ready", f"{idle} of {size} so far, the rest starting in the background{failed}"
            )
