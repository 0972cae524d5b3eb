"""`MCPServers.resolve_key`: which server a call reaches when its generated module names the package root it
sits in (issue 15, item 6). Given servers first, then the root's own, then `lookup` (`mcptools_dir`); the
same name generated into two roots with different parameters is two servers. Only the pool's own
`package_roots` are looked up (issue 30): a call naming any other root is refused. Against a real registry
file; nothing is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.mcp_client.pool import MAX_PACKAGE_KEYS, ForeignPackageRootError, MCPServers, UnknownServerError
from ipybox.mcp_client.registry import RegisteredServer, ServerRegistry

DEFAULT = {"command": "edge", "args": ["default"]}
OTHER = {"command": "edge", "args": ["other"]}
SECOND = {"command": "edge", "args": ["second"]}


@pytest.fixture
def registry(tmp_path: Path) -> ServerRegistry:
    return ServerRegistry(tmp_path / "state" / "mcp_servers.json")


def _pool(registry: ServerRegistry, mcptools: Path, *roots: Path) -> MCPServers:
    """A pool wired as `CodeExecutor(mcptools_dir=mcptools, package_roots=roots)` wires its tool server's."""
    return MCPServers(
        lookup=lambda name: registry.servers(mcptools).get(name),
        package_lookup=registry.package_server,
        package_roots=[mcptools, *roots],
    )


def test_a_root_outside_mcptools_dir_resolves_to_the_server_generated_there(
    registry: ServerRegistry, tmp_path: Path
) -> None:
    other = tmp_path / "other" / "tools"
    registry.register(other, "edge", OTHER, {"echo": {"readOnlyHint": True}})
    pool = _pool(registry, tmp_path / "work" / "mcptools", other)
    key = pool.resolve_key("edge", str(other))
    assert pool.resolve(key) == OTHER
    # Its recorded annotations decide its first call, before it starts.
    assert pool.known_annotations(key, "echo") == {"readOnlyHint": True}
    # Without the root, the name alone is what it was before: unknown here.
    with pytest.raises(UnknownServerError):
        pool.resolve_key("edge")


def test_the_same_name_in_two_roots_with_different_parameters_is_two_servers(
    registry: ServerRegistry, tmp_path: Path
) -> None:
    mcptools, other, second = tmp_path / "work" / "mcptools", tmp_path / "other", tmp_path / "second"
    registry.register(mcptools, "edge", DEFAULT)
    registry.register(other, "edge", OTHER)
    registry.register(second, "edge", SECOND)
    pool = _pool(registry, mcptools, other, second)
    keys = [pool.resolve_key("edge", str(root)) for root in (other, second)] + [pool.resolve_key("edge")]
    assert [pool.resolve(key) for key in keys] == [OTHER, SECOND, DEFAULT]
    assert len(set(keys)) == 3
    assert keys[0] == f"edge ({other.resolve()})" and keys[2] == "edge"
    # Asked again (from the cache), the same answers.
    assert pool.resolve_key("edge", str(other)) == keys[0]


def test_a_root_with_the_same_parameters_as_mcptools_dir_shares_the_names_server(
    registry: ServerRegistry, tmp_path: Path
) -> None:
    mcptools, copy = tmp_path / "work" / "mcptools", tmp_path / "copy"
    registry.register(mcptools, "edge", DEFAULT)
    registry.register(copy, "edge", DEFAULT)
    pool = _pool(registry, mcptools, copy)
    assert pool.resolve_key("edge", str(mcptools)) == "edge"
    assert pool.resolve_key("edge", str(copy)) == "edge"
    assert pool.names == ["edge"]


def test_given_servers_come_before_any_root(registry: ServerRegistry, tmp_path: Path) -> None:
    other = tmp_path / "other"
    registry.register(other, "edge", OTHER)
    pool = MCPServers({"edge": DEFAULT}, package_lookup=registry.package_server)
    assert pool.resolve_key("edge", str(other)) == "edge"
    assert pool.resolve("edge") == DEFAULT
    pool.register("late", SECOND)
    registry.register(other, "late", OTHER)
    assert pool.resolve_key("late", str(other)) == "late"


def test_an_own_root_without_the_name_falls_through_to_mcptools_dir_and_else_is_unknown(
    registry: ServerRegistry, tmp_path: Path
) -> None:
    mcptools, empty = tmp_path / "work" / "mcptools", tmp_path / "empty"
    registry.register(mcptools, "edge", DEFAULT)
    pool = _pool(registry, mcptools, empty)
    assert pool.resolve(pool.resolve_key("edge", str(empty))) == DEFAULT
    with pytest.raises(UnknownServerError, match=rf"no MCP server named 'ghost' was generated into {empty}"):
        pool.resolve_key("ghost", str(empty))


def test_a_root_that_is_not_the_pools_own_is_refused_before_the_registry_is_read(
    registry: ServerRegistry, tmp_path: Path
) -> None:
    mcptools, project = tmp_path / "work" / "mcptools", tmp_path / "project" / "mcptools"
    registry.register(mcptools, "edge", DEFAULT)
    registry.register(project, "secret", OTHER)
    registry.register(project, "edge", OTHER)
    reads: list[str] = []

    def lookup(root: str, name: str) -> RegisteredServer | None:
        reads.append(root)
        return registry.package_server(root, name)

    pool = MCPServers(
        lookup=lambda name: registry.servers(mcptools).get(name),
        package_lookup=lookup,
        package_roots=[mcptools],
    )
    # Another project's root, also by a symlink in a directory the kernel writes, and a forged one: even
    # a name mcptools_dir has is not served for them.
    link = tmp_path / "work" / "link"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(project)
    for root, name in [
        (project, "secret"),
        (project, "edge"),
        (link, "secret"),
        (tmp_path / "forged", "edge"),
    ]:
        with pytest.raises(ForeignPackageRootError, match=rf"tool package in {root}, which is not one of"):
            pool.resolve_key(name, str(root))
    assert reads == []
    assert pool.names == []


def test_a_pool_without_package_lookup_ignores_the_root(registry: ServerRegistry, tmp_path: Path) -> None:
    # A workspace's tool server: its servers come from ipybox.toml, whatever root a module names.
    other = tmp_path / "other"
    registry.register(other, "edge", OTHER)
    pool = MCPServers({"edge": DEFAULT})
    assert pool.resolve_key("edge", str(other)) == "edge"
    with pytest.raises(UnknownServerError, match="no MCP server named 'ghost' is registered"):
        pool.resolve_key("ghost", str(other))


def test_ever_new_roots_keep_the_cache_bounded(registry: ServerRegistry, tmp_path: Path) -> None:
    mcptools = tmp_path / "mcptools"
    registry.register(mcptools, "edge", DEFAULT)
    reads = 0

    def counting(root: str, name: str) -> None:
        nonlocal reads
        reads += 1
        return None

    pool = MCPServers(
        lookup=lambda name: registry.servers(mcptools).get(name),
        package_lookup=counting,
        package_roots=[mcptools],
    )

    def spelling(i: int) -> str:  # ever new spellings of the pool's own root
        return f"{mcptools}/{'./' * i}"

    for i in range(MAX_PACKAGE_KEYS + 10):
        assert pool.resolve_key("edge", spelling(i)) == "edge"
    assert len(pool._package_keys) <= MAX_PACKAGE_KEYS
    pool.resolve_key("edge", spelling(1))
    pool.resolve_key("edge", spelling(MAX_PACKAGE_KEYS + 9))
    assert reads == MAX_PACKAGE_KEYS + 11  # the last one was cached, the first forgotten
