"""Warming kernels up (`ipybox.kernels.warm_up`): what a tool call needs is imported before a kernel is handed
out, invisibly to the code run in it, and never at the cost of a kernel somebody already waits for; the warm
pool starts a claimed kernel's replacement after `REFILL_DELAY`, not while the claimer attaches.

On a real gateway with real kernels (ipybox's own kernel spec)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from ipybox.kernels import pool as pool_module
from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.kernel_client import KernelClient
from ipybox.kernels.kernel_connection import KernelConnection
from ipybox.kernels.pool import REFILL_DELAY, KernelPool
from ipybox.kernels.warm_up import WARM_UP_STEPS, warm_up

pytestmark = pytest.mark.integration

# What a cell sees of the kernel: which modules the warm-up is about are imported, the user's names, the
# history. Printed as one JSON line.
LOOK = """
import json as _json, sys as _sys
print(_json.dumps({
    "pydantic": "pydantic.main" in _sys.modules,
    "runner": "ipybox.tool_exec.client" in _sys.modules,
    "mcptools": any(name.split(".")[0] == "mcptools" for name in _sys.modules),
    "leftover_module": "__ipybox_warm_up__" in _sys.modules,
    "names": sorted(n for n in globals() if not n.startswith("_") and n not in ("In", "Out", "exit", "quit", "get_ipython", "open")),
    "history": len(In),
}))
"""


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[KernelGateway]:
    async with KernelGateway() as gateway:
        yield gateway


@pytest.fixture
async def http(gateway: KernelGateway) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Authorization": f"token {gateway.token}"}) as http:
        yield http


async def warm_pool(pool: KernelPool) -> None:
    """Until the pool has an idle kernel and has warmed it up (the guard is pytest's timeout)."""
    while not pool.idle or tasks_named("ipybox-pool-warm-up"):
        await asyncio.sleep(0.05)


def tasks_named(name: str) -> list[asyncio.Task[object]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == name]


async def kernel_ids(http: aiohttp.ClientSession, gateway: KernelGateway) -> set[str]:
    async with http.get(f"{gateway.endpoint.url}/api/kernels") as response:
        return {kernel["id"] for kernel in await response.json()}


async def look(kernel: KernelConnection) -> tuple[dict[str, object], int | None]:
    """What `LOOK` prints in `kernel` (all of its output, up to the idle status), and the cell's execution
    count."""
    request = kernel.execute(LOOK)
    text, count = "", None
    try:
        while not request.done:
            message = await request.next(60)
            if message.msg_type == "stream":
                text += message.content["text"]
            elif message.msg_type == "execute_reply":
                count = message.content.get("execution_count")
    finally:
        kernel.finish(request)
    return json.loads(text), count


async def test_a_warmed_up_kernel_has_pydantic_and_the_tool_runner_and_its_first_cell_sees_nothing_else(
    gateway: KernelGateway, http: aiohttp.ClientSession
) -> None:
    kernel = await KernelConnection.open(http, gateway.endpoint)
    try:
        assert await warm_up(kernel)
        seen, count = await look(kernel)
    finally:
        await kernel.shutdown()
    assert seen["pydantic"] and seen["runner"]
    # Silent, in a namespace of its own: no name, no history, no execution count, no generated package.
    assert seen["names"] == [] and seen["history"] == 2  # In[0] is "", In[1] this cell
    assert count == 1
    assert not seen["mcptools"] and not seen["leftover_module"]


async def test_a_warm_up_ends_before_its_next_step_once_the_kernel_is_wanted(
    gateway: KernelGateway, http: aiohttp.ClientSession
) -> None:
    asked = 0

    def go_on() -> bool:  # wanted once the first step is done
        nonlocal asked
        asked += 1
        return asked == 1

    kernel = await KernelConnection.open(http, gateway.endpoint)
    try:
        assert await warm_up(kernel, go_on)
        seen, _ = await look(kernel)
    finally:
        await kernel.shutdown()
    assert asked == 2 and len(WARM_UP_STEPS) > 2
    assert seen["runner"] and not seen["pydantic"]  # the first step ran, the rest did not


async def test_a_clients_first_kernel_starts_cold_and_its_spare_is_warm_when_a_reset_takes_it(
    gateway: KernelGateway,
) -> None:
    async with KernelClient(gateway.endpoint, warm_up=True) as client:
        first = json.loads((await client.execute(LOOK)).text or "")
        spare = client._spare
        assert spare is not None
        await asyncio.wait({spare})  # started and warmed up (the guard is pytest's timeout)
        await client.reset()
        after_reset = json.loads((await client.execute(LOOK)).text or "")
    assert not first["pydantic"]  # handed out at once: nothing ran before the caller's first cell
    assert after_reset["pydantic"] and after_reset["runner"] and after_reset["names"] == []


async def test_the_pool_hands_out_warm_kernels_and_a_claim_that_waits_gets_its_kernel_cold(
    gateway: KernelGateway, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The second claim waits for a kernel start, which on a loaded machine takes longer than the window
    # that makes it a claim in a row: widened, so the test checks the behaviour, not the machine's speed.
    monkeypatch.setattr(pool_module, "IN_A_ROW", 120.0)
    before = await kernel_ids(http, gateway)  # of the tests before (deleted in the background)
    pool = KernelPool(gateway.endpoint, 1, lambda caller: {}, warm_up=True)
    await pool.start()
    claimed: list[KernelConnection] = []
    try:
        await warm_pool(pool)
        warm = await pool.claim()
        # The replacement starts after REFILL_DELAY (not while the claimer connects): a claim right away
        # finds no kernel, starts one itself and gets it as soon as it answers, without a warm-up.
        assert pool.idle == 0 and not pool._starting
        cold = await pool.claim()
        # A claim right after another (resets back to back) starts the replacement at once: the next
        # claim waits on that head start.
        assert pool.idle == 0 and len(pool._starting) == 1
        for kernel_id in (warm, cold):
            claimed.append(await KernelConnection.attach(http, gateway.endpoint, kernel_id))
        (warm_seen, _), (cold_seen, _) = [await look(kernel) for kernel in claimed]
        assert warm_seen["pydantic"] and warm_seen["runner"] and warm_seen["names"] == []
        assert not cold_seen["pydantic"]
        # The delayed refill of the first claim then starts no second kernel.
        await asyncio.sleep(REFILL_DELAY + 0.1)
        assert pool.idle + len(pool._starting) == 1
        await warm_pool(pool)
        assert await kernel_ids(http, gateway) - before == {warm, cold, *pool.idle_kernels}
    finally:
        for kernel in claimed:
            await kernel.shutdown()
        await pool.stop()


async def test_a_claim_cuts_the_warm_up_of_an_idle_kernel_short(
    gateway: KernelGateway, http: aiohttp.ClientSession
) -> None:
    pool = KernelPool(gateway.endpoint, 1, lambda caller: {}, warm_up=True)
    await pool.start()
    try:
        while not pool.idle:
            await asyncio.sleep(0.01)
        [warming] = tasks_named("ipybox-pool-warm-up")
        kernel_id = await pool.claim()
        await asyncio.wait({warming})  # ended with the pool's connection to the kernel, mid-step
        kernel = await KernelConnection.attach(http, gateway.endpoint, kernel_id)
        try:
            seen, count = await look(kernel)
        finally:
            await kernel.shutdown()
    finally:
        await pool.stop()
    assert not warming.cancelled()  # ended by its connection closing under it, not by the pool stopping
    assert not seen["pydantic"]  # the steps after the one in progress did not run
    assert count == 1 and seen["names"] == []  # the claimer's first cell ran, as the first, after that step
