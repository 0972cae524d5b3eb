"""A workspace whose kernels are all at their limits (memory nearly full, every process slot taken) still
answers `status`, still runs other kernels' code, and `down` leaves none of their processes behind: the
supervisor, gateway and tool server run outside the kernels' limits (issue 19, item 5)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox import CodeExecutionError, CodeExecutor
from ipybox.running.control_client import ControlClient
from ipybox.running.state import read_state
from ipybox.supervisor import Supervisor

pytestmark = pytest.mark.integration

MARKER = f"ipybox-pressure-{uuid.uuid4().hex}"
# Fill memory close to the limit, then fork children that hold every process slot left (each execs into
# a sleep named by the marker, so the test can find them).
HOG = (
    "import os\n"
    "ballast = b'1' * (200 * 2**20)\n"
    "forked = 0\n"
    "while True:\n"
    "    if os.fork() == 0:\n"
    f"        os.execv('/bin/sleep', ['{MARKER}', '3600'])\n"
    "    forked += 1\n"
)


@pytest.fixture(scope="module")
async def workspace_up(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    workspace = tmp_path_factory.mktemp("pressed")
    (workspace / "ipybox.toml").write_text(
        '[kernel]\nwarm_pool = 1\n[kernel.limits]\nmemory = "256MiB"\nprocesses = 48\n\n[sandbox]\nenabled = false\n'
    )
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


def _marked() -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                count += MARKER.encode() in (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return count


async def test_with_its_kernels_at_their_limits_the_workspace_answers_and_down_leaves_nothing(
    workspace_up: Supervisor,
) -> None:
    workspace = workspace_up.workspace
    hogs = [CodeExecutor(workspace=workspace) for _ in range(2)]
    for hog in hogs:
        await hog.start()
        with pytest.raises(CodeExecutionError, match="BlockingIOError"):
            await hog.execute(HOG)
    assert _marked() > 0
    async with ControlClient(read_state(workspace)) as control:
        status = await control.status()
    assert status.leases >= 2
    # It tells how full they are: the hogs at their process limit, under their memory limit.
    assert status.kernels is not None and status.kernels.reported
    assert status.kernels.limits == {"memory": 256 * 2**20, "processes": 48, "open_files": 4096}
    leased = [k.usage for k in status.kernels.kernels if k.role == "leased" and k.usage is not None]
    assert sum(u.processes == 48 for u in leased if u.processes is not None) >= 2
    assert all(u.memory is not None and u.memory <= 256 * 2**20 for u in leased)
    async with CodeExecutor(workspace=workspace) as other:
        assert (await other.execute("print(sum(range(10)))")).text == "45"
    for hog in hogs:  # at their limits, not dead: they still answer
        assert int((await hog.execute("print(forked)")).text) > 0
        await hog.stop()
    await workspace_up.stop()
    async with asyncio.timeout(10):
        while _marked():
            await asyncio.sleep(0.05)
