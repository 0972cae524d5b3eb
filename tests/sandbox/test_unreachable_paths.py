"""Policy paths the user can't reach, behind a directory it may not enter (as another user's home is for
anyone but root): the sandbox starts all the same, and what is behind stays out of its reach."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from ipybox.sandbox import SandboxPolicy
from ipybox.sandbox.bwrap import sandboxed_command
from tests.sandbox.conftest import OUTSIDE_PARENT

pytestmark = pytest.mark.integration


def test_a_policy_path_behind_a_closed_directory(tmp_path: Path) -> None:
    # Outside /tmp, which the sandbox replaces: there it would be out of sight whatever the policy said.
    closed = Path(tempfile.mkdtemp(prefix="ipybox-closed-", dir=OUTSIDE_PARENT))
    inner = closed / "inner"
    inner.mkdir()
    (inner / "secret.txt").write_text("behind a closed door\n")
    policy = SandboxPolicy.model_validate(
        {"filesystem": {"denyRead": [str(inner)], "allowWrite": [str(inner)]}}
    )
    closed.chmod(0)
    try:
        argv = sandboxed_command(["cat", str(inner / "secret.txt")], policy, tmp_path)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        closed.chmod(0o700)
        shutil.rmtree(closed)
    assert done.returncode != 0 and "closed door" not in done.stdout
    options = argv[: argv.index("--")]
    if os.geteuid() == 0:  # root enters any directory: the hidden directory is an empty read-only tmpfs
        assert _contains(options, ["--tmpfs", str(inner)])
        assert _contains(options, ["--remount-ro", str(inner)])
        assert not _contains(options, ["--bind-try", str(inner), str(inner)])  # hiding wins over allowWrite
    else:  # nor can the sandbox, which runs as this user: the closed directory stays closed and empty
        assert _contains(options, ["--tmpfs", str(closed)]) and str(inner) not in options
        assert "No such file or directory" in done.stderr


def _contains(items: list[str], run: list[str]) -> bool:
    return any(items[i : i + len(run)] == run for i in range(len(items)))
