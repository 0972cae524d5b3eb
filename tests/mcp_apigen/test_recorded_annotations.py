"""`generate_mcp_sources` records each tool's annotations, from the real server's own listing, in the host's
registry beside the server's parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.mcp_apigen.sources import generate_mcp_sources, wait_for_stopped_servers
from ipybox.mcp_client.registry import ServerRegistry
from tests.servers import params

pytestmark = pytest.mark.integration


async def test_generation_records_each_tools_annotations_for_the_servers_parameters(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "ipybox" / "mcp_servers.json")
    root = tmp_path / "mcptools"
    data = tmp_path / "data"
    data.mkdir()
    server = params.filesystem(data)
    names = await generate_mcp_sources("filesystem", server, root, registry=registry)
    await wait_for_stopped_servers()
    recorded = registry.recorded_annotations(root, "filesystem", server)
    assert recorded is not None
    assert sorted(recorded) == sorted(names)  # every listed tool (their names are identifiers here)
    assert recorded["list_directory"]["readOnlyHint"] is True
    assert (
        recorded["write_file"]["readOnlyHint"] is False and recorded["write_file"]["destructiveHint"] is True
    )
    assert registry.servers(root) == {"filesystem": server}


async def test_generating_again_with_other_parameters_records_the_annotations_for_those(
    tmp_path: Path,
) -> None:
    registry = ServerRegistry(tmp_path / "state" / "ipybox" / "mcp_servers.json")
    root = tmp_path / "mcptools"
    first, second = params.filesystem(tmp_path), params.filesystem(tmp_path / "mcptools")
    await generate_mcp_sources("filesystem", first, root, registry=registry)
    await generate_mcp_sources("filesystem", second, root, registry=registry)
    await wait_for_stopped_servers()
    assert registry.recorded_annotations(root, "filesystem", first) is None
    recorded = registry.recorded_annotations(root, "filesystem", second)
    assert recorded is not None and recorded["read_text_file"]["readOnlyHint"] is True
