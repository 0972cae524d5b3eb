"""Kernel health in a running workspace: each kernel's memory and CPU in the status, a status that answers
while the gateway does not, and the reaper: a leased kernel idle past `[kernel] max_idle` or grown past
`recycle_rss` is deleted, its application's next execution runs on a fresh kernel with a notice saying why,
and a kernel running a cell is never touched. The settings are edited in `ipybox.toml` while the workspace
runs, as a person would: they apply without a restart."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator

import pytest

from ipybox import CodeExecutionError, CodeExecutor
from ipybox.running.status import KernelsStatus
from ipybox.supervisor import ControlClient, Supervisor
from ipybox.supervisor.kernel_health import MAX_INTERVAL, MIN_INTERVAL, check_interval
from tests.supervisor.test_mcp_endpoint import until
from tests.supervisor.workspaces import make_workspace

TAG = "kernel-health"
MiB = 1024**2
REPLACED = "[ipybox] this session's kernel was replaced by a fresh one, so all its state is lost"


def test_the_reaper_checks_a_quarter_of_max_idle_apart_within_bounds() -> None:
    assert check_interval(None) == MAX_INTERVAL == 30
    assert check_interval(1800) == 30  # a kernel idle for half an hour is deleted at most 30 s late
    assert check_interval(8) == 2
    assert check_interval(0.1) == MIN_INTERVAL  # never a busy loop


@pytest.fixture(scope="module")
async def started(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    workspace = make_workspace(tmp_path_factory.mktemp("health"), TAG)
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


@pytest.fixture
async def supervisor(started: Supervisor) -> AsyncIterator[Supervisor]:
    """The module's workspace, with neither `max_idle` nor `recycle_rss` set before and after the test."""
    await configure(started)
    yield started
    await configure(started)


async def configure(supervisor: Supervisor, **kernel: str) -> None:
    """`ipybox.toml` with these `[kernel]` keys (TOML values) and no others of this test's, applied as the
    watcher applies an edit."""
    path = supervisor.workspace / "ipybox.toml"
    lines = [
        line for line in path.read_text().splitlines() if not line.startswith(("max_idle", "recycle_rss"))
    ]
    start = lines.index("[kernel]") + 1
    lines[start:start] = [f"{key} = {value}" for key, value in kernel.items()]
    path.write_text("\n".join(lines) + "\n")
    assert supervisor.reconciler is not None
    await supervisor.reconciler.reload()
    settings = supervisor.kernel_settings()
    assert (settings.max_idle is None) == ("max_idle" not in kernel)
    assert (settings.recycle_rss is None) == ("recycle_rss" not in kernel)


@pytest.mark.integration
async def test_the_status_carries_each_kernels_memory_and_cpu(supervisor: Supervisor) -> None:
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        await executor.execute("data = b'x' * (64 * 1024 * 1024)")  # 64 MiB, written: resident

        async def health() -> KernelsStatus:
            async with ControlClient.of(supervisor.workspace) as control:
                status = await control.status()  # what `ipybox status --json` prints
            assert status.kernels is not None
            return status.kernels

        kernels = await health()
        while not any(kernel.role == "pool" for kernel in kernels.kernels):  # the pool's refill starting
            kernels = await health()
    assert kernels.reported and kernels.error is None
    assert kernels.mechanism in ("cgroup2", "cgroup1", "rlimit")
    assert kernels.limits["memory"] == 4 * 1024 * MiB and kernels.limits["processes"] == 256
    [leased] = [kernel for kernel in kernels.kernels if kernel.role == "leased"]
    assert leased.lease is not None and leased.execution_state == "idle" and leased.idle_s is not None
    assert (
        leased.usage is not None and leased.usage.memory is not None and leased.usage.cpu_seconds is not None
    )
    assert leased.usage.memory > 64 * MiB and (leased.usage.memory_peak or 0) >= 64 * MiB
    assert leased.usage.cpu_seconds > 0 and (leased.usage.processes or 0) >= 1
    pool = next(kernel for kernel in kernels.kernels if kernel.role == "pool")
    assert (
        pool.usage is not None and pool.usage.memory is not None and pool.usage.memory < leased.usage.memory
    )
    assert kernels.kernels[0] == leased  # leased kernels first
    assert (kernels.max_idle, kernels.recycle_rss) == (None, None)


@pytest.mark.integration
async def test_the_status_answers_while_the_gateway_does_not(supervisor: Supervisor) -> None:
    """A gateway that is stopped (SIGSTOP: it neither answers nor exits) leaves the kernels' usage out."""
    assert supervisor.gateway is not None and supervisor.gateway.pid is not None
    pid = supervisor.gateway.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        async with ControlClient.of(supervisor.workspace) as control:
            status = await control.status()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert status.gateway.running and status.kernels is not None
    assert not status.kernels.reported and status.kernels.kernels == []
    assert status.kernels.error == "the kernel gateway did not answer within 2 s"
    assert (await supervisor.status_with_kernels()).kernels.reported  # type: ignore[union-attr]


@pytest.mark.integration
async def test_a_leased_kernel_idle_past_max_idle_is_deleted_and_the_next_execution_says_so(
    supervisor: Supervisor,
) -> None:
    generation = supervisor.kernel_generation
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        await executor.execute("x = 42")
        reaped = supervisor.health.reaped
        await configure(supervisor, max_idle="2")
        await until(lambda: supervisor.health.reaped > reaped)
        await configure(supervisor)  # no reaping while the rest runs
        with pytest.raises(CodeExecutionError) as caught:
            # Seconds, not minutes, if the gateway kept the deleted kernel's websocket open.
            await executor.execute("print(x)", timeout=20)
        message = str(caught.value)
        assert message.startswith(REPLACED) and "longer than [kernel] max_idle (2 s)" in message
        assert "NameError" in message  # the state went with the kernel
        again = await executor.execute("print('told once')")
        assert again.text == "told once"
    assert supervisor.kernel_generation == generation  # the edit recycled nothing else
    status = await supervisor.status_with_kernels()
    assert status.kernels is not None and status.kernels.reaped == supervisor.health.reaped


@pytest.mark.integration
async def test_a_kernel_running_a_cell_is_never_reaped(supervisor: Supervisor) -> None:
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        reaped = supervisor.health.reaped
        await configure(supervisor, max_idle="2")
        # Silent for 5 s, longer than max_idle: the kernel is busy all along.
        result = await executor.execute("import time\ntime.sleep(5)\nprint('done')")
        assert result.text == "done"
        assert supervisor.health.reaped == reaped


@pytest.mark.integration
async def test_an_idle_kernel_grown_past_recycle_rss_is_recycled(supervisor: Supervisor) -> None:
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        await executor.execute("y = 7")
        recycled = supervisor.health.recycled
        # Any kernel uses more than 10 MB; a max_idle far longer makes the checks 2 s apart.
        await configure(supervisor, recycle_rss='"10MB"', max_idle="8")
        await until(lambda: supervisor.health.recycled > recycled)
        await configure(supervisor)
        with pytest.raises(CodeExecutionError) as caught:
            await executor.execute("print(y)", timeout=20)
        message = str(caught.value)
        assert message.startswith(REPLACED) and "more than [kernel] recycle_rss (9.5 MiB)" in message
        assert "NameError" in message
