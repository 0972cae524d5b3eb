"""A workspace run by an in-process `Supervisor`, shared by the module's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ipybox.supervisor import Supervisor
from tests.supervisor.workspaces import make_workspace

TAG = "supervisor"


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    workspace = make_workspace(tmp_path_factory.mktemp("supervised"), TAG, ask_timeout=3)
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()
