"""Policy paths the user can't reach, behind a directory it may not enter (as another user's home is for
anyone but root): the sandbox starts all the same, and what is behind stays out of its reach."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ipybox.sandbox import SandboxPolicy
from ipybox.sandbox.bwrap import sandboxed_command
from tests.sandbox.conftest import OUTSIDE_PARENT


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
    if os.geteuid() == 0:  # root enters any directory: the policy makes it writable, then hides it
        assert _contains(options, ["--bind", str(inner), str(inner)])
        assert _contains(options, ["--tmpfs", str(inner), "--remount-ro", str(inner)])
    else:  # nor can the sandbox, which runs as this user: nothing to mount
        assert str(inner) not in options
        assert "Permission denied" in done.stderr


def _contains(items: list[str], run: list[str]) -> bool:
    return any(items[i : i + len(run)] == run for i in range(len(items)))
