"""`Service` and `cancel_and_wait` in process (pure asyncio, no processes): the states, one idempotent close,
the task group, and cancellation that is never swallowed."""

from __future__ import annotations

import asyncio

import pytest

from ipybox.lifecycle import Service, ServiceState, cancel_and_wait, first_of, task_scope


class Recorder(Service):
    """A service that records its hooks, and optionally fails in `_startup()`."""

    def __init__(self, *, fail_startup: bool = False, **kwargs: object) -> None:
        super().__init__("recorder", **kwargs)  # type: ignore[arg-type]
        self.fail_startup = fail_startup
        self.calls: list[str] = []

    async def _startup(self) -> None:
        self.calls.append("startup")
        self.spawn(asyncio.Event().wait())
        if self.fail_startup:
            raise OSError("the port is taken")

    async def _shutdown(self) -> None:
        self.calls.append("shutdown")


async def test_a_service_goes_from_new_through_running_to_closed() -> None:
    service = Recorder()
    assert service.state is ServiceState.NEW
    async with service:
        assert service.state is ServiceState.RUNNING and service.running
    assert service.state is ServiceState.CLOSED and not service.running
    assert service.calls == ["startup", "shutdown"]


async def test_closing_twice_shuts_down_once() -> None:
    service = Recorder()
    await service.start()
    await service.aclose()
    await service.aclose()
    assert service.calls == ["startup", "shutdown"]


async def test_concurrent_closes_both_return_after_one_shutdown() -> None:
    release = asyncio.Event()

    class Slow(Recorder):
        async def _shutdown(self) -> None:
            await release.wait()
            await super()._shutdown()

    service = Slow()
    await service.start()
    first = asyncio.ensure_future(service.aclose())
    second = asyncio.ensure_future(service.aclose())
    await asyncio.sleep(0.01)
    assert service.state is ServiceState.CLOSING and not first.done() and not second.done()
    release.set()
    await asyncio.gather(first, second)
    assert service.calls == ["startup", "shutdown"] and service.state is ServiceState.CLOSED


async def test_closing_a_service_never_started_runs_no_shutdown() -> None:
    service = Recorder()
    await service.aclose()
    assert service.state is ServiceState.CLOSED and service.calls == []


async def test_starting_twice_is_refused_naming_the_service_and_its_state() -> None:
    service = Recorder()
    async with service:
        with pytest.raises(RuntimeError, match="the recorder service was started before \\(it is running\\)"):
            await service.start()


async def test_starting_after_close_is_refused() -> None:
    service = Recorder()
    await service.aclose()
    with pytest.raises(RuntimeError, match="it is closed"):
        await service.start()


async def test_a_failed_startup_shuts_down_what_it_started_and_raises_the_one_error() -> None:
    service = Recorder(fail_startup=True)
    with pytest.raises(OSError, match="the port is taken"):
        await service.start()
    assert service.calls == ["startup", "shutdown"] and service.state is ServiceState.CLOSED


async def test_closing_cancels_every_background_task_and_waits_until_they_ended() -> None:
    ended: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)  # cleanup that takes a while: close waits for it
            ended.append(name)
            raise

    service = Service("watchers")
    await service.start()
    service.spawn(forever("a"))
    service.spawn(forever("b"))
    await asyncio.sleep(0.01)
    await service.aclose()
    assert sorted(ended) == ["a", "b"] and service.failure is None


async def test_a_failing_task_stops_the_others_and_is_reported_once_unwrapped() -> None:
    reported: list[BaseException] = []
    other_cancelled = asyncio.Event()

    async def broken() -> None:
        raise ValueError("a bug in a watcher")

    async def steady() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            other_cancelled.set()
            raise

    service = Service("watchers", on_failure=reported.append)
    await service.start()
    service.spawn(steady())
    service.spawn(broken())
    await asyncio.wait_for(other_cancelled.wait(), 5)
    await asyncio.sleep(0)
    assert isinstance(service.failure, ValueError) and str(service.failure) == "a bug in a watcher"
    assert reported == [service.failure]
    await service.aclose()
    assert reported == [service.failure]  # not reported again on close


