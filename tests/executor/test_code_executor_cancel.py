"""`CodeExecutor.cancel()` on both backends (embedded, and attached to a workspace): the running cell is
interrupted, also while one of its tool calls waits for approval; as in ipybox 0.9.2 the stream ends
without a result and without an exception, and `execute()` returns the output so far, marked
`cancelled`; the kernel keeps its state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ipybox import ApprovalRequest, CodeExecutionChunk, CodeExecutionResult, CodeExecutor
from ipybox.supervisor import Supervisor
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

KERNEL_INIT_TIMEOUT = 45

# Asked about on both backends: the embedded executor asks about every call, and no rule of the workspace
# decides edge.slow (its default is `ask`).
TOOL_CALL = "from mcptools.edge import slow\nprint(slow.run(slow.Params(seconds=0)))"

LOOP = "import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.05)"


@pytest.fixture(scope="module", params=["embedded", "workspace"])
async def executor(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tools_workspace: Path,
    mcptools: Path,
    tool_servers: dict[str, dict[str, Any]],
) -> AsyncIterator[CodeExecutor]:
    if request.param == "embedded":
        async with CodeExecutor(
            working_dir=tools_workspace,
            mcp_servers=tool_servers,
            spare_kernel=False,
            kernel_init_timeout=KERNEL_INIT_TIMEOUT,
        ) as embedded:
            yield embedded
        return
    supervisor = Supervisor(
        make_workspace(tmp_path_factory.mktemp("cancel-workspace"), "cancel", ask_timeout=30)
    )
    await supervisor.start()
    try:
        async with CodeExecutor(
            workspace=supervisor.workspace, kernel_init_timeout=KERNEL_INIT_TIMEOUT
        ) as attached:
            yield attached
    finally:
        await supervisor.stop()


async def _cancel_soon(executor: CodeExecutor) -> None:
    """Cancel from another task, as an application's stop button would."""
    await asyncio.create_task(asyncio.sleep(0))
    executor.cancel()


async def _collect(stream: AsyncIterator[Any], on_item: Any) -> list[Any]:
    items = []
    async for item in stream:
        items.append(item)
        await on_item(item)
    return items


async def test_cancel_stops_a_running_loop_and_the_kernel_keeps_its_state(executor: CodeExecutor) -> None:
    await executor.execute("before = 41")

    async def on_item(item: Any) -> None:
        if isinstance(item, CodeExecutionChunk) and "started" in item.text:
            await asyncio.create_task(_cancel_soon(executor))

    async with asyncio.timeout(30):
        items = await _collect(executor.stream(LOOP, chunks=True), on_item)
    # As 0.9.2: the output so far in chunks (no KeyboardInterrupt traceback), then the end, no result.
    assert all(isinstance(item, CodeExecutionChunk) for item in items)
    assert "".join(item.text for item in items).strip() == "started"
    assert (await executor.execute("print(before + 1)")).text == "42"


async def test_cancel_stops_code_that_swallows_the_first_interrupt(executor: CodeExecutor) -> None:
    # Each interrupt lands in the `try` (the sleep, or the print that tells the test the sleep is next).
    code = (
        "import time\ncaught = 0\nwhile True:\n    try:\n        print('waiting', flush=True)\n"
        "        time.sleep(10)\n    except KeyboardInterrupt:\n        caught += 1\n        if caught > 1:\n"
        "            raise"
    )

    async def on_item(item: Any) -> None:
        if isinstance(item, CodeExecutionChunk):
            executor.cancel()

    async with asyncio.timeout(30):
        items = await _collect(executor.stream(code, chunks=True), on_item)
    assert not any(isinstance(item, CodeExecutionResult) for item in items)
    assert (await executor.execute("print(caught)")).text == "2"  # interrupted again, state kept


