"""`[servers.<name>.limits]` in a running workspace: code in a kernel calls a tool that takes its server over
its memory limit; the cell gets the error naming the limit and the peak, `status` says why the server is
not running, the kernel and the other server keep working, the next call starts the server again, and
`stop` leaves no process of either server behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.cli.workspace import _server_line
from ipybox.limits import detect_enforcement
from ipybox.supervisor import Supervisor
from tests.servers.processes import pids_anywhere
from tests.supervisor.workspaces import edge_server

pytestmark = pytest.mark.integration

TAG = "supervisor-server-limits"
HUNGRY = (
    "from mcptools.hungry import allocate\n"
    "try:\n"
    "    allocate.run(allocate.Params(megabytes=200))\n"
    "except Exception as e:\n"
    "    print(type(e).__name__, e)\n"
)


def write_workspace(directory: Path) -> Path:
    (directory / "ipybox.toml").write_text(
        "[kernel]\nwarm_pool = 1\n\n[sandbox]\nenabled = false\n\n"
        + edge_server(TAG, name="hungry")
        + 'limits = { memory = "64MiB" }\n\n'
        + edge_server(f"{TAG}-other", name="other")
        + '\n[approval]\ndefault = "allow"\n'
    )
    return directory


async def test_a_server_over_its_memory_limit_fails_the_cell_and_the_workspace_keeps_working(
    tmp_path: Path,
) -> None:
    if detect_enforcement().cgroup is None:
        pytest.skip("a memory limit that kills needs control groups (see `ipybox doctor`)")
    supervisor = Supervisor(write_workspace(tmp_path))
    await supervisor.start()
    try:
        async with CodeExecutor(workspace=tmp_path) as executor:
            result = await executor.execute(HUNGRY)
            assert result.text is not None
            assert (
                "MCP server 'hungry' went over its memory limit (limit 64 MiB, peak 64 MiB) and was stopped"
                in result.text
            )
            assert pids_anywhere(TAG) == []
            hungry = supervisor.status().reconciler.servers["hungry"]
            assert hungry.state == "ready"  # its package stays
            assert hungry.stopped is not None and "went over its memory limit" in hungry.stopped
            assert _server_line(hungry).endswith(f"; not running: {hungry.stopped}")  # `ipybox status`
            assert supervisor.status().reconciler.servers["other"].stopped is None
            other = "from mcptools.other import echo\nprint(echo.run(echo.Params(text='other')))"
            assert (await executor.execute(other)).text == "other"
            again = "from mcptools.hungry import echo\nprint(echo.run(echo.Params(text='again')))"
            assert (await executor.execute(again)).text == "again"
            assert supervisor.status().reconciler.servers["hungry"].stopped is None
    finally:
        await supervisor.stop()
    assert pids_anywhere(TAG) == [] and pids_anywhere(f"{TAG}-other") == []
