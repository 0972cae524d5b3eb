"""Recovery from the death of a kernel, of the spare kernel and of the gateway, with the SDK
(`CodeExecutor`), `ROUNDS` times in a row each
(4, or IPYBOX_TEST_RECOVERY_ROUNDS: tests/kernels/kernel_processes.py says why 4 cover every path, and
when to run more).

What is asserted is that no call waited for a kernel's ready timeout (they are counted where it fires),
not how long calls took: the bench (`python -m bench kernel --only recovery`) prints the times.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox import CodeExecutionChunk, CodeExecutor, process
from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.kernel_client import KernelClient
from ipybox.kernels.kernel_connection import GatewayUnreachableError, KernelConnection, KernelStartError
from ipybox.kernels.kernelspec import KernelSpec
from ipybox.kernels.result import KernelDiedError
from tests.kernels.kernel_processes import (
    kernel_processes,
    kill_kernel,
    kill_next_kernel,
    ready_timeouts,
    recovery_rounds,
)

# About 2.6 s a round in CI, and a few seconds of set-up (the suite's schedule: tests/conftest.py).
pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=12)]

ROUNDS = recovery_rounds()
# Short, so that a regression fails fast; a kernel that starts takes about a second here.
READY_TIMEOUT = 15.0
ROUND_LIMIT = 60  # seconds: a hang fails the round instead of the whole session


@pytest.fixture
async def recovering(tmp_path: Path) -> AsyncIterator[CodeExecutor]:
    async with CodeExecutor(working_dir=tmp_path, images_dir=tmp_path / "images") as executor:
        executor.kernel_client.ready_timeout = READY_TIMEOUT
        yield executor


async def spare_ready(client: KernelClient) -> KernelConnection:
    """The spare kernel, once it answers."""
    for _ in range(3000):
        spare = client._spare
        if spare is not None and spare.done():
            kernel = spare.result()  # None: it failed to start
            if kernel is not None and not kernel.dead:
                return kernel
        await asyncio.sleep(0.01)
    raise AssertionError("the spare kernel did not come up")


def gateway_pid(executor: CodeExecutor) -> int:
    assert executor.kernel_gateway is not None and executor.kernel_gateway.pid is not None
    return executor.kernel_gateway.pid


async def test_kernel_death_then_reset(recovering: CodeExecutor) -> None:
    """The issue's sequence: a cell kills its kernel, the next execute runs on the spare, and a later
    reset swaps in the next spare."""
    before = ready_timeouts()
    for i in range(ROUNDS):
        async with asyncio.timeout(ROUND_LIMIT):
            await recovering.execute(f"state = {i}")
            with pytest.raises(KernelDiedError, match="its process exited"):
                await recovering.execute("import os; os._exit(1)")
            assert (await recovering.execute("print('alive', 'state' in globals())")).text == "alive False"
            await spare_ready(recovering.kernel_client)  # the user's next turn comes later
            await recovering.reset()
            assert (await recovering.execute("print('after reset')")).text == "after reset"
    assert ready_timeouts() == before


async def test_spare_death_then_reset(recovering: CodeExecutor) -> None:
    """The spare dies while idle (even rounds) or while it starts (odd rounds); reset still gets a
    working kernel."""
    client = recovering.kernel_client
    gateway = gateway_pid(recovering)
    before = ready_timeouts()
    for i in range(ROUNDS):
        async with asyncio.timeout(ROUND_LIMIT):
            spare = await spare_ready(client)
            if i % 2 == 0:
                kill_kernel(gateway, spare.kernel_id)
                while not spare.dead:  # until the client saw it die (and started another)
                    await asyncio.sleep(0.01)
            known = set(kernel_processes(gateway))
            await recovering.reset()
            if i % 2 == 1:
                # The reset took the spare and started the next one: kill that one while it starts.
                await kill_next_kernel(gateway, known)
            assert (await recovering.execute("print('ok')")).text == "ok"
    await spare_ready(client)
    await recovering.reset()
    assert (await recovering.execute("print('last')")).text == "last"
    assert ready_timeouts() == before


async def test_gateway_death(tmp_path: Path) -> None:
    """The embedded gateway dies under a running cell (even rounds) or while idle (odd rounds): the cell
    fails with KernelDiedError naming the gateway and how it exited, and later calls with
    GatewayUnreachableError, at once."""
    before = ready_timeouts()
    for i in range(ROUNDS):
        async with asyncio.timeout(ROUND_LIMIT), CodeExecutor(working_dir=tmp_path) as executor:
            executor.kernel_client.ready_timeout = READY_TIMEOUT
            gateway = gateway_pid(executor)
            await spare_ready(executor.kernel_client)
            kernels = list(kernel_processes(gateway).values())
            assert len(kernels) == 2
            if i % 2 == 0:
                stream = executor.stream(
                    "print('running', flush=True)\nimport time\ntime.sleep(120)", chunks=True
                )
                first = await anext(stream)
                assert isinstance(first, CodeExecutionChunk) and first.text.strip() == "running"
                os.kill(gateway, signal.SIGKILL)
                with pytest.raises(KernelDiedError) as raised:
                    async for _ in stream:
                        pass
                assert "the kernel gateway went away: it exited with signal 9 (SIGKILL))" in str(raised.value)
                assert "no fresh kernel can be started without the gateway" in str(raised.value)
            else:
                await executor.execute("x = 1")
                os.kill(gateway, signal.SIGKILL)
                kernel = executor.kernel_client._kernel
                while kernel is not None and not kernel.dead:  # noticed while idle
                    await asyncio.sleep(0.01)
            with pytest.raises(GatewayUnreachableError, match="cannot reach the kernel gateway"):
                await executor.execute("print('no gateway')")
            with pytest.raises(GatewayUnreachableError):
                await executor.kernel_client.reset()
            # Its kernels follow the gateway (they notice their parent is gone); none is left behind.
            while any(process.is_alive(pid) for pid in kernels):
                await asyncio.sleep(0.05)
    assert ready_timeouts() == before


async def test_kernel_that_cannot_start_is_reported_with_its_error(tmp_path: Path) -> None:
    """A kernel whose process exits at once fails as soon as the gateway gives up on it, with the
    kernel's own error from the gateway's log, long before the ready timeout."""
    spec = KernelSpec(
        argv=[sys.executable, "-c", "import sys; sys.exit('kernel-boom: cannot start')", "{connection_file}"]
    )
    before = ready_timeouts()
    async with KernelGateway(kernel_spec=spec, working_dir=tmp_path) as gateway:
        client = KernelClient(gateway.endpoint, gateway_log=gateway.log_path, ready_timeout=120)
        with pytest.raises(KernelStartError, match="died while starting") as info:
            async with asyncio.timeout(ROUND_LIMIT):
                await client.connect()
    assert "kernel-boom: cannot start" in str(info.value)
    assert ready_timeouts() == before


async def test_ready_timeouts_are_counted(tmp_path: Path) -> None:
    """The counter the tests above rely on: a kernel that is alive but never answers."""
    spec = KernelSpec(argv=[sys.executable, "-c", "import time; time.sleep(60)", "{connection_file}"])
    before = ready_timeouts()
    async with KernelGateway(kernel_spec=spec, working_dir=tmp_path) as gateway:
        client = KernelClient(gateway.endpoint, ready_timeout=1, spare_kernel=False)
        with pytest.raises(TimeoutError, match="did not become ready within 1 s"):
            await client.connect()
    assert ready_timeouts() == before + 1
