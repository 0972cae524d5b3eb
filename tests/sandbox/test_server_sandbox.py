"""Per-server sandboxes: a stdio MCP server run with `sandbox` in its parameters is confined like a kernel,
under a policy of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from ipybox.mcp_client import MCPConnection
from ipybox.mcp_client.params import parse_server_params
from tests.servers import params

pytestmark = pytest.mark.integration

OUTSIDE = Path(__file__).resolve().parent  # on the host, outside the workspace and /tmp


def text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def connect(name: str, server_params: dict[str, Any]) -> MCPConnection:
    connection = MCPConnection(name, parse_server_params(name, server_params))
    await connection.start()
    return connection


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workspace = tmp_path_factory.mktemp("server-sandbox")
    (workspace / ".env").write_text("TOKEN=server-sandbox-secret\n")
    (workspace / "notes").mkdir()
    return workspace


@pytest.fixture(scope="module")
async def filesystem(workspace: Path) -> AsyncIterator[MCPConnection]:
    server = {**params.filesystem(workspace, OUTSIDE), "cwd": str(workspace), "sandbox": True}
    connection = await connect("fs", server)
    yield connection
    await connection.stop()


async def test_it_works_in_its_workspace(filesystem: MCPConnection, workspace: Path) -> None:
    note = workspace / "notes" / "note.txt"
    await filesystem.call_tool("write_file", {"path": str(note), "content": "kept"})
    assert note.read_text() == "kept"
    assert "kept" in text(await filesystem.call_tool("read_text_file", {"path": str(note)}))


async def test_its_workspace_top_level_stays_as_it_started(
    filesystem: MCPConnection, workspace: Path
) -> None:
    # The top level is where the host's files live (.env, ipybox.toml, .git): no name is added there.
    result = await filesystem.call_tool("write_file", {"path": str(workspace / ".env.new"), "content": "X=1"})
    assert result.is_error and "read-only" in text(result).lower()
    assert not (workspace / ".env.new").exists()


async def test_it_cannot_read_secrets_it_was_given_access_to(
    filesystem: MCPConnection, workspace: Path
) -> None:
    result = await filesystem.call_tool("read_text_file", {"path": str(workspace / ".env")})
    assert "server-sandbox-secret" not in text(result)


async def test_it_cannot_write_outside_its_workspace(filesystem: MCPConnection) -> None:
    target = OUTSIDE / "written-by-a-sandboxed-server.txt"
    result = await filesystem.call_tool("write_file", {"path": str(target), "content": "escaped"})
    assert result.is_error and "read-only" in text(result).lower()
    assert not target.exists()


async def test_no_network_by_default(workspace: Path, host_http_server: int) -> None:
    url = f"http://localhost:{host_http_server}/direct"
    unsandboxed = await connect("edge", params.edge())
    try:  # the control: the same call outside a sandbox reaches the server
        assert text(await unsandboxed.call_tool("fetch", {"url": url})) == "200 GET /direct"
    finally:
        await unsandboxed.stop()
    sandboxed = await connect("edge", {**params.edge(), "cwd": str(workspace), "sandbox": True})
    try:
        assert text(await sandboxed.call_tool("fetch", {"url": url})).startswith("error:")
    finally:
        await sandboxed.stop()


async def test_its_own_policy_allows_its_own_domains(workspace: Path, host_http_server: int) -> None:
    policy = {"network": {"allowedDomains": ["localhost"]}}
    sandboxed = await connect("edge", {**params.edge(), "cwd": str(workspace), "sandbox": policy})
    try:
        allowed = await sandboxed.call_tool("fetch", {"url": f"http://localhost:{host_http_server}/proxied"})
        assert text(allowed) == "200 GET /proxied"
        refused = await sandboxed.call_tool("fetch", {"url": "http://example.com/"})
        assert text(refused).startswith(
            "403 ipybox sandbox: example.com is not in network.allowedDomains; a person allows it by adding it"
        )
    finally:
        await sandboxed.stop()


async def test_a_bad_policy_is_one_clear_error() -> None:
    from ipybox.mcp_client import ServerParamsError

    with pytest.raises(ServerParamsError, match=r"sandbox\.network\.allowedDomains"):
        parse_server_params(
            "edge", {**params.edge(), "sandbox": {"network": {"allowedDomains": ["http://x"]}}}
        )
