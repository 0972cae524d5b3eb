"""Generation and the host's registry are apart: `generate_sources` writes a package and nothing else;
`generate_mcp_sources` (published) also records the server, so a later `CodeExecutor` finds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.mcp_apigen.sources import generate_mcp_sources, generate_sources, wait_for_stopped_servers
from ipybox.mcp_client import ServerParamsError
from ipybox.mcp_client.params import dump_server_params
from ipybox.mcp_client.registry import ServerRegistry
from tests.servers import params


@pytest.mark.integration
async def test_the_generator_writes_the_package_and_leaves_the_registry_alone(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "ipybox" / "mcp_servers.json")
    root = tmp_path / "mcptools"
    generated = await generate_sources("edge", params.edge(), root)
    await wait_for_stopped_servers()
    assert generated.modules and (root / "edge" / "__init__.py").is_file()
    assert dump_server_params(generated.params) == params.edge()
    assert not registry.path.exists()


@pytest.mark.integration
async def test_the_published_function_records_the_parsed_parameters(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "ipybox" / "mcp_servers.json")
    root = tmp_path / "mcptools"
    server = {**params.edge(), "env": {"EDGE_ENV": "${EDGE_VALUE}"}}
    (tmp_path / ".env").write_text("EDGE_VALUE=filled-on-the-host\n")
    await generate_mcp_sources("edge", server, root, registry=registry, dotenv_path=tmp_path / ".env")
    await wait_for_stopped_servers()
    assert registry.servers(root) == {"edge": server}  # placeholders recorded unfilled


async def test_invalid_parameters_start_nothing_and_write_nothing(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "ipybox" / "mcp_servers.json")
    root = tmp_path / "mcptools"
    with pytest.raises(ServerParamsError, match="'headers' is for url servers"):
        await generate_mcp_sources("edge", {**params.edge(), "headers": {}}, root, registry=registry)
    assert not root.exists() and not registry.path.exists()
