"""The view's private `/tmp` size: the bubblewrap options it becomes, and its place in the launch plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipybox.sandbox.view import View, mount_args

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
