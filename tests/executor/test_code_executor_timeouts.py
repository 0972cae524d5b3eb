"""`CodeExecutor`'s limits as ipybox 0.9.2 has them: `timeout=None` and `approval_timeout=None` mean no
limit, `kernel_init_timeout` is the time a kernel gets to become ready (also per `KernelClient.connect()`),
and the timeout error says the limit in 0.9.2's words before ours."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor
from ipybox.kernels.kernel_client import ExecutionTimeoutError, KernelClient

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def executor(
    tools_workspace: Path, mcptools: Path, tool_servers: dict[str, dict[str, Any]]
) -> AsyncIterator[CodeExecutor]:
    async with CodeExecutor(
        working_dir=tools_workspace,
        mcp_servers=tool_servers,
        spare_kernel=False,
        approval_timeout=None,
        kernel_init_timeout=None,
    ) as ex:
        yield ex


async def test_the_timeout_error_says_the_limit_as_ipybox_0_9_2_does_and_that_state_is_kept(
    executor: CodeExecutor,
) -> None:
    await executor.execute("kept = 'yes'")
    with pytest.raises(TimeoutError) as info:
        await executor.execute("import time\nwhile True:\n    time.sleep(0.05)", timeout=0.2)
    error = info.value
    assert isinstance(error, ExecutionTimeoutError) and not error.kernel_restarted
    assert str(error) == (
        "Code execution exceeded timeout of 0.20s (approval wait excluded). "
        "It was interrupted; the kernel keeps its state."
    )
    assert (await executor.execute("print(kept)")).text == "yes"


async def test_the_timeout_error_of_code_ignoring_interrupts_says_the_kernel_was_replaced(
    executor: CodeExecutor,
) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)"
    with pytest.raises(ExecutionTimeoutError) as info:
        await executor.execute(code, timeout=0.2)
    assert info.value.kernel_restarted
    assert str(info.value) == (
        "Code execution exceeded timeout of 0.20s (approval wait excluded). It did not stop when "
        "interrupted: the kernel was replaced by a fresh one and its state is lost."
    )


async def test_timeout_none_lets_a_cell_run_as_long_as_it_takes(executor: CodeExecutor) -> None:
    code = "import time\ntime.sleep(1.5)\nprint('done')"
    assert (await executor.execute(code, timeout=None)).text == "done"
    items = [item async for item in executor.stream(code, timeout=None)]
    assert isinstance(items[-1], CodeExecutionResult) and items[-1].text == "done"
    assert (await executor.kernel_client.execute(code, timeout=None)).text == "done"


async def test_approval_timeout_none_lets_a_late_decision_through(executor: CodeExecutor) -> None:
    assert executor.tool_server.approval.approval_timeout is None
    code = "from mcptools.edge import slow\nprint(slow.run(slow.Params(seconds=0)))"
    result: CodeExecutionResult | None = None
    async with asyncio.timeout(30):
        async for item in executor.stream(code, timeout=None):
            if isinstance(item, ApprovalRequest):
                await asyncio.sleep(1.5)  # a person taking their time
                await item.accept()
            elif isinstance(item, CodeExecutionResult):
                result = item
    assert result is not None and result.text == "slept 0.0"


async def test_kernel_init_timeout_none_reaches_the_kernel_client(executor: CodeExecutor) -> None:
    assert executor.kernel_init_timeout is None
    assert executor.kernel_client.ready_timeout is None


async def test_kernel_init_timeout_of_one_connect_overrides_the_clients(executor: CodeExecutor) -> None:
    gateway = executor.kernel_gateway
    assert gateway is not None
    client = KernelClient(gateway.endpoint, spare_kernel=False, ready_timeout=60)
    with pytest.raises(TimeoutError, match=r"within 0\.001 s \(kernel_init_timeout\)"):
        await client.connect(kernel_init_timeout=0.001)  # a kernel takes about 0.5 s to become ready
    await client.connect(kernel_init_timeout=None)  # None: the client's ready_timeout
    try:
        assert (await client.execute("print('up')")).text == "up"
    finally:
        await client.disconnect()


async def test_a_kernel_init_timeout_too_short_for_the_kernel_fails_start_naming_it(
    tmp_path: Path,
) -> None:
    executor = CodeExecutor(working_dir=tmp_path, spare_kernel=False, kernel_init_timeout=0.001)
    with pytest.raises(TimeoutError, match="kernel_init_timeout"):
        await executor.start()
    assert executor._backend.client is None  # stopped what it started
