import stat
from pathlib import Path

import pytest

from ipybox.mcp_client.registry import (
    ServerRegistry,
    UnsafeRegistryError,
    default_registry_path,
    ensure_registry_dir,
    registry_dir,
)


def test_register_lookup_unregister(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "servers.json")
    root = tmp_path / "ws" / "mcptools"
    registry.register(root, "fs", {"command": "node", "args": ["x"]})
    registry.register(root, "time", {"command": "t"})
    registry.register(tmp_path / "other", "fs", {"command": "other"})
    assert registry.servers(root) == {"fs": {"command": "node", "args": ["x"]}, "time": {"command": "t"}}
    # The same root spelled differently is the same root.
    assert registry.servers(tmp_path / "ws" / "." / "mcptools") == registry.servers(root)
    registry.unregister(root, "time")
    assert list(registry.servers(root)) == ["fs"]
    assert registry.servers(tmp_path / "other") == {"fs": {"command": "other"}}
    assert ServerRegistry(tmp_path / "nothing.json").servers(root) == {}


def test_default_path_follows_xdg_state_home(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_registry_path() == tmp_path / "ipybox" / "mcp_servers.json"


def test_the_registry_directory_follows_xdg_state_home_and_ignores_a_relative_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert registry_dir() == tmp_path / "ipybox"
    assert default_registry_path().parent == registry_dir()
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert registry_dir() == tmp_path / "home" / ".local" / "state" / "ipybox"


def test_ensure_registry_dir_creates_it_private_and_refuses_a_symlink(tmp_path: Path) -> None:
    made = ensure_registry_dir(tmp_path / "state" / "ipybox")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "other")
    with pytest.raises(UnsafeRegistryError, match="symlink"):
        ensure_registry_dir(tmp_path / "link")
