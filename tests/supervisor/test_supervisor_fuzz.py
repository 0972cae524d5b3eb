"""A running supervisor fed mangled `ipybox.toml` files through its reconciler: it survives every one,
keeps the last good configuration, and still runs code and tools afterwards."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.supervisor import Supervisor
from tests.reconcile.test_reconciler_fuzz import mutate
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

SEED = 7
CASES = 150


@pytest.mark.timeout(600)
async def test_the_supervisor_survives_mutated_files(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, "supervisor-fuzz", warm_pool=0)
    valid = (workspace / "ipybox.toml").read_bytes()
    supervisor = Supervisor(workspace)
    await supervisor.start()
    try:
        assert supervisor.reconciler is not None
        rng = random.Random(SEED)
        rejected = 0
        for _ in range(CASES):
            (workspace / "ipybox.toml").write_bytes(mutate(valid, rng))
            if not await supervisor.reconciler.reload():
                rejected += 1
                assert supervisor.status().config_error is not None
        assert rejected > CASES // 4
        (workspace / "ipybox.toml").write_bytes(valid)
        assert await supervisor.reconciler.reload()
        status = supervisor.status()
        assert status.config_error is None and status.gateway.running
        assert status.reconciler.servers["edge"].state == "ready"
        async with CodeExecutor(workspace=workspace) as executor:
            code = "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='still here')))"
            assert (await executor.execute(code)).text == "still here"
    finally:
        await supervisor.stop()
