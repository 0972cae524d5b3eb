"""What ends an execution early: `ExecutionTimer`, its time budget, which can be paused (while a tool call
waits for a human's approval, for instance, the code is not running), and `Cancellation`, a request to stop
it made from elsewhere (`CodeExecutor.cancel()`)."""

from __future__ import annotations

import time
from collections.abc import Callable


class ExecutionTimer:
    """Counts the running time of one execution against `timeout` seconds (`None`: no limit)."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self._used = 0.0
        self._started_at: float | None = time.monotonic()
        self._pauses = 0

    def pause(self) -> None:
        """Stop counting (nestable: several approvals may be pending at once)."""
        self._pauses += 1
        if self._pauses == 1 and self._started_at is not None:
            self._used += time.monotonic() - self._started_at
            self._started_at = None

    def resume(self) -> None:
        """Count again once every `pause()` has been matched."""
        self._pauses = max(0, self._pauses - 1)
        if self._pauses == 0 and self._started_at is None:
            self._started_at = time.monotonic()

    @property
    def used(self) -> float:
        running = time.monotonic() - self._started_at if self._started_at is not None else 0.0
        return self._used + running

    @property
    def paused(self) -> bool:
        return self._pauses > 0

    def remaining(self, poll: float = 0.5) -> float | None:
        """Seconds left, for a wait. While paused, a short poll interval, so the caller re-checks."""
        if self.timeout is None:
            return None
        if self.paused:
            return poll
        return max(0.0, self.timeout - self.used)

    def expired(self) -> bool:
        return self.timeout is not None and not self.paused and self.used >= self.timeout


class Cancellation:
    """A request to stop one execution, which may come before the execution started, while it runs, or after
    it ended (then it does nothing). Synchronous, so any task on the loop can call `cancel()`.

    The execution registers `on_cancel` to be woken while it waits for the kernel; a cancellation made
    before that is delivered at registration.
    """

    def __init__(self) -> None:
        self.cancelled = False
        self._wake: Callable[[], None] | None = None

    def cancel(self) -> None:
        """Ask the execution to stop (repeated calls do nothing more)."""
        if self.cancelled:
            return
        self.cancelled = True
        if self._wake is not None:
            self._wake()

    def on_cancel(self, wake: Callable[[], None] | None) -> None:
        """Call `wake()` when cancelled (at once if already cancelled); `None` unregisters."""
        self._wake = wake
        if wake is not None and self.cancelled:
            wake()
