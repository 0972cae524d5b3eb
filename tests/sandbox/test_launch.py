"""The kernel launcher as a process of its own (ipybox's gateway builds the same command line in-process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ipybox.sandbox.bwrap import sandboxed_kernel_launch
from ipybox.sandbox.launch import PLAN_FILE
from ipybox.sandbox.policy import SandboxPolicy

pytestmark = pytest.mark.integration


def test_the_launcher_shows_a_kernel_its_own_connection_file_and_sockets_only(tmp_path: Path) -> None:
    workspace, runtime = tmp_path / "ws", tmp_path / "runtime"
    workspace.mkdir()
    (workspace / ".env").write_text("SECRET=launcher\n")
    (runtime / "ipc" / "k-mine").mkdir(parents=True)
    (runtime / "ipc" / "k-other").mkdir()
    (runtime / "ipc" / "k-other" / "s-1").write_text("another kernel's socket")
    (runtime / "kernel-other.json").write_text('{"key": "another kernel\'s key"}')
    mine = runtime / "kernel-mine.json"
    mine.write_text(json.dumps({"transport": "ipc", "ip": str(runtime / "ipc" / "k-mine" / "s"), "key": "k"}))
    launch = sandboxed_kernel_launch([sys.executable, "-m", "kernel"], SandboxPolicy(), workspace)
    plan = tmp_path / PLAN_FILE
    plan.write_text(launch.resources[PLAN_FILE])
    probe = f"find {runtime} -mindepth 1 | sort; touch {runtime}/ipc/k-mine/s-1 && echo bound; cat .env"
    done = subprocess.run(
        [sys.executable, "-m", "ipybox.sandbox.launch", str(plan), str(mine), "--", "sh", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
    )
    seen = done.stdout.splitlines()
    assert seen[:3] == [str(runtime / "ipc"), str(runtime / "ipc" / "k-mine"), str(mine)]
    assert "bound" in seen and "SECRET" not in done.stdout
    assert "Permission denied" in done.stderr  # the .env is there, unreadable
