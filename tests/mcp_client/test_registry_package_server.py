"""`ServerRegistry.package_server`: the server recorded for the package root a kernel's generated module
names (issue 15, item 6). The root is the kernel's word, so it only ever selects what the registry records."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.mcp_client.registry import MAX_ROOT_CHARS, RegisteredServer, ServerRegistry

EDGE = {"command": "edge", "args": ["--a"]}


@pytest.fixture
def registry(tmp_path: Path) -> ServerRegistry:
    return ServerRegistry(tmp_path / "state" / "mcp_servers.json")


def test_a_recorded_root_gives_its_server_with_the_annotations_recorded_for_it(
    registry: ServerRegistry, tmp_path: Path
) -> None:
    root = tmp_path / "other" / "tools"
    registry.register(root, "edge", EDGE, {"echo": {"readOnlyHint": True}})
    found = registry.package_server(str(root), "edge")
    assert found == RegisteredServer(str(root.resolve()), EDGE, {"echo": {"readOnlyHint": True}})


def test_a_root_reached_through_a_symlink_or_dots_is_the_recorded_root(
    registry: ServerRegistry, tmp_path: Path
) -> None:
    root = tmp_path / "other" / "tools"
    root.mkdir(parents=True)
    registry.register(root, "edge", EDGE)
    (tmp_path / "link").symlink_to(tmp_path / "other")
    for spelled in (tmp_path / "link" / "tools", tmp_path / "other" / "." / "tools"):
        found = registry.package_server(str(spelled), "edge")
        assert found is not None and found.root == str(root.resolve()) and found.annotations is None


@pytest.mark.parametrize(
    "root",
    [
        "relative/tools",  # resolved against the host's cwd, not the kernel's: never looked up
        "tool_annotations",  # the registry's own section, not a root
        "",
        "/" + "x" * MAX_ROOT_CHARS,
        "/tmp/with\0nul",
    ],
)
def test_a_root_that_is_not_an_absolute_path_finds_nothing(registry: ServerRegistry, root: str) -> None:
    registry.register(Path("relative/tools"), "edge", EDGE)
    assert registry.package_server(root, "edge") is None


def test_an_unrecorded_root_or_name_finds_nothing(registry: ServerRegistry, tmp_path: Path) -> None:
    registry.register(tmp_path / "tools", "edge", EDGE)
    assert registry.package_server(str(tmp_path / "forged"), "edge") is None
    assert registry.package_server(str(tmp_path / "tools"), "other") is None
    assert (
        ServerRegistry(tmp_path / "none" / "x.json").package_server(str(tmp_path / "tools"), "edge") is None
    )


def test_a_symlink_loop_finds_nothing(registry: ServerRegistry, tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert registry.package_server(str(tmp_path / "loop" / "tools"), "edge") is None


def test_annotations_recorded_for_other_parameters_are_not_given(
    registry: ServerRegistry, tmp_path: Path
) -> None:
    root = tmp_path / "tools"
    registry.register(root, "edge", EDGE, {"echo": {"readOnlyHint": True}})
    data = registry.path.read_text().replace('"--a"', '"--b"', 1)  # parameters changed behind its back
    registry.path.write_text(data)
    found = registry.package_server(str(root), "edge")
    assert found is not None and found.params == {"command": "edge", "args": ["--b"]}
    assert found.annotations is None
