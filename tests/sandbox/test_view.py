"""The view's private `/tmp` size: the bubblewrap options it becomes, and its place in the launch plan;
which extra paths are bound on their own."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from ipybox.sandbox.view import PathRule, View, mount_args
from tests.sandbox.conftest import OUTSIDE_PARENT

MIB = 2**20


def contains(args: list[str], run: list[str]) -> bool:
    return any(args[i : i + len(run)] == run for i in range(len(args) - len(run) + 1))


def test_a_sized_private_tmp_is_a_tmpfs_of_that_size(tmp_path: Path) -> None:
    args = mount_args(View(str(tmp_path), tmp_size=8 * MIB))
    assert contains(args, ["--size", str(8 * MIB), "--tmpfs", "/tmp"])
    # Only the two in-memory file systems a process can write get a size (/tmp and /dev/shm).
    assert args.count("--size") == 2


def test_with_a_size_dev_shm_is_sized_too_and_dev_itself_read_only(tmp_path: Path) -> None:
    args = mount_args(View(str(tmp_path), tmp_size=8 * MIB))
    # `--dev` must come first: the sized /dev/shm is mounted on the /dev it makes.
    dev, shm = args.index("--dev"), args.index("/dev/shm")
    assert dev < shm and args[shm - 3 : shm + 1] == ["--size", str(8 * MIB), "--tmpfs", "/dev/shm"]
    assert contains(args, ["--remount-ro", "/dev"])


def test_without_a_size_the_mounts_are_as_before(tmp_path: Path) -> None:
    args = mount_args(View(str(tmp_path)))
    assert "--size" not in args and "/dev/shm" not in args
    assert contains(args, ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"])
    assert not contains(args, ["--remount-ro", "/dev"])


def test_the_size_survives_the_plans_json(tmp_path: Path) -> None:
    view = View(str(tmp_path), writable=[str(tmp_path / "w")], tmp_size=8 * MIB)
    loaded = View.from_json(json.loads(json.dumps(view.to_json())))
    assert loaded.tmp_size == 8 * MIB
    assert mount_args(loaded) == mount_args(view)


def test_a_plan_written_before_sizes_existed_loads_without_a_limit(tmp_path: Path) -> None:
    old = {
        "workspace": str(tmp_path),
        "writable": [],
        "readable": [],
        "sockets": [],
        "hidden": [],
        "protected": [],
    }
    view = View.from_json(old)
    assert view.tmp_size is None and "--size" not in mount_args(view)


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "8M"])
def test_a_size_that_is_not_a_whole_number_of_bytes_above_zero_is_refused(
    tmp_path: Path, size: object
) -> None:
    message = r"private /tmp's size must be a whole number of bytes above zero.*None\) for no limit"
    with pytest.raises(ValueError, match=message):
        View(str(tmp_path), tmp_size=size)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        View.from_json({"workspace": str(tmp_path), "tmp_size": size})
    view = View(str(tmp_path))
    with pytest.raises(ValueError, match=message):
        view.tmp_size = size  # type: ignore[assignment]
    assert view.tmp_size is None


def test_only_the_directories_beside_the_workspace_that_hold_a_secret_cost_mounts() -> None:
    parent = Path(tempfile.mkdtemp(prefix="ipybox-beside-", dir=OUTSIDE_PARENT))  # outside the private /tmp
    try:
        workspace, plain, project = parent / "ws", parent / "plain", parent / "project"
        (plain / "src").mkdir(parents=True)
        workspace.mkdir()
        project.mkdir()
        (project / ".env.local").write_text("API_KEY=x\n")
        (project / "a.txt").write_text("a\n")
        view = View(str(workspace), hidden_beside=[".env*", ".ipybox"])
        args = mount_args(View.from_json(json.loads(json.dumps(view.to_json()))))
        # The project is frozen, its secret hidden and its other entries bound one by one...
        assert contains(args, ["--tmpfs", str(project)])
        assert contains(args, ["--ro-bind-try", "/dev/null", str(project / ".env.local")])
        assert contains(args, ["--ro-bind-try", str(project / "a.txt"), str(project / "a.txt")])
        # ...a directory without one is bound whole, as before.
        assert contains(args, ["--ro-bind-try", str(plain), str(plain)])
        assert str(plain / "src") not in args
    finally:
        shutil.rmtree(parent)


def test_a_writable_path_inside_a_writable_tree_is_not_bound_on_its_own(tmp_path: Path) -> None:
    # A kernel may replace such a path by a symlink, which its own bind would follow on the host.
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    for directory in (workspace / "data" / "out", workspace / ".git" / "hooks", outside / "a" / "b"):
        directory.mkdir(parents=True)
    paths = [workspace / "data" / "out", workspace / ".git" / "hooks", outside / "a", outside / "a" / "b"]
    view = View(
        str(workspace), writable=[str(p) for p in paths], protected=[PathRule(str(workspace), ".git")]
    )
    args = mount_args(view)

    def bound(path: Path) -> bool:
        return contains(args, ["--bind-try", str(path), str(path)])

    assert bound(workspace / "data") and not bound(workspace / "data" / "out")  # writable through data/
    assert contains(args, ["--ro-bind-try", str(workspace / ".git"), str(workspace / ".git")])
    assert bound(workspace / ".git" / "hooks")  # below a read-only entry: no kernel can replace it
    assert bound(outside / "a") and not bound(outside / "a" / "b")
