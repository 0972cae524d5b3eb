"""`LeasedKernelClient` on a real gateway: when its kernel was replaced between two executions and the lease
answer said why, the next execution starts with one notice (a chunk, the result's text, or the error's
message), told once; a reset asked for says nothing.

Here the kernel dies while idle (a timer in it calls `os._exit`), which takes the same path in the client as
a kernel the workspace deleted: noticed dead, replaced at the next execution, `replaced` asked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ipybox import CodeExecutionChunk, CodeExecutionError, CodeExecutionResult
from ipybox.kernels.gateway import KernelGateway
from ipybox.running.leased_client import NOTICE, LeasedKernelClient

pytestmark = pytest.mark.integration

WHY = "it was idle for 3 s, longer than [kernel] max_idle (2 s), so ipybox deleted it to free its memory"


class Lease:
    """Plays the lease's answers: `why` is what the next kernel's answer said, told once."""

    def __init__(self) -> None:
        self.why: str | None = None

    def replaced(self) -> str | None:
        why, self.why = self.why, None
        return why


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[KernelGateway]:
    async with KernelGateway() as gateway:
        yield gateway


@pytest.fixture
async def lease() -> Lease:
    return Lease()


@pytest.fixture
async def client(gateway: KernelGateway, lease: Lease) -> AsyncIterator[LeasedKernelClient]:
    async with LeasedKernelClient(gateway.endpoint, spare_kernel=False, replaced=lease.replaced) as client:
        yield client


async def lose_kernel_while_idle(client: LeasedKernelClient, lease: Lease) -> None:
    await client.execute("x = 1\nimport os, threading\nthreading.Timer(0.2, os._exit, [1]).start()")
    kernel = client._kernel
    assert kernel is not None
    while not kernel.dead:  # noticed from the gateway's status message; the guard is pytest's timeout
        await asyncio.sleep(0.05)
    lease.why = WHY  # what the lease answer for the replacement will say


async def test_the_next_execution_starts_with_the_notice_once(
    client: LeasedKernelClient, lease: Lease
) -> None:
    await lose_kernel_while_idle(client, lease)
    items = [item async for item in client.stream("print('fresh')")]
    notice = NOTICE.format(why=WHY)
    assert items[0] == CodeExecutionChunk(f"{notice}\n", "stderr")
    result = items[-1]
    assert isinstance(result, CodeExecutionResult)
    assert result.text == f"{notice}\nfresh" and result.stderr == notice and result.stdout == "fresh"
    assert (await client.execute("print('again')")).text == "again"  # told once


async def test_code_that_fails_on_the_fresh_kernel_says_why_its_state_is_gone(
    client: LeasedKernelClient, lease: Lease
) -> None:
    await lose_kernel_while_idle(client, lease)
    with pytest.raises(CodeExecutionError) as caught:
        await client.execute("print(x)")
    assert str(caught.value).startswith(NOTICE.format(why=WHY) + "\n")
    assert "NameError" in str(caught.value) and caught.value.ename == "NameError"


async def test_a_reset_asked_for_says_nothing(client: LeasedKernelClient, lease: Lease) -> None:
    await lose_kernel_while_idle(client, lease)
    await client.reset()
    assert (await client.execute("print('quiet')")).text == "quiet"
