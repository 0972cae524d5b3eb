"""`ipybox.safefs.open_dir`: a directory a kernel may write in is reached without following a symlink
anywhere on its path, so what a kernel planted there makes the host write nothing outside."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ipybox.safefs import LinkInPathError, open_dir, read_file, replace_file


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir()
    return victim


@pytest.mark.parametrize("link", ["out", "out/a", "out/a/images"])
def test_a_symlink_at_any_depth_of_the_path_is_refused_and_nothing_is_made_behind_it(
    tmp_path: Path, link: str
) -> None:
    victim, workspace = _victim(tmp_path), tmp_path / "workspace"
    (workspace / link).parent.mkdir(parents=True, exist_ok=True)
    (workspace / link).symlink_to(victim)
    with pytest.raises(LinkInPathError) as info:
        open_dir(workspace / "out" / "a" / "images", create_mode=0o777)
    assert str(info.value).startswith(f"{workspace / link} is a symlink, so ipybox does not write in ")
    assert list(victim.iterdir()) == []
    assert isinstance(info.value, OSError)  # callers that catch OSError fall back, as before


def test_a_symlink_to_nowhere_is_refused_and_its_target_is_not_made(tmp_path: Path) -> None:
    (tmp_path / "images").symlink_to(tmp_path / "made-by-the-host")
    with pytest.raises(LinkInPathError, match="is a symlink"):
        open_dir(tmp_path / "images" / "x", create_mode=0o777)
    assert not (tmp_path / "made-by-the-host").exists()


def test_a_file_on_the_way_is_refused_as_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("")
    with pytest.raises(LinkInPathError, match=f"{tmp_path / 'out'} is not a directory"):
        open_dir(tmp_path / "out" / "images", create_mode=0o777)


def test_missing_directories_are_made_with_the_mode_and_written_through_the_descriptor(
    tmp_path: Path,
) -> None:
    target = tmp_path / "a" / "b" / "images"
    fd = open_dir(target, create_mode=0o700)
    try:
        replace_file(fd, "x.png", b"png")
    finally:
        os.close(fd)
    assert (target / "x.png").read_bytes() == b"png"
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700 == stat.S_IMODE(target.stat().st_mode)


def test_without_a_create_mode_a_missing_directory_is_not_made(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_dir(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def test_a_relative_path_is_walked_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = _victim(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").symlink_to(victim)
    with pytest.raises(LinkInPathError, match=r"^images is a symlink"):
        open_dir(Path("images/sub"), create_mode=0o777)
    os.close(open_dir(Path("own/images"), create_mode=0o777))
    assert (tmp_path / "own" / "images").is_dir() and list(victim.iterdir()) == []


def test_a_file_replaced_by_a_symlink_or_a_fifo_is_not_read(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    (tmp_path / "secret").write_bytes(b"secret")
    (images / "plot.png").write_bytes(b"png")
    assert read_file(images / "plot.png") == b"png"
    (images / "linked.png").symlink_to(tmp_path / "secret")
    with pytest.raises(LinkInPathError, match=r"linked\.png is a symlink, so ipybox does not read it"):
        read_file(images / "linked.png")
    os.mkfifo(images / "fifo.png")  # would block a reader forever
    with pytest.raises(LinkInPathError, match="is not a regular file"):
        read_file(images / "fifo.png")
    (tmp_path / "out").symlink_to(images)
    with pytest.raises(LinkInPathError, match="out is a symlink"):
        read_file(tmp_path / "out" / "plot.png")


def test_a_bounded_read_stops_one_byte_past_the_bound(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"0123456789")
    assert read_file(tmp_path / "big", max_bytes=3) == b"0123"
    assert read_file(tmp_path / "big", max_bytes=10) == b"0123456789"