async def test_spawning_after_a_failure_says_the_work_stopped() -> None:
    service = Service("watchers", on_failure=lambda e: None)
    await service.start()

    async def broken() -> None:
        raise ValueError("boom")

    task = service.spawn(broken())
    await asyncio.wait({task})
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="stopped its background work after a failure"):
        service.spawn(asyncio.sleep(1))
    await service.aclose()


async def test_spawning_on_a_closed_service_is_refused() -> None:
    service = Service("watchers")
    await service.start()
    await service.aclose()
    with pytest.raises(RuntimeError, match="the watchers service is closed"):
        service.spawn(asyncio.sleep(1))


async def test_cancel_and_wait_returns_the_tasks_own_failure_instead_of_raising_it() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ConnectionResetError("the socket went away") from None

    task = asyncio.ensure_future(fails_on_cancel())
    await asyncio.sleep(0)
    error = await cancel_and_wait(task)
    assert isinstance(error, ConnectionResetError)


async def test_cancel_and_wait_of_a_cancelled_or_finished_task_returns_none() -> None:
    task = asyncio.ensure_future(asyncio.Event().wait())
    await asyncio.sleep(0)
    assert await cancel_and_wait(task) is None and task.cancelled()
    done = asyncio.ensure_future(asyncio.sleep(0))
    await done
    assert await cancel_and_wait(done) is None


async def slow_to_stop(stopping: asyncio.Event) -> None:
    """A task whose cleanup takes a while after it is cancelled (e.g. closing a websocket)."""
    try:
        await asyncio.Event().wait()
    finally:
        stopping.set()
        await asyncio.shield(asyncio.sleep(0.2))


async def test_cancel_and_wait_propagates_the_callers_own_cancellation() -> None:
    stopping = asyncio.Event()
    task = asyncio.ensure_future(slow_to_stop(stopping))
    await asyncio.sleep(0)

    async def caller() -> str:
        await cancel_and_wait(task)
        return "went on as if nothing happened"

    outer = asyncio.ensure_future(caller())
    await stopping.wait()
    outer.cancel()  # the caller is cancelled while it waits for the task to stop
    with pytest.raises(asyncio.CancelledError):
        await outer
    await asyncio.wait({task})


async def test_the_pattern_it_replaces_swallows_the_callers_cancellation() -> None:
    """Why `cancel_and_wait` exists: the old pattern returns normally from a cancelled caller."""
    import contextlib

    stopping = asyncio.Event()
    task = asyncio.ensure_future(slow_to_stop(stopping))
    await asyncio.sleep(0)

    async def caller() -> str:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return "went on as if nothing happened"

    outer = asyncio.ensure_future(caller())
    await stopping.wait()
    outer.cancel()
    assert await outer == "went on as if nothing happened"


async def test_a_caller_cancelled_while_closing_sees_it_and_a_later_close_finishes() -> None:
    stopping = asyncio.Event()
    service = Recorder()
    await service.start()
    service.spawn(slow_to_stop(stopping))
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(service.aclose())
    await stopping.wait()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert service.state is ServiceState.CLOSING
    await service.aclose()
    assert service.state is ServiceState.CLOSED and service.calls == ["startup", "shutdown"]


async def test_task_scope_raises_the_first_error_itself_not_an_exception_group() -> None:
    async def fails() -> None:
        raise ConnectionResetError("the peer went away")

    with pytest.raises(ConnectionResetError, match="the peer went away"):
        async with task_scope() as group:
            group.create_task(fails())
            await asyncio.Event().wait()  # cancelled by the group when the task fails


async def test_first_of_cancels_the_rest_once_one_ends() -> None:
    cancelled = asyncio.Event()

    async def reader() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await asyncio.wait_for(first_of(reader(), asyncio.sleep(0.01)), 5)
    assert cancelled.is_set()


async def test_first_of_raises_the_error_of_the_work_that_failed() -> None:
    async def receive() -> None:
        raise OSError("the websocket broke")

    with pytest.raises(OSError, match="the websocket broke"):
        await first_of(receive(), asyncio.Event().wait())


async def test_first_of_propagates_the_callers_cancellation_and_stops_its_work() -> None:
    started, stopped = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    caller = asyncio.ensure_future(first_of(work(), asyncio.Event().wait()))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert stopped.is_set()
