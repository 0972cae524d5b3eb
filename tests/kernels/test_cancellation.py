"""Closing a kernel connection or a kernel client never swallows the caller's cancellation, and leaves no task
of theirs running (`ipybox.lifecycle`'s rules, on a real gateway)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.kernel_client import KernelClient
from ipybox.kernels.kernel_connection import KernelConnection

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[KernelGateway]:
    async with KernelGateway() as gateway:
        yield gateway


@pytest.fixture
async def http(gateway: KernelGateway) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Authorization": f"token {gateway.token}"}) as http:
        yield http


@pytest.fixture
async def before() -> set[asyncio.Task[object]]:
    """The tasks running when the test starts: other tests of this worker may hold kernels of their own."""
    return set(asyncio.all_tasks())


def tasks_named(prefix: str, before: set[asyncio.Task[object]]) -> list[asyncio.Task[object]]:
    return [task for task in asyncio.all_tasks() - before if task.get_name().startswith(prefix)]


async def test_a_caller_cancelled_while_a_kernel_connection_closes_sees_its_cancellation(
    gateway: KernelGateway, http: aiohttp.ClientSession, before: set[asyncio.Task[object]]
) -> None:
    kernel = await KernelConnection.open(http, gateway.endpoint, ready_timeout=60)
    try:
        # The cancellation lands after 0, 1, 2, ... steps of the shutdown: at each of its awaits in turn
        # (the websocket's close, its reader and writer stopping), until one shutdown ends before it.
        cancelled_at = []
        for steps in range(200):
            connection = await KernelConnection.attach(http, gateway.endpoint, kernel.kernel_id)
            closing = asyncio.create_task(connection.shutdown(delete=False))
            for _ in range(steps):
                await asyncio.sleep(0)
            if closing.done():
                break
            closing.cancel()
            await asyncio.wait({closing})
            assert closing.cancelled(), f"a cancellation after {steps} steps of the shutdown was swallowed"
            cancelled_at.append(steps)
            await connection.shutdown(delete=False)  # a later shutdown finishes what the cancelled one began
        assert len(cancelled_at) >= 3  # several awaits of the shutdown were hit, not just its first
        # Of all the connections to this kernel, only the open one still reads, writes and has a task group.
        assert len(tasks_named(f"ipybox-kernel-{kernel.kernel_id[:8]}", before)) == 1
        assert tasks_named("ipybox-kernel connection", before) == [kernel._tasks._host]
    finally:
        await kernel.shutdown()


async def test_a_connection_dropped_after_a_shutdown_cut_short_leaves_no_task_behind(
    gateway: KernelGateway, http: aiohttp.ClientSession, before: set[asyncio.Task[object]]
) -> None:
    # A pool's claim cancelled while it closed the claimed kernel's connection never shuts it down again:
    # its task group must end all the same (it used to wait forever, until the garbage collector destroyed
    # it pending, which on Python 3.11.7 can break an `ast.parse` running meanwhile).
    kernel = await KernelConnection.open(http, gateway.endpoint, ready_timeout=60)
    try:
        for steps in range(1, 4):  # from 1: a task cancelled before its first step never starts the shutdown
            connection = await KernelConnection.attach(http, gateway.endpoint, kernel.kernel_id)
            closing = asyncio.create_task(connection.shutdown(delete=False))
            for _ in range(steps):
                await asyncio.sleep(0)
            closing.cancel()
            await asyncio.wait({closing})
            assert closing.cancelled()
        async with asyncio.timeout(10):
            while tasks_named("ipybox-kernel connection", before) != [kernel._tasks._host]:
                await asyncio.sleep(0.01)
        assert len(tasks_named(f"ipybox-kernel-{kernel.kernel_id[:8]}", before)) == 1
    finally:
        await kernel.shutdown()


async def test_a_connection_whose_kernel_went_away_keeps_no_reader_or_writer(
    gateway: KernelGateway, http: aiohttp.ClientSession, before: set[asyncio.Task[object]]
) -> None:
    kernel = await KernelConnection.open(http, gateway.endpoint, ready_timeout=60)
    assert tasks_named(f"ipybox-kernel-{kernel.kernel_id[:8]}", before)  # reading and writing while it lives
    async with http.delete(f"{gateway.endpoint.url}/api/kernels/{kernel.kernel_id}") as response:
        assert response.status == 204
    async with asyncio.timeout(10):
        while not kernel.dead:
            await asyncio.sleep(0.01)
        while tasks_named(f"ipybox-kernel-{kernel.kernel_id[:8]}", before):
            await asyncio.sleep(0.01)
    await kernel.shutdown(delete=False)


async def test_a_caller_cancelled_while_a_client_disconnects_sees_its_cancellation_and_nothing_is_left(
    gateway: KernelGateway, before: set[asyncio.Task[object]]
) -> None:
    client = KernelClient(gateway.endpoint, spare_kernel=True)
    await client.connect()
    assert tasks_named("ipybox-spare-kernel", before)  # the spare is still starting
    disconnecting = asyncio.create_task(client.disconnect())
    await asyncio.sleep(0)  # now waiting for the spare's start to be cancelled (it deletes its kernel)
    disconnecting.cancel()
    await asyncio.wait({disconnecting})
    assert disconnecting.cancelled()
    # Its background work and its session were closed even so, and it can connect again.
    for prefix in (
        "ipybox-spare-kernel",
        "ipybox-kernel client",
        "ipybox-kernel-",
        "ipybox-kernel connection",
    ):
        assert tasks_named(prefix, before) == [], prefix
    assert client._http is None
    async with client:
        assert (await client.execute("print(6 * 7)")).text == "42"
