"""`Service`: the lifecycle of a long-lived part of ipybox, and `cancel_and_wait`, the one way to stop a task.

A service has an explicit state (`ServiceState`): `new` -> `starting` -> `running` -> `closing` -> `closed`.

Contract:

- `start()` once, from `new` (a second start, or a start after `aclose()`, is a `RuntimeError` naming the
  service and its state). It runs the subclass's `_startup()`; if that raises (or is cancelled), what the
  service spawned is cancelled, `_shutdown()` runs to undo what `_startup()` did, the state is `closed`,
  and the one error is raised.
- `aclose()` closes it from any state and is idempotent: a second call (also concurrent with the first)
  waits for the first to end and returns. It cancels the service's background work, waits until every
  task of it has ended, then runs `_shutdown()`. Failures of that work were reported when they happened
  (`failure`, `on_failure`), so `aclose()` does not raise them again.
- `async with service:` is `start()` then `aclose()`.
- Background work belongs to the service's task group (`spawn()`): an `asyncio.TaskGroup` hosted in a task
  of its own (the group outlives the call that spawns into it). A task that raises cancels the rest of the
  group; its exception (the first one, unwrapped from the `ExceptionGroup`) is kept in `failure` and passed
  to `on_failure` once: whoever composes the service decides what a failure means (the supervisor stops
  the workspace). `spawn()` after the group ended (closed, or failed) is a `RuntimeError`.
- Work scoped to one call (a websocket's reader and writer) runs in a task group of that call's scope,
  `task_scope()`, which raises the one error that ended it (not an `ExceptionGroup`, which would change
  what the caller catches); `first_of(a(), b())` runs both until the first ends, then cancels the other.
- Cancellation is never swallowed: `cancel_and_wait(task)` cancels a task and waits until it ended, and if
  the *caller* is cancelled meanwhile, that `CancelledError` propagates (the pattern it replaces,
  `task.cancel(); with suppress(BaseException): await task`, cannot tell the task's cancellation from the
  caller's, and swallows both). `aclose()` is built on it: a caller cancelled while closing sees its
  cancellation, and the state stays `closing` (a later `aclose()` finishes the job).

Where these are used and why (the services of the supervisor, the task scopes of a websocket handler):
`docs/design.md`, "Services" and "Threading and cancellation".
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

logger = logging.getLogger("ipybox")

T = TypeVar("T")


class ServiceState(enum.Enum):
    """Where a `Service` is in its life (see the module docstring)."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


async def cancel_and_wait(task: asyncio.Future[Any]) -> BaseException | None:
    """Cancel `task` and wait until it has ended.

    Returns:
        The exception `task` ended with, other than its cancellation (`None` if it was cancelled or returned),
        for the caller to log or ignore: the task's own failure is never raised here.

    Raises:
        CancelledError: The caller itself was cancelled while waiting (`task` is cancelled then, and ends
            on its own).
    """
    task.cancel()
    # `asyncio.wait` never raises what the task raised, so a `CancelledError` out of it is the caller's own.
    await asyncio.wait({task})
    if task.cancelled():
        return None
    return task.exception()


@contextlib.asynccontextmanager
async def task_scope() -> AsyncIterator[asyncio.TaskGroup]:
    """An `asyncio.TaskGroup` for work scoped to one call (`async with task_scope() as group:`), that
    raises the error that ended it, the first one unwrapped, rather than an `ExceptionGroup`: the caller
    sees what it would see had the work run inline.

    Raises:
        The first exception of the body or of a task; the caller's own `CancelledError`.
    """
    try:
        async with asyncio.TaskGroup() as group:
            yield group
    except BaseExceptionGroup as e:
        error = _first_leaf(e)
        raise error from error.__cause__


async def first_of(*works: Coroutine[Any, Any, Any]) -> None:
    """Run `works` concurrently in a `task_scope()` until the first of them ends; the others are cancelled
    and waited for. For a connection's loops, e.g. reading a websocket while writing to it: whichever ends
    (the peer left, the work is done) ends the connection.

    Raises:
        The exception of a work that raised (the first); the caller's own `CancelledError`.
    """
    async with task_scope() as group:
        tasks = [group.create_task(work) for work in works]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()


