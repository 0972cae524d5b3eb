import json
import stat
from pathlib import Path

import pytest

from ipybox.mcp_client import ServerParamsError
from ipybox.mcp_client import registry as registry_module
from ipybox.mcp_client.params import validate_server_params
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


def test_an_entry_is_stored_as_the_models_dump_and_loaded_back_with_the_model(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "servers.json")
    root = tmp_path / "mcptools"
    policy = {"network": {"allowedDomains": ["pypi.org"]}}
    registry.register(root, "fs", {"command": "x", "sandbox": policy})
    registry.register(root, "remote", {"url": "https://example.com/mcp", "type": "http"})
    registry.register(root, "model", validate_server_params("model", {"command": "y", "sandbox": True}))
    stored = json.loads(registry.path.read_text())[str(root.resolve())]
    assert stored == {
        "fs": {"command": "x", "sandbox": policy},  # a sandbox is never dropped
        "remote": {"url": "https://example.com/mcp", "type": "streamable_http"},  # loads in ipybox.toml too
        "model": {"command": "y", "sandbox": True},
    }
    assert registry.servers(root) == stored


def test_invalid_parameters_are_refused_and_nothing_is_recorded(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "servers.json")
    root = tmp_path / "mcptools"
    with pytest.raises(ServerParamsError, match=r"'bad'.*type: Input should be 'streamable_http' or 'sse'"):
        registry.register(root, "bad", {"url": "https://example.com/mcp", "type": "websocket"})
    assert registry.servers(root) == {}


def test_an_entry_edited_into_something_invalid_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = ServerRegistry(tmp_path / "state" / "servers.json")
    root = tmp_path / "mcptools"
    registry.register(root, "good", {"command": "x"})
    data = json.loads(registry.path.read_text())
    data[str(root.resolve())]["bad"] = {"command": "x", "headers": {"A": "b"}}
    registry.path.write_text(json.dumps(data))
    assert registry.servers(root) == {"good": {"command": "x"}}
    assert "'headers' is for url servers" in caplog.text


def test_annotations_recorded_for_parameters_are_found_for_any_spelling_of_them(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "servers.json")
    root = tmp_path / "mcptools"
    registry.register(
        root, "r", {"url": "https://example.com/mcp", "type": "http"}, {"t": {"readOnlyHint": True}}
    )
    for spelling in ("http", "streamable_http", "STREAMABLE-HTTP"):
        params = {"url": "https://example.com/mcp", "type": spelling}
        assert registry.recorded_annotations(root, "r", params) == {"t": {"readOnlyHint": True}}
    assert registry.recorded_annotations(root, "r", {"url": "https://example.com/mcp", "type": "sse"}) is None


def test_literal_values_of_env_and_headers_are_recorded_as_placeholders(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry_module, "_given_here", {})  # this process's values: the test's own
    registry = ServerRegistry(tmp_path / "state" / "servers.json")
    root = tmp_path / "mcptools"
    headers = {"Authorization": "Bearer sk-header", "X-Org": "org-${ORG}", "X-Empty": ""}
    registry.register(root, "github", {"url": "https://example.com/mcp", "headers": headers}, {"t": {}})
    env = {"API_KEY": "sk-env", "my-var": "sk-odd-name", "HOME_DIR": "${HOME}"}
    registry.register(root, "local", {"command": "srv", "env": env})
    text = registry.path.read_text()
    assert not any(secret in text for secret in ("sk-header", "sk-env", "sk-odd-name"))
    recorded = json.loads(text)[str(root.resolve())]
    assert recorded["github"]["headers"] == {
        "Authorization": "${GITHUB_AUTHORIZATION}",
        "X-Org": "org-${ORG}",
        "X-Empty": "",
    }
    assert recorded["local"]["env"] == {"API_KEY": "${API_KEY}", "my-var": "${my_var}", "HOME_DIR": "${HOME}"}
    assert "GITHUB_AUTHORIZATION" in caplog.text and "my_var" in caplog.text
    # This process reads its own entries back as it gave them, with their annotations.
    servers = registry.servers(root)
    assert servers["local"]["env"] == env and servers["github"]["headers"] == headers
    assert registry.recorded_annotations(root, "github", servers["github"]) == {"t": {}}


def test_literal_values_an_earlier_version_recorded_serve_their_root_until_the_next_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry_module, "_given_here", {})  # this process's values: the test's own
    registry = ServerRegistry(tmp_path / "state" / "servers.json")
    root = tmp_path / "mcptools"
    old = {"command": "srv", "env": {"API_KEY": "sk-old"}}
    with pytest.MonkeyPatch.context() as earlier:  # as an earlier version wrote it
        earlier.setattr(registry_module, "recorded_form", lambda name, params: (dict(params), {}))
        registry.register(root, "old", old, {"t": {"readOnlyHint": True}})
    monkeypatch.setattr(registry_module, "_given_here", {})  # read by another process
    assert registry.servers(root) == {"old": old}
    registry.register(tmp_path / "elsewhere", "new", {"command": "new"})
    assert "sk-old" not in registry.path.read_text()
    scrubbed = registry.servers(root)["old"]
    assert scrubbed["env"] == {"API_KEY": "${API_KEY}"}
    assert registry.recorded_annotations(root, "old", scrubbed) == {"t": {"readOnlyHint": True}}
    assert "API_KEY" in caplog.text
