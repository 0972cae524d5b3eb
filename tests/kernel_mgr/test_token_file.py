"""Where a 0.9-style `KernelGateway` publishes its auth token, and what a reader accepts: only a regular
file of this user's alone, of a gateway that still runs, in a directory that is this user's (0700)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ipybox.kernel_mgr import token_file
from ipybox.kernel_mgr.token_file import UnsafeTokenDirError


def test_a_published_token_is_read_back_under_any_spelling_of_the_loopback_host(tmp_path: Path) -> None:
    directory = tmp_path / "gateways"
    path = token_file.publish("localhost", 8888, "http://127.0.0.1:8888", "secret", os.getpid(), directory)
    assert path == directory / "127.0.0.1-8888.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for host in ("localhost", "127.0.0.1", " localhost"):
        found = token_file.read(host, 8888, directory)
        assert found is not None and found.token == "secret"
    assert token_file.read("localhost", 8889, directory) is None  # keyed by port too


def test_ipv6_loopback_names_one_file(tmp_path: Path) -> None:
    path = token_file.publish("[::1]", 9000, "http://[::1]:9000", "t6", os.getpid(), tmp_path)
    assert path.name == "__1-9000.json"
    found = token_file.read("::1", 9000, tmp_path)
    assert found is not None and found.token == "t6"


def test_the_token_of_a_gateway_that_is_gone_is_not_used(tmp_path: Path) -> None:
    token_file.publish("localhost", 8888, "http://127.0.0.1:8888", "stale", 2**22 + 12345, tmp_path)
    assert token_file.read("localhost", 8888, tmp_path) is None


def test_a_file_others_can_read_is_ignored(tmp_path: Path) -> None:
    path = token_file.publish("localhost", 8888, "http://127.0.0.1:8888", "secret", os.getpid(), tmp_path)
    path.chmod(0o644)
    assert token_file.read("localhost", 8888, tmp_path) is None


def test_a_symlink_in_place_of_the_file_is_ignored(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"url": "u", "token": "planted", "pid": os.getpid()}))
    target.chmod(0o600)
    (tmp_path / "127.0.0.1-8888.json").symlink_to(target)
    assert token_file.read("localhost", 8888, tmp_path) is None


def test_a_file_that_is_not_a_gateways_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "127.0.0.1-8888.json"
    path.write_text("not json")
    path.chmod(0o600)
    assert token_file.read("localhost", 8888, tmp_path) is None


def test_publishing_tightens_a_loose_directory_of_this_user(tmp_path: Path) -> None:
    directory = tmp_path / "gateways"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    token_file.publish("localhost", 8888, "http://127.0.0.1:8888", "secret", os.getpid(), directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_publishing_through_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "gateways").symlink_to(real)
    with pytest.raises(UnsafeTokenDirError, match="is a symlink"):
        token_file.publish("localhost", 8888, "u", "secret", os.getpid(), tmp_path / "gateways")
    assert list(real.iterdir()) == []


def test_remove_leaves_another_gateways_token_alone(tmp_path: Path) -> None:
    token_file.publish("localhost", 8888, "u", "theirs", os.getpid(), tmp_path)
    token_file.remove("localhost", 8888, "mine", tmp_path)
    assert (tmp_path / "127.0.0.1-8888.json").exists()
    token_file.remove("localhost", 8888, "theirs", tmp_path)
    assert not (tmp_path / "127.0.0.1-8888.json").exists()


def test_the_default_directory_is_under_the_user_state_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert (
        token_file.token_path("localhost", 8888) == tmp_path / "ipybox" / "gateways" / "127.0.0.1-8888.json"
    )
