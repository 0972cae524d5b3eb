"""`Watchers`: the supervisor's long-running loops, in one `asyncio.TaskGroup`.

Contract: `start()` runs each watcher as a task of one task group (in a task of its own, so the group
outlives the call); `stop()` cancels them all and waits until they are gone. A watcher is meant to run
until cancelled: the first that raises cancels the others, is kept in `failure` (the one exception, never
an `ExceptionGroup`) and calls `on_failure`, so the workspace stops rather than run half-watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

logger = logging.getLogger("ipybox.supervisor")

Watcher = Callable[[], Coroutine[Any, Any, None]]


class Watchers:
    """Runs watchers until stopped; see the module docstring.

    Args:
        on_failure: Called once when a watcher fails (after `failure` is set).
    """

    def __init__(self, on_failure: Callable[[], None]) -> None:
        self.on_failure = on_failure
        self.failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, watchers: list[Watcher]) -> None:
        if self._task is not None:
            raise RuntimeError("the watchers are running already")
        self._task = asyncio.create_task(self._run(watchers), name="ipybox-watchers")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, watchers: list[Watcher]) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                for watcher in watchers:
                    group.create_task(watcher())
        except Exception as e:
            self.failure = e.exceptions[0] if isinstance(e, ExceptionGroup) else e
            logger.error("a watcher of the workspace failed: stopping it", exc_info=self.failure)
            self.on_failure()
