"""The state directory (`.ipybox/`) from the attacker's side: a kernel of an earlier
`CodeExecutor(sandbox=True)` session, running before `.ipybox/` existed, created it with symlinks and hard
links in it, which the next `ipybox up` (often as root) must not follow (issue 12, class 4)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ipybox.cli import workspace as cli
from ipybox.rules import AuditLog, ToolCall, Verdict
from ipybox.running.state import StatePaths, SupervisorLock
from ipybox.supervisor import NotRunningError, Supervisor, read_state
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

TAG = "state-dir-hostile"
NOBODY = 65534
PRECIOUS = "root:x:0:0:root:/root:/bin/bash\n"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    directory = tmp_path / "ws"
    directory.mkdir()
    return make_workspace(directory, TAG)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the workspace that the attacker wants truncated or appended to."""
    path = tmp_path / "passwd"
    path.write_text(PRECIOUS)
    return path


@pytest.fixture
async def supervisor(workspace: Path) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(workspace)
    yield supervisor
    await supervisor.stop()  # in case it did start


async def test_up_refuses_a_state_dir_that_is_a_symlink(
    supervisor: Supervisor, workspace: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / ".ipybox").symlink_to(elsewhere)

    with pytest.raises(ValueError, match=r"\.ipybox.*symlink") as refused:
        await supervisor.start()

    assert "remove" in str(refused.value), "the error says what to do"
    assert list(elsewhere.iterdir()) == []


@pytest.mark.root_only
@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user takes root")
async def test_up_refuses_a_state_dir_owned_by_another_user(supervisor: Supervisor, workspace: Path) -> None:
    state_dir = workspace / ".ipybox"
    state_dir.mkdir(mode=0o777)
    os.chown(state_dir, NOBODY, NOBODY)

    with pytest.raises(ValueError, match=r"\.ipybox.*owned by"):
        await supervisor.start()

    assert list(state_dir.iterdir()) == []


@pytest.mark.parametrize("entry", ["supervisor.lock", "logs/supervisor.log", "audit.jsonl"])
async def test_up_does_not_follow_a_file_symlink_planted_in_the_state_dir(
    supervisor: Supervisor, workspace: Path, victim: Path, entry: str
) -> None:
    planted = workspace / ".ipybox" / entry
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(victim)

    with pytest.raises(ValueError, match=rf"{entry}.*symlink"):
        await supervisor.start()

    assert victim.read_text() == PRECIOUS


@pytest.mark.parametrize("entry", ["logs", "outputs"])
async def test_up_does_not_follow_a_directory_symlink_planted_in_the_state_dir(
    supervisor: Supervisor, workspace: Path, tmp_path: Path, entry: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / ".ipybox").mkdir()
    (workspace / ".ipybox" / entry).symlink_to(elsewhere)

    with pytest.raises(ValueError, match=rf"{entry}.*symlink"):
        await supervisor.start()

    assert list(elsewhere.iterdir()) == []


async def test_up_does_not_truncate_a_file_hard_linked_into_the_state_dir(
    supervisor: Supervisor, workspace: Path, victim: Path
) -> None:
    (workspace / ".ipybox").mkdir()
    os.link(victim, workspace / ".ipybox" / "supervisor.lock")

    with pytest.raises(ValueError, match=r"supervisor\.lock.*link"):
        await supervisor.start()

    assert victim.read_text() == PRECIOUS


def test_the_audit_log_does_not_append_through_a_planted_symlink(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "audit.jsonl").symlink_to(victim)
    log = AuditLog(tmp_path / "audit.jsonl")

    with pytest.raises(OSError, match="symlink"):
        log.record(ToolCall("edge", "echo"), Verdict("allow", None, "default"))

    assert victim.read_text() == PRECIOUS


def test_a_state_file_planted_as_a_symlink_is_not_believed(workspace: Path, tmp_path: Path) -> None:
    forged = tmp_path / "forged.json"
    forged.write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "workspace": str(workspace),
                "started_at": "2025-01-01T00:00:00+00:00",
                "control_socket": str(tmp_path / "attacker.sock"),
                "control_token": "t",
                "gateway_socket": str(tmp_path / "attacker-gw.sock"),
                "gateway_token": "t",
                "log_file": str(tmp_path / "log"),
            }
        )
    )
    (workspace / ".ipybox").mkdir()
    (workspace / ".ipybox" / "state.json").symlink_to(forged)

    with pytest.raises(NotRunningError):
        read_state(workspace)


def test_a_state_dir_left_open_to_others_is_narrowed_to_its_owner(workspace: Path) -> None:
    state_dir = workspace / ".ipybox"
    state_dir.mkdir(mode=0o755)
    os.chmod(state_dir, 0o755)
    lock = SupervisorLock(StatePaths(state_dir))
    lock.acquire()
    try:
        assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((state_dir / "supervisor.lock").stat().st_mode) == 0o600
    finally:
        lock.release()


@pytest.fixture
def detached_cleanup(workspace: Path) -> Iterator[None]:
    yield
    with contextlib.suppress(NotRunningError, ProcessLookupError):
        os.kill(read_state(workspace).pid, signal.SIGTERM)


def test_up_detached_does_not_truncate_a_planted_output_file(
    workspace: Path, victim: Path, detached_cleanup: None, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = workspace / ".ipybox" / "logs" / "up.out"
    planted.parent.mkdir(parents=True)
    planted.symlink_to(victim)

    assert cli.up(workspace, detach=True) == cli.EXIT_ERROR

    assert victim.read_text() == PRECIOUS
    assert "symlink" in capsys.readouterr().err
