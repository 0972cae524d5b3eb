from pathlib import Path

from ipybox.tool_exec.registry import ServerRegistry, default_registry_path


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
