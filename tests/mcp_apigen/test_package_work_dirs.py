"""The directories writing, replacing and removing packages make under the root directory: named with the
pid of the process that made them, so that those of a killed process can be told from those in use."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from ipybox.mcp_apigen import write_mcp_sources
from ipybox.mcp_apigen.package import make_temp_dir, open_directory, remove_stale_work_dirs


def work_dir(pid: int | None) -> str:
    """A directory name as writing a package names it, for the process `pid` (`None`: an older ipybox's)."""
    return (
        f".edge.tmp-{pid}_{secrets.token_hex(6)}" if pid is not None else f".edge.tmp-{secrets.token_hex(6)}"
    )


def test_work_dirs_carry_the_pid_of_their_process(tmp_path: Path) -> None:
    fd = open_directory(tmp_path)
    try:
        name = make_temp_dir(fd, ".edge.tmp-")
    finally:
        os.close(fd)
    assert re.fullmatch(rf"\.edge\.tmp-{os.getpid()}_[0-9a-f]{{12}}", name)


def test_generating_leaves_no_work_dir(tmp_path: Path) -> None:
    tool = {"name": "add", "description": "Add.", "input_schema": {"type": "object"}}
    write_mcp_sources("calc", [tool], tmp_path)
    write_mcp_sources("calc", [tool], tmp_path)  # replacing it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calc"]


def test_only_the_work_dirs_of_dead_processes_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "mcptools"
    root.mkdir()
    dead_pid = 2**22 + 1  # above the kernel's pid_max limit: never a live process
    names = {
        "dead": work_dir(dead_pid),
        "old": work_dir(None),
        "live": work_dir(os.getpid()),
        "package": "edge",
        "other": ".edge.tmp-notours",
    }
    for name in names.values():
        (root / name).mkdir()
    (root / f".x.removed-{dead_pid}_{secrets.token_hex(6)}").symlink_to(tmp_path)  # never followed

    assert sorted(remove_stale_work_dirs(root)) == sorted([names["dead"], names["old"]])
    assert sorted(p.name for p in root.iterdir() if not p.is_symlink()) == sorted(
        [names["live"], names["package"], names["other"]]
    )
    assert tmp_path.is_dir()
