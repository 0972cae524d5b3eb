"""Recovery in a running workspace (`ipybox up`, here an in-process Supervisor) from the death of an
attached kernel, of the warm pool's idle kernel and of the gateway, `ROUNDS` times in a row each
(4, or IPYBOX_TEST_RECOVERY_ROUNDS: tests/kernels/kernel_processes.py says why 4 cover every path, and
when to run more).

What is asserted is that no call waited for a kernel's ready timeout (they are counted where it fires),
not how long calls took: the bench (`python -m bench kernel --only recovery`) prints the times.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest

from ipybox import CodeExecutionChunk, CodeExecutor
from ipybox.kernels import pool
from ipybox.kernels.result import KernelDiedError
from ipybox.supervisor import Supervisor
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


@pytest.fixture(scope="module")
def short_ready_timeout() -> Iterator[None]:
    # And no refill delay: every round claims twice and then waits for the refill, which the delay (it
    # keeps a kernel start away from the attach that claimed) would only slow, by ROUNDS x 3 x 0.6 s here.
    saved = pool.READY_TIMEOUT, pool.REFILL_DELAY
    pool.READY_TIMEOUT, pool.REFILL_DELAY = READY_TIMEOUT, 0.0
    yield
    pool.READY_TIMEOUT, pool.REFILL_DELAY = saved


@pytest.fixture(scope="module")
async def workspace_up(
    tmp_path_factory: pytest.TempPathFactory, short_ready_timeout: None
) -> AsyncIterator[Supervisor]:
    workspace = tmp_path_factory.mktemp("recovering")
    (workspace / "ipybox.toml").write_text("[kernel]\nwarm_pool = 1\n\n[sandbox]\nenabled = false\n")
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


@pytest.fixture
async def attached(workspace_up: Supervisor) -> AsyncIterator[CodeExecutor]:
    async with CodeExecutor(workspace=workspace_up.workspace) as executor:
        executor.kernel_client.ready_timeout = READY_TIMEOUT
        yield executor


async def pool_ready(supervisor: Supervisor) -> str:
    """The id of the pool's idle kernel, once there is one."""
    for _ in range(3000):
        if supervisor.pool is not None and supervisor.pool.idle_kernels:
            return supervisor.pool.idle_kernels[0]
        await asyncio.sleep(0.01)
    raise AssertionError("the warm pool did not refill")


def gateway_pid(supervisor: Supervisor) -> int:
    assert supervisor.gateway is not None and supervisor.gateway.pid is not None
    return supervisor.gateway.pid


async def test_kernel_death_then_reset(attached: CodeExecutor, workspace_up: Supervisor) -> None:
    before = ready_timeouts()
    for i in range(ROUNDS):
        async with asyncio.timeout(ROUND_LIMIT):
            await attached.execute(f"state = {i}")
            with pytest.raises(KernelDiedError, match="its process exited"):
                await attached.execute("import os; os._exit(1)")
            assert (await attached.execute("print('alive', 'state' in globals())")).text == "alive False"
            await pool_ready(workspace_up)
            await attached.reset()
            assert (await attached.execute("print('after reset')")).text == "after reset"
    assert ready_timeouts() == before


async def test_pool_kernel_death_then_reset(attached: CodeExecutor, workspace_up: Supervisor) -> None:
    """The pool's idle kernel dies while idle (even rounds) or while it starts (odd rounds)."""
    before = ready_timeouts()
    for i in range(ROUNDS):
        async with asyncio.timeout(ROUND_LIMIT):
            idle = await pool_ready(workspace_up)
            gateway = gateway_pid(workspace_up)
            if i % 2 == 0:
                # The kernel killed while starting last round may be between the gateway's restart of it
                # and its new process: wait for a process to kill.
                for _ in range(500):
                    if idle in kernel_processes(gateway):
                        break
                    await asyncio.sleep(0.01)
                    idle = await pool_ready(workspace_up)
                kill_kernel(gateway, idle)
                while workspace_up.pool is not None and idle in workspace_up.pool.idle_kernels:
                    await asyncio.sleep(0.01)  # until the pool saw it die (and started another)
            known = set(kernel_processes(gateway))
            await attached.reset()
            if i % 2 == 1:
                # The reset claimed the idle kernel and the pool started the next: kill it while it starts.
                await kill_next_kernel(gateway, known)
            assert (await attached.execute("print('ok')")).text == "ok"
    await pool_ready(workspace_up)
    await attached.reset()
    assert (await attached.execute("print('last')")).text == "last"
    assert ready_timeouts() == before


async def test_gateway_death(attached: CodeExecutor, workspace_up: Supervisor) -> None:
    """The gateway dies under a running cell (even rounds: KernelDiedError naming the gateway) or while
    the application is idle (odd rounds: nothing to see); either way the next calls work on the restarted
    gateway."""
    before, restarts = ready_timeouts(), workspace_up.restarts["gateway"]
    for i in range(ROUNDS):
        async with asyncio.timeout(ROUND_LIMIT):
            await pool_ready(workspace_up)
            await attached.execute(f"state = {i}")
            if i % 2 == 0:
                stream = attached.stream(
                    "print('running', flush=True)\nimport time\ntime.sleep(120)", chunks=True
                )
                first = await anext(stream)
                assert isinstance(first, CodeExecutionChunk) and first.text.strip() == "running"
                os.kill(gateway_pid(workspace_up), signal.SIGKILL)
                with pytest.raises(KernelDiedError, match="the kernel gateway went away") as info:
                    async for _ in stream:
                        pass
                assert "replaced by a fresh kernel" in str(info.value)
            else:
                os.kill(gateway_pid(workspace_up), signal.SIGKILL)
                kernel = attached.kernel_client._kernel
                while kernel is not None and not kernel.dead:  # noticed while idle
                    await asyncio.sleep(0.01)
            assert (await attached.execute("print('state' in globals())")).text == "False"
            await pool_ready(workspace_up)
            await attached.reset()
            assert (await attached.execute("print('after reset')")).text == "after reset"
    assert workspace_up.restarts["gateway"] == restarts + ROUNDS
    assert ready_timeouts() == before
