"""A hidden path that disappears while kernels keep starting (a parent's `.env` deleted, a rotated secret
between its removal and its replacement): later kernel starts still work, and a re-created one is hidden.

The sandbox is planned once, when the gateway starts ([bwrap][ipybox.sandbox.bwrap.sandboxed_kernel_launch]
writes the plan), and its mounts are computed from what exists at each kernel start ([view]
[ipybox.sandbox.view]): absent is as good as hidden, and a name that is back is hidden again. A sandbox
that bound the hidden paths found at plan time (`--ro-bind /dev/null <path>`, as before the frozen views)
failed every start once one was gone: the warm pool emptied and attaching failed after 60 s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.sandbox import SandboxPolicy
from ipybox.sandbox.bwrap import sandboxed_kernel_launch
from tests.sandbox.conftest import OUTSIDE_PARENT

pytestmark = pytest.mark.integration

SECRET = "PARENT_SECRET=never-in-a-kernel"

# The "kernel": what a process in the sandbox finds at the path it is given (a hidden directory is an
# empty one, a hidden file one that can't be opened).
PROBE = """
import os, sys
path = sys.argv[1]
try:
    found = os.listdir(path) if os.path.isdir(path) else open(path).read()
    print("read:", found)
except OSError as e:
    print("hidden:", type(e).__name__)
"""


@pytest.fixture
def parent() -> Iterator[Path]:
    # Outside /tmp, which the sandbox replaces: there the parent would be out of sight anyway.
    parent = Path(tempfile.mkdtemp(prefix="ipybox-vanished-", dir=OUTSIDE_PARENT))
    (parent / "ws").mkdir()
    yield parent
    shutil.rmtree(parent)


def make_dotenv(parent: Path, kind: str) -> Path:
    env = parent / ".env"
    if kind == "file":
        env.write_text(SECRET + "\n")
    elif kind == "directory":
        env.mkdir()
        (env / "production").write_text(SECRET + "\n")
    else:  # a symlink to the secret, which is hidden too
        (parent / "secrets.txt").write_text(SECRET + "\n")
        env.symlink_to(parent / "secrets.txt")
    return env


def hidden(out: str) -> bool:
    return out.startswith(("hidden:", "read: []")) and SECRET not in out


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def planned_kernel(parent: Path, tmp_path: Path, probe_path: Path) -> Callable[[], str]:
    """A sandboxed kernel command planned once, as when the gateway starts: each call starts a kernel
    through the launcher, the way the gateway does, and returns what it printed."""
    launch = sandboxed_kernel_launch(
        [sys.executable, "-c", PROBE, str(probe_path)], SandboxPolicy(), parent / "ws"
    )
    resource_dir = tmp_path / "resources"
    resource_dir.mkdir()
    for name, content in launch.resources.items():
        (resource_dir / name).write_text(content)
    connection_file = tmp_path / "kernel.json"
    connection_file.write_text(json.dumps({"transport": "tcp", "ip": "127.0.0.1"}))
    argv = [
        arg.replace("{resource_dir}", str(resource_dir)).replace("{connection_file}", str(connection_file))
        for arg in launch.argv
    ]

    def start() -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"the kernel did not start: {done.stderr}"
        return done.stdout.strip()

    return start


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_kernels_start_after_a_parents_dotenv_vanished_and_a_new_one_is_hidden(
    parent: Path, tmp_path: Path, kind: str
) -> None:
    env = make_dotenv(parent, kind)
    start_kernel = planned_kernel(parent, tmp_path, env)
    assert hidden(start_kernel())

    remove(env)
    if kind == "symlink":
        (parent / "secrets.txt").unlink()
    assert start_kernel() == "hidden: FileNotFoundError"  # absent is as good as hidden
    assert start_kernel() == "hidden: FileNotFoundError"  # and every start after works

    make_dotenv(parent, kind)
    assert hidden(start_kernel())


async def test_a_pool_kernel_starts_after_a_parents_dotenv_vanished(parent: Path) -> None:
    env = make_dotenv(parent, "file")
    read = f"try:\n    print(open({str(env)!r}).read())\nexcept OSError as e:\n    print(type(e).__name__)"
    async with CodeExecutor(working_dir=parent / "ws", sandbox=True) as executor:

        async def after_reset() -> str:
            await executor.reset()
            return ((await executor.execute(read, timeout=60)).text or "").strip()

        assert ((await executor.execute(read, timeout=60)).text or "").strip() == "PermissionError"
        env.unlink()
        # A reset swaps in the spare (which started about when the file went) and starts the next spare:
        # that one, swapped in by the second reset, surely started without the file.
        assert await after_reset() in ("PermissionError", "FileNotFoundError")
        assert await after_reset() == "FileNotFoundError"
        env.write_text(SECRET + "\n")
        assert await after_reset() in ("FileNotFoundError", "PermissionError")  # about when it came back
        assert await after_reset() == "PermissionError"  # started after it was back: hidden
