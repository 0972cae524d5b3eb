"""`workspace_status` and its parts, and `StartupReport`, as pure functions of what they read (no processes):
a workspace whose parts are not running yet, servers placed in `ipybox.toml`, and the start's events."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from ipybox.approval.asks import AskBoard
from ipybox.config import CONFIG_FILE, WorkspaceConfig, load_config
from ipybox.progress import ProgressEvent, ProgressHub
from ipybox.running.status import MCPServerStatus, ReconcilerStatus
from ipybox.supervisor.leases import LeaseTable
from ipybox.supervisor.startup import StartupReport
from ipybox.supervisor.workspace_status import (
    ConfigPositions,
    StatusSources,
    reconciler_status,
    workspace_status,
)
from tests.supervisor.workspaces import make_workspace


@pytest.fixture
def config(tmp_path: Path) -> WorkspaceConfig:
    return load_config(make_workspace(tmp_path, "status", warm_pool=2) / CONFIG_FILE)


def test_a_workspace_whose_parts_are_not_running_reports_them_stopped(config: WorkspaceConfig) -> None:
    leases = LeaseTable()
    leases.new_lease()
    sources = StatusSources(
        config.root, datetime.now(UTC), config, config.root / ".ipybox", leases, AskBoard(),
        None, None, None, None, None,
    )  # fmt: skip
    status = workspace_status(sources, ConfigPositions(config.root / CONFIG_FILE))
    assert not status.gateway.running and status.gateway.pid is None and not status.tool_server.running
    assert (status.pool.size, status.pool.idle, status.pool.leased) == (2, 0, 0)
    assert status.leases == 1 and status.restarts == {"gateway": 0, "tool_server": 0}
    assert status.reconciler == ReconcilerStatus() and status.actions == [] and status.config_error is None


def test_no_reconciler_is_an_empty_typed_status() -> None:
    assert reconciler_status(None) == ReconcilerStatus()


def test_each_server_is_placed_at_its_tables_name_and_the_place_follows_an_edit(
    config: WorkspaceConfig,
) -> None:
    path = config.root / CONFIG_FILE
    positions = ConfigPositions(path)
    status = ReconcilerStatus(
        servers={"edge": MCPServerStatus(state="ready"), "gone": MCPServerStatus(state="failed")}
    )
    line = path.read_text().splitlines().index("[servers.edge]") + 1
    located = positions.locate(status)
    assert located.servers["edge"].location == f"{CONFIG_FILE}:{line}:10"
    assert located.servers["gone"].location is None  # not in the file (any more)
    path.write_text("# moved down\n\n" + path.read_text())
    assert positions.locate(status).servers["edge"].location == f"{CONFIG_FILE}:{line + 2}:10"


def test_a_file_toml_does_not_accept_places_no_server(config: WorkspaceConfig) -> None:
    path = config.root / CONFIG_FILE
    path.write_text(path.read_text() + "\n[servers.edge\n")
    status = ReconcilerStatus(servers={"edge": MCPServerStatus(state="ready")})
    assert ConfigPositions(path).locate(status).servers["edge"].location is None


def test_a_start_reports_each_part_and_a_part_that_fails_says_why() -> None:
    hub = ProgressHub()
    events: list[ProgressEvent] = []
    hub.subscribe(events.append)
    report = StartupReport(hub)
    with report.part("gateway") as detail:
        detail.append("pid 42")
    with pytest.raises(OSError), report.part("endpoints"):
        raise OSError("port 8080 is taken")
    report.pool_ended(started=True, size=3, idle=1, failures=1)
    assert [(e.what, e.step, e.detail) for e in events] == [
        ("gateway", "starting", None),
        ("gateway", "ready", "pid 42"),
        ("endpoints", "starting", None),
        ("endpoints", "failed", "port 8080 is taken"),
        (
            "kernels",
            "ready",
            "1 of 3 so far, the rest starting in the background, 1 failed to start (see the log)",
        ),
    ]
