"""bubblewrap command lines with a private `/tmp` size, and what a process inside sees of that size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ipybox.sandbox import bwrap
from ipybox.sandbox.bwrap import bwrap_args, sandboxed_command, sandboxed_kernel_launch
from ipybox.sandbox.launch import PLAN_FILE
from ipybox.sandbox.policy import SandboxPolicy

MIB = 2**20

# Writes `MiB` MiB to each path and says how it went: "ok", or the errno's name and message.
WRITER = """
import errno, os, sys
for arg in sys.argv[1:]:
    path, mib = arg.split("=")
    try:
        with open(path, "wb") as f:
            for _ in range(int(mib)):
                f.write(bytes(2**20))
        print(path, "ok")
    except OSError as e:
        print(path, errno.errorcode[e.errno], e.strerror)
print("/tmp size", os.statvfs("/tmp").f_blocks * os.statvfs("/tmp").f_frsize)
"""


def contains(args: list[str], run: list[str]) -> bool:
    return any(args[i : i + len(run)] == run for i in range(len(args) - len(run) + 1))


def test_bwrap_args_carry_the_size_and_leave_it_out_without_one(tmp_path: Path) -> None:
    assert contains(
        bwrap_args(SandboxPolicy(), tmp_path, tmp_size=MIB), ["--size", str(MIB), "--tmpfs", "/tmp"]
    )
    assert "--size" not in bwrap_args(SandboxPolicy(), tmp_path)


def test_a_kernel_launch_plan_carries_the_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bwrap, "check_sandbox", lambda: "/usr/bin/bwrap")
    launch = sandboxed_kernel_launch(
        [sys.executable, "-m", "kernel"], SandboxPolicy(), tmp_path, tmp_size=MIB
    )
    assert json.loads(launch.resources[PLAN_FILE])["view"]["tmp_size"] == MIB
    plain = sandboxed_kernel_launch([sys.executable, "-m", "kernel"], SandboxPolicy(), tmp_path)
    assert json.loads(plain.resources[PLAN_FILE])["view"]["tmp_size"] is None


def test_a_bad_size_is_refused_before_any_command_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(bwrap, "check_sandbox", lambda: "/usr/bin/bwrap")
    with pytest.raises(ValueError, match="whole number of bytes above zero"):
        sandboxed_command(["true"], SandboxPolicy(), tmp_path, tmp_size=0)
    with pytest.raises(ValueError, match="whole number of bytes above zero"):
        sandboxed_kernel_launch(["k"], SandboxPolicy(), tmp_path, tmp_size=-1)


def run_writer(workspace: Path, tmp_size: int | None, *writes: str) -> list[str]:
    argv = sandboxed_command(
        [sys.executable, "-c", WRITER, *writes], SandboxPolicy(), workspace, tmp_size=tmp_size
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr  # the process itself keeps running after ENOSPC
    return done.stdout.splitlines()


@pytest.mark.integration
def test_a_process_fills_its_private_tmp_only_up_to_its_size(tmp_path: Path) -> None:
    seen = run_writer(tmp_path, 8 * MIB, "/tmp/small=4", "/tmp/big=16")
    assert seen == [
        "/tmp/small ok",
        "/tmp/big ENOSPC No space left on device",
        f"/tmp size {8 * MIB}",
    ]


@pytest.mark.integration
def test_dev_shm_and_dev_are_no_way_around_the_size(tmp_path: Path) -> None:
    seen = run_writer(tmp_path, 8 * MIB, "/dev/shm/small=4", "/dev/shm/big=16", "/dev/new=1")
    assert seen[:3] == [
        "/dev/shm/small ok",
        "/dev/shm/big ENOSPC No space left on device",
        "/dev/new EROFS Read-only file system",
    ]


@pytest.mark.integration
def test_without_a_size_the_private_tmp_takes_more(tmp_path: Path) -> None:
    assert run_writer(tmp_path, None, "/tmp/big=16")[0] == "/tmp/big ok"
