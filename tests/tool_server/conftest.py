"""A tool server with the real `everything` server, shared by the module's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params
from tests.servers.processes import tagged

TAG = "tool-exec"


@pytest.fixture(scope="module")
async def tool_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ToolServer]:
    media = tmp_path_factory.mktemp("media")
    async with ToolServer(
        servers={"everything": tagged(params.everything(), TAG)}, media_dir=media
    ) as server:
        yield server
