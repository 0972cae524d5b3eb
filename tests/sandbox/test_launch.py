"""The kernel launcher as a process of its own (ipybox's gateway builds the same command line in-process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ipybox.sandbox.bwrap import sandboxed_kernel_launch
from ipybox.sandbox.launch import PLAN_FILE, command_line, make_plan
from ipybox.sandbox.policy import SandboxPolicy
from ipybox.sandbox.view import View

MIB = 2**20


def connection_file(tmp_path: Path) -> Path:
    path = tmp_path / "kernel-1.json"
    path.write_text(json.dumps({"transport": "ipc", "ip": str(tmp_path / "ipc" / "k-1" / "s"), "key": "k"}))
    return path


def test_the_gateways_command_line_carries_the_plans_tmp_size(tmp_path: Path) -> None:
    plan = json.loads(
        make_plan("/usr/bin/bwrap", ["--unshare-all"], View(str(tmp_path), tmp_size=8 * MIB), [], [])
    )
    argv = command_line(plan, str(connection_file(tmp_path)), ["kernel"])
    i = argv.index("/tmp")
    assert argv[i - 3 : i + 1] == ["--size", str(8 * MIB), "--tmpfs", "/tmp"]
    assert argv[-2:] == ["--", "kernel"]


def test_a_plan_written_before_sizes_existed_starts_kernels_as_before(tmp_path: Path) -> None:
    plan = json.loads(make_plan("/usr/bin/bwrap", [], View(str(tmp_path)), [], []))
    del plan["view"]["tmp_size"]
    argv = command_line(plan, str(connection_file(tmp_path)), ["kernel"])
    assert "--size" not in argv and argv[argv.index("/tmp") - 1] == "--tmpfs"


@pytest.mark.integration
def test_the_launcher_gives_a_kernel_a_private_tmp_of_the_plans_size(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    launch = sandboxed_kernel_launch([sys.executable], SandboxPolicy(), workspace, tmp_size=8 * MIB)
    plan = tmp_path / PLAN_FILE
    plan.write_text(launch.resources[PLAN_FILE])
    probe = [sys.executable, "-c", "import os; s = os.statvfs('/tmp'); print(s.f_blocks * s.f_frsize)"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ipybox.sandbox.launch",
            str(plan),
            str(connection_file(tmp_path)),
            "--",
            *probe,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == str(8 * MIB), done.stderr


@pytest.mark.integration
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
