"""`Watchers` in process: one task group, stopped together; a failing watcher stops the rest and is
reported as the one exception it raised."""

from __future__ import annotations

import asyncio

from ipybox.supervisor.watchers import Watcher, Watchers


async def test_stopping_cancels_every_watcher() -> None:
    cancelled: list[str] = []

    def forever(name: str) -> Watcher:
        async def watch() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(name)
                raise

        return watch

    watchers = Watchers(on_failure=lambda: None)
    watchers.start([forever("a"), forever("b")])
    await asyncio.sleep(0.01)
    await watchers.stop()
    assert sorted(cancelled) == ["a", "b"] and watchers.failure is None


async def test_a_failing_watcher_stops_the_others_and_is_reported_once_unwrapped() -> None:
    stopped = asyncio.Event()
    other_cancelled = asyncio.Event()

    async def broken() -> None:
        raise ValueError("a bug in a watcher")

    async def steady() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            other_cancelled.set()
            raise

    watchers = Watchers(on_failure=stopped.set)
    watchers.start([steady, broken])
    await asyncio.wait_for(stopped.wait(), 5)
    assert isinstance(watchers.failure, ValueError) and str(watchers.failure) == "a bug in a watcher"
    assert other_cancelled.is_set()
    await watchers.stop()