async def test_cancel_while_an_approval_is_pending_withdraws_it(executor: CodeExecutor) -> None:
    code = "print('asking', flush=True)\n" + TOOL_CALL + "\nprint('after the call')"
    requests: list[ApprovalRequest] = []

    async def on_item(item: Any) -> None:
        if isinstance(item, ApprovalRequest):
            requests.append(item)  # left undecided: the cancel comes from another task
            await asyncio.create_task(_cancel_soon(executor))

    async with asyncio.timeout(30):
        items = await _collect(executor.stream(code), on_item)
    [request] = requests
    assert request.decision is False  # withdrawn: nothing holds the call
    assert items == [request]  # no result after the cancel (0.9.2)

    # The next tool call is asked about as usual and runs.
    asked: list[ApprovalRequest] = []

    async def accept(item: Any) -> None:
        if isinstance(item, ApprovalRequest):
            asked.append(item)
            await item.accept()

    async with asyncio.timeout(30):
        items = await _collect(executor.stream(TOOL_CALL), accept)
    assert [(r.server_name, r.tool_name, r.tool_args) for r in asked] == [("edge", "slow", {"seconds": 0})]
    assert isinstance(items[-1], CodeExecutionResult) and not items[-1].cancelled
    assert items[-1].text == "slept 0.0"


async def test_cancel_of_execute_from_another_task_returns_a_cancelled_result(
    executor: CodeExecutor, tmp_path: Path
) -> None:
    marker = tmp_path / "running"
    # The marker is made inside the loop: made before it, the interrupt could land while IPython compiles
    # the loop's statement, where IPython fails to format the KeyboardInterrupt's traceback (its frame in
    # `codeop` has no line number) and prints that failure instead.
    looping = LOOP.replace("while True:\n", f"while True:\n    open({str(marker)!r}, 'w').close()\n")
    execution = asyncio.create_task(executor.execute(looping))
    async with asyncio.timeout(30):
        while not marker.exists():  # the loop runs: cancel() has something to stop
            await asyncio.sleep(0.01)
    executor.cancel()
    async with asyncio.timeout(30):
        result = await execution
    # The output so far, marked cancelled (0.9.2 returns text=None; nothing produced is dropped here).
    assert result.cancelled and result.text == "started"
    assert (await executor.execute("print('ready')")).text == "ready"


async def test_cancel_when_nothing_runs_does_nothing(executor: CodeExecutor) -> None:
    await executor.execute("kept = 'yes'")
    executor.cancel()
    result = await executor.execute("print(kept)")
    assert result.text == "yes" and not result.cancelled


async def test_cancel_of_code_ignoring_interrupts_replaces_the_kernel_and_ends_cleanly(
    executor: CodeExecutor,
) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('stuck', flush=True)\ntime.sleep(600)"

    async def on_item(item: Any) -> None:
        if isinstance(item, CodeExecutionChunk):
            executor.cancel()

    async with asyncio.timeout(30):
        items = await _collect(executor.stream(code, chunks=True), on_item)
    assert not any(isinstance(item, CodeExecutionResult) for item in items)
    assert "".join(item.text for item in items).strip() == "stuck"
    assert (await executor.execute("print('fresh kernel')")).text == "fresh kernel"


async def test_kernel_init_timeout_reaches_the_kernel_client(executor: CodeExecutor) -> None:
    assert executor.kernel_client.ready_timeout == KERNEL_INIT_TIMEOUT


async def test_a_tiny_kernel_init_timeout_fails_start_also_with_a_warm_kernel_ready(
    executor: CodeExecutor,
) -> None:
    # As 0.9.2 (TimeoutError from start()): a warm pool's kernel answers in milliseconds, not 0.1 ms.
    if executor.workspace is None:
        pytest.skip("the embedded executor's start is tested in test_code_executor_timeouts.py")
    with pytest.raises(TimeoutError, match="kernel_init_timeout"):
        async with CodeExecutor(workspace=executor.workspace, kernel_init_timeout=0.0001):
            pass


async def test_stopping_the_executor_while_code_runs_ends_its_stream_with_one_error(tmp_path: Path) -> None:
    executor = CodeExecutor(working_dir=tmp_path, spare_kernel=False, kernel_init_timeout=KERNEL_INIT_TIMEOUT)
    await executor.start()
    output: list[str] = []

    async def consume() -> None:
        async for item in executor.stream(LOOP, chunks=True):
            if isinstance(item, CodeExecutionChunk):
                output.append(item.text)

    consumer = asyncio.create_task(consume())
    try:
        async with asyncio.timeout(30):
            while "started" not in "".join(output):
                await asyncio.sleep(0.01)
    finally:
        await executor.stop()
    # Neither a wait for a kernel that is gone, nor a cancellation the consumer did not ask for.
    with pytest.raises(RuntimeError, match="the code executor was stopped while this code ran"):
        async with asyncio.timeout(10):
            await consumer
