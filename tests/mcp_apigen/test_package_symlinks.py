"""The generator from the attacker's side: a kernel that could write in the workspace replaced `mcptools/`,
or a package directory in it, by a symlink before the host generates again (issue 12, class 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.mcp_apigen import generate_mcp_sources, write_mcp_sources
from tests.servers import params

TOOL = {"name": "add", "description": "Add.", "input_schema": {"type": "object"}}


def _victim(tmp_path: Path) -> Path:
    """A directory outside the workspace with a package-like directory the attacker wants deleted."""
    victim = tmp_path / "victim"
    (victim / "edge").mkdir(parents=True)
    (victim / "edge" / "precious.txt").write_text("keep me\n")
    return victim


def _untouched(victim: Path) -> None:
    assert sorted(p.name for p in victim.iterdir()) == ["edge"], "something was written next to the target"
    assert [p.name for p in (victim / "edge").iterdir()] == ["precious.txt"]
    assert (victim / "edge" / "precious.txt").read_text() == "keep me\n"


@pytest.mark.integration
async def test_generating_into_a_mcptools_dir_replaced_by_a_symlink_is_refused(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    mcptools = tmp_path / "workspace" / "mcptools"
    mcptools.parent.mkdir()
    mcptools.symlink_to(victim)

    with pytest.raises(OSError, match=r"mcptools.*symlink") as refused:
        await generate_mcp_sources("edge", params.edge(), mcptools)

    assert "remove" in str(refused.value), "the error says what to do"
    _untouched(victim)
    assert mcptools.is_symlink()


def test_replacing_a_package_dir_replaced_by_a_symlink_is_refused(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    mcptools = tmp_path / "mcptools"
    mcptools.mkdir()
    (mcptools / "edge").symlink_to(victim / "edge")

    with pytest.raises(OSError, match=r"edge.*symlink"):
        write_mcp_sources("edge", [TOOL], mcptools)

    _untouched(victim)
    assert [p.name for p in mcptools.iterdir()] == ["edge"], "no staging directory is left behind"


def test_a_mcptools_dir_replaced_by_a_symlink_to_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "bashrc"
    target.write_text("# mine\n")
    (tmp_path / "mcptools").symlink_to(target)

    with pytest.raises(OSError, match="symlink"):
        write_mcp_sources("edge", [TOOL], tmp_path / "mcptools")

    assert target.read_text() == "# mine\n"


def test_generation_still_goes_through_symlinks_above_the_mcptools_dir(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert write_mcp_sources("calc", [TOOL], tmp_path / "link" / "mcptools") == ["add"]
    assert (real / "mcptools" / "calc" / "add.py").is_file()