@contextlib.contextmanager
def handling_signals(request_stop: Callable[[], None]) -> Iterator[None]:
    """While open, SIGTERM, SIGINT and SIGHUP call `request_stop` (in the running loop) instead of ending the
    process: whoever runs the service stops it in order."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for signum in signals:
        loop.add_signal_handler(signum, request_stop)
    try:
        yield
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


class Service:
    """A long-lived part with a start, a close and background work; see the module docstring.

    Subclasses override `_startup()` and `_shutdown()`, and spawn their loops with `spawn()`.

    Args:
        name: What the service is, for errors and the log (e.g. `"kernels"`).
        on_failure: Called once, with the exception, when a task of the service's group fails.

    Example:
        ```python
        class Ticker(Service):
            async def _startup(self) -> None:
                self.spawn(self._tick())

            async def _tick(self) -> None:
                while True:
                    await asyncio.sleep(1)

        async with Ticker("ticker"):
            ...  # ticking; leaving the block cancels it and waits until it stopped
        ```
    """

    def __init__(self, name: str, *, on_failure: Callable[[BaseException], None] | None = None) -> None:
        self.name = name
        self.on_failure = on_failure
        self.failure: BaseException | None = None
        self._state = ServiceState.NEW
        self._group: asyncio.TaskGroup | None = None
        self._host: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._closer = False  # a call of `aclose()` is closing it now

    @property
    def state(self) -> ServiceState:
        return self._state

    @property
    def running(self) -> bool:
        """Started and not closing (nor closed)."""
        return self._state is ServiceState.RUNNING

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the service (`_startup()`); on failure close what it started and raise the one error.

        Raises:
            RuntimeError: The service was started before.
        """
        if self._state is not ServiceState.NEW:
            raise RuntimeError(f"the {self.name} service was started before (it is {self._state.value})")
        self._state = ServiceState.STARTING
        entered: asyncio.Future[asyncio.TaskGroup] = asyncio.get_running_loop().create_future()
        # The group's host: the one task here not in a group, since the group must outlive this call.
        self._host = asyncio.create_task(self._host_group(entered), name=f"ipybox-{self.name}")
        try:
            self._group = await entered
            await self._startup()
        except BaseException:
            await self._close()
            raise
        if self._state is ServiceState.STARTING:  # not closed meanwhile
            self._state = ServiceState.RUNNING

    async def aclose(self) -> None:
        """Cancel the background work, wait for it to end, then `_shutdown()`. Idempotent; see the module
        docstring for a caller cancelled meanwhile."""
        if self._state is ServiceState.NEW:
            self._mark_closed()
            return
        await self._close()

    def spawn(self, work: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Run `work` as a task of the service's group (cancelled by `aclose()`).

        Raises:
            RuntimeError: The service is not starting or running, or its group ended (a task failed).
        """
        group = self._group
        if group is None or self._state not in (ServiceState.STARTING, ServiceState.RUNNING):
            work.close()
            raise RuntimeError(f"the {self.name} service is {self._state.value}: it runs no background work")
        if self._host is None or self._host.done():
            work.close()
            raise RuntimeError(f"the {self.name} service stopped its background work after a failure")
        return group.create_task(work, name=name)

    async def _startup(self) -> None:
        """Start what the service holds (override). May `spawn()`."""

    async def _shutdown(self) -> None:
        """Stop what `_startup()` started, also after a `_startup()` that failed part way (override)."""

    # -- the group

    async def _host_group(self, entered: asyncio.Future[asyncio.TaskGroup]) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                entered.set_result(group)
                # Until `aclose()` cancels this task (the group then cancels its tasks and waits for them),
                # or a task fails (the group then cancels this task, and raises the failure below).
                await asyncio.get_running_loop().create_future()
        except Exception as e:
            failure = _first_leaf(e)
            self.failure = failure
            logger.error("background work of the %s service failed", self.name, exc_info=failure)
            if self.on_failure is not None:
                self.on_failure(failure)

    async def _close(self) -> None:
        if self._state is ServiceState.CLOSED:
            return
        if self._closer:  # another call is closing it: wait for that one
            await self._closed.wait()
            return
        self._closer = True
        self._state = ServiceState.CLOSING
        try:
            host = self._host
            if host is not None:
                await cancel_and_wait(host)
            await self._shutdown()
        except asyncio.CancelledError:
            raise  # the caller's: it stays closing, and a later `aclose()` finishes
        except BaseException:
            self._mark_closed()
            raise
        else:
            self._mark_closed()
        finally:
            self._closer = False

    def _mark_closed(self) -> None:
        self._state = ServiceState.CLOSED
        self._closed.set()


def _first_leaf(error: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: the one a person should see."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error
