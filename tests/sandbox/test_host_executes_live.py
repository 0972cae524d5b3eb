"""A server added to a running workspace (`ipybox up`): its code lives in the workspace, and a kernel leased
before it was added was started without it read-only. The server is refused while that kernel lives; the
warm pool's kernels are replaced, so a session attached afterwards can't change the server's code; after
the old session resets, the server starts."""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator

import pytest

from ipybox import CodeExecutor
from ipybox.supervisor import Supervisor
from tests.servers.params import EDGE_SERVER
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

TAG = "host-executes-live"
ADDED = f'\n[servers.local]\ncommand = "{sys.executable}"\nargs = ["tools/server.py"]\n'
WRITE = "try:\n    open('tools/server.py', 'a').write('')\n    print('wrote')\nexcept OSError:\n    print('denied')"


@pytest.fixture(scope="module")
async def running(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    workspace = make_workspace(tmp_path_factory.mktemp("live"), TAG, sandbox=True)
    (workspace / "tools").mkdir()
    shutil.copy(EDGE_SERVER, workspace / "tools" / "server.py")
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


async def test_a_server_added_live_waits_for_kernels_that_could_change_its_code(running: Supervisor) -> None:
    workspace = running.workspace
    async with CodeExecutor(workspace=workspace) as before:
        assert (await before.execute(WRITE)).text == "wrote"  # nothing protects tools/ yet
        with (workspace / "ipybox.toml").open("a") as file:
            file.write(ADDED)
        outcome = await running.apply_server("local")
        assert outcome.state == "failed" and outcome.error is not None
        lease = next(iter(running.leases.leases))
        assert f"session {lease}" in outcome.error and "tools/server.py" in outcome.error
        assert "reset that session" in outcome.error
        # A session attached now gets a kernel started with tools/ read-only (the pool was replaced).
        async with CodeExecutor(workspace=workspace) as after:
            assert (await after.execute(WRITE)).text == "denied"
        await before.reset()
        assert (await before.execute(WRITE)).text == "denied"
        assert (await running.apply_server("local")).state == "ready"
