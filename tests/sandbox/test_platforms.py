"""The platform dispatch of a private `/tmp` size: passed on to bubblewrap, refused on macOS."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from ipybox.sandbox import bwrap, platforms, seatbelt
from ipybox.sandbox.launch import PLAN_FILE
from ipybox.sandbox.policy import SandboxPolicy

MIB = 2**20
KERNEL = ["python", "-m", "kernel", "-f", "{connection_file}"]


def test_linux_passes_the_size_on_to_bubblewrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(bwrap, "check_sandbox", lambda: "/usr/bin/bwrap")
    argv = platforms.sandboxed_command(["true"], SandboxPolicy(), tmp_path, tmp_size=MIB)
    assert argv == bwrap.sandboxed_command(["true"], SandboxPolicy(), tmp_path, tmp_size=MIB)
    assert argv[argv.index("/tmp") - 3 : argv.index("/tmp")] == ["--size", str(MIB), "--tmpfs"]
    launch = platforms.sandboxed_kernel_launch(
        KERNEL, SandboxPolicy(), tmp_path, ipc_dir=tmp_path / "ipc", temp_dir=tmp_path / "tmp", tmp_size=MIB
    )
    assert json.loads(launch.resources[PLAN_FILE])["view"]["tmp_size"] == MIB


def test_macos_refuses_a_size_it_has_no_private_tmp_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    # Refused before anything of the Seatbelt sandbox is looked at.
    monkeypatch.setattr(seatbelt, "check_seatbelt", lambda: pytest.fail("refuse the size first"))
    message = r"private /tmp \(1048576 bytes\) needs Linux: the macOS sandbox has no private /tmp"
    with pytest.raises(ValueError, match=message):
        platforms.sandboxed_command(["true"], SandboxPolicy(), tmp_path, temp_dir=tmp_path, tmp_size=MIB)
    with pytest.raises(ValueError, match=message):
        platforms.sandboxed_kernel_launch(
            KERNEL, SandboxPolicy(), tmp_path, ipc_dir=tmp_path, temp_dir=tmp_path, tmp_size=MIB
        )
