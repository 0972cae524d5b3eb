"""What a supervisor killed with SIGKILL leaves behind, removed by the next `ipybox up`: its run directory
of sockets, its gateway's runtime directory, a stale `state.json`, and directories of half-written tool
packages, while a package directory that a live process is writing is kept."""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ipybox import process
from tests.cli.test_main import ipybox
from tests.servers.processes import pids_anywhere
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

TAG = "supervisor-leftovers"


def wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def gateway_runtime_dir(supervisor: int) -> Path:
    """The runtime directory of the supervisor's kernel gateway, from the gateway process's environment."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    for child in children:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            if b"ipybox.kernels.gateway_main" not in f.read():
                continue
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        runtime = next(v for v in environ if v.startswith(b"JUPYTER_RUNTIME_DIR="))
        return Path(runtime.split(b"=", 1)[1].decode()).parent
    raise AssertionError(f"no gateway among the children of {supervisor}")


def work_dir(pid: int | None) -> str:
    """A directory name as writing a package names it, for the process `pid` (`None`: an older ipybox's)."""
    return (
        f".edge.tmp-{pid}_{secrets.token_hex(6)}" if pid is not None else f".edge.tmp-{secrets.token_hex(6)}"
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    workspace = make_workspace(tmp_path, TAG)
    yield workspace
    ipybox("down", str(workspace))
    process.kill_all(pids_anywhere(TAG))


def test_up_removes_what_a_killed_supervisor_left(workspace: Path) -> None:
    assert ipybox("up", "-d", str(workspace)).returncode == 0
    state = json.loads((workspace / ".ipybox" / "state.json").read_text())
    killed = state["pid"]
    run_dir = Path(state["control_socket"]).parent
    gateway_dir = gateway_runtime_dir(killed)
    # A package being written when the supervisor was killed (its pid in the name), one an older ipybox
    # left, and one that this live process is writing.
    mcptools = workspace / "mcptools"
    dead, old, live = (mcptools / work_dir(pid) for pid in (killed, None, os.getpid()))
    for half_written in (dead, old, live):
        half_written.mkdir()
        (half_written / "echo.py").write_text("from pydantic import BaseModel\nclass Par")

    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: not process.is_alive(killed))
    wait_until(lambda: not pids_anywhere(TAG))  # the gateway and the MCP server go with it
    assert run_dir.is_dir() and gateway_dir.is_dir(), "SIGKILL leaves them"

    again = ipybox("up", "-d", str(workspace))
    assert again.returncode == 0, again.stderr

    assert not run_dir.exists() and not gateway_dir.exists()
    assert not dead.exists() and not old.exists()
    assert live.is_dir(), "a package directory that a live process writes is kept"
    log = (workspace / ".ipybox" / "logs" / "supervisor.log").read_text()
    [line] = [line for line in log.splitlines() if "a supervisor killed before it could stop left" in line]
    assert " INFO " in line
    for removed in (run_dir, gateway_dir, dead, old):
        assert str(removed) in line

    # The new supervisor's own directories are recorded, and gone with it after a clean stop.
    state = json.loads((workspace / ".ipybox" / "state.json").read_text())
    new_run_dir = Path(state["control_socket"]).parent
    assert str(new_run_dir) in json.loads((workspace / ".ipybox" / "run.json").read_text())["dirs"]
    assert ipybox("down", str(workspace)).returncode == 0
    assert not new_run_dir.exists() and not (workspace / ".ipybox" / "run.json").exists()
