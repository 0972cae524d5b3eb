"""The catalog's filesystem server, as `ipybox init --server filesystem` writes it, is no confused deputy:
code in a kernel chooses its arguments, and through it gets nothing its own sandbox keeps from it (the
real npm server from .cache/npm, run as the workspace runs it: `WorkspaceConfig.server_params`)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from ipybox.cli import init as init_module
from ipybox.cli.main import main
from ipybox.config import load_config
from ipybox.mcp_client import MCPConnection
from ipybox.mcp_client.params import parse_server_params
from ipybox.sandbox.command import sandboxed
from ipybox.sandbox.policy import SandboxPolicy
from tests.sandbox.conftest import OUTSIDE_PARENT
from tests.servers.params import CACHE

pytestmark = pytest.mark.integration

NPM_BIN = CACHE / "npm" / "node_modules" / ".bin"
SECRET = "catalog-server-secret"
TOKEN = "catalog-server-state-token"


def text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def _init(workspace: Path) -> None:
    """`ipybox init --server filesystem`, then what a running workspace holds: secrets and state."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            init_module, "_sandbox_available", lambda: True
        )  # the doctor's probe is not tested here
        assert main(["init", str(workspace), "--server", "filesystem"]) == 0
    (workspace / ".env").write_text(f"TOKEN={SECRET}\n")
    (workspace / ".ipybox").mkdir(exist_ok=True)  # `ipybox init` makes it (its schema copy)
    (workspace / ".ipybox" / "state.json").write_text(f'{{"token": "{TOKEN}"}}\n')
    (workspace / "sub").mkdir()


async def _connect(workspace: Path, name: str) -> MCPConnection:
    """The server `name` of the workspace, started as the workspace starts it; its program found where
    `bash scripts/setup` installed it (the README's `npm install -g`, for the tests)."""
    assert (NPM_BIN / "mcp-server-filesystem").exists(), "run `bash scripts/setup`"
    server: dict[str, Any] = load_config(workspace).server_params(name)
    server["env"] = {**server.get("env", {}), "PATH": f"{NPM_BIN}{os.pathsep}{os.environ['PATH']}"}
    connection = MCPConnection(name, parse_server_params(name, server))
    await connection.start()
    return connection


@pytest.fixture(scope="module")
def outside() -> Iterator[Path]:
    """A host directory outside /tmp, which a sandbox replaces with its own: workspaces are rarely in /tmp,
    and only outside it does the view alone stand between the server and the host's files."""
    directory = Path(tempfile.mkdtemp(prefix="ipybox-catalog-", dir=OUTSIDE_PARENT))
    yield directory
    shutil.rmtree(directory)


@pytest.fixture(scope="module")
def workspace(outside: Path) -> Path:
    workspace = outside / "ws"
    _init(workspace)
    return workspace


@pytest.fixture(scope="module")
async def filesystem(workspace: Path) -> AsyncIterator[MCPConnection]:
    connection = await _connect(workspace, "filesystem")
    yield connection
    await connection.stop()


async def test_the_catalog_filesystem_server_reads_no_env_or_state_for_a_kernel(
    filesystem: MCPConnection, workspace: Path
) -> None:
    # The rules would let these read-only calls run without asking anyone: only the sandbox stands here.
    for path in (".env", ".ipybox/state.json", str(workspace / ".env")):
        result = await filesystem.call_tool("read_text_file", {"path": path})
        assert SECRET not in text(result) and TOKEN not in text(result), path
    listing = text(await filesystem.call_tool("search_files", {"path": ".", "pattern": "state"}))
    assert "state.json" not in listing
    # The control: the server works in its workspace.
    (workspace / "sub" / "plain.md").write_text("plain")
    assert text(await filesystem.call_tool("read_text_file", {"path": "sub/plain.md"})) == "plain"


async def test_an_approved_write_through_a_kernel_made_link_leaves_ipybox_toml_alone(
    filesystem: MCPConnection, workspace: Path
) -> None:
    config = workspace / "ipybox.toml"
    before = config.read_bytes()
    # The kernel makes the link (in a sandbox as a kernel's: it may write below the top level).
    async with sandboxed(["ln", "-s", "../ipybox.toml", "sub/notes.md"], SandboxPolicy(), workspace) as argv:
        process = await asyncio.create_subprocess_exec(*argv)
        assert await process.wait() == 0
    assert os.readlink(workspace / "sub" / "notes.md") == "../ipybox.toml"
    # A person allowed the write once: the call reaches the server.
    result = await filesystem.call_tool("write_file", {"path": "sub/notes.md", "content": "[servers.x]\n"})
    assert result.is_error, text(result)
    assert config.read_bytes() == before
    moved = await filesystem.call_tool("move_file", {"source": "sub/plain.md", "destination": "sub/notes.md"})
    assert config.read_bytes() == before, text(moved)


async def test_a_server_in_a_subdirectory_sees_no_workspace_state_wherever_it_is(outside: Path) -> None:
    workspace, elsewhere = outside / "below", outside / "elsewhere"
    _init(workspace)
    elsewhere.mkdir()
    state = elsewhere / "state"
    state.mkdir()
    (state / "state.json").write_text(f'{{"token": "{TOKEN}"}}\n')
    text_of = (workspace / "ipybox.toml").read_text()
    text_of = text_of.replace('state_dir = ".ipybox"', f'state_dir = "{state}"')
    # A server that runs in `sub` but was given the workspace and the state's directory as well.
    text_of += (
        f'\n[servers.below]\ncommand = "mcp-server-filesystem"\nargs = [".", "{workspace}", "{elsewhere}"]\n'
    )
    text_of += 'cwd = "sub"\nsandbox = true\n'
    (workspace / "ipybox.toml").write_text(text_of)
    (workspace / "readme.md").write_text("shown")
    connection = await _connect(workspace, "below")
    try:
        for path in (workspace / ".ipybox" / "state.json", state / "state.json", workspace / ".env"):
            result = await connection.call_tool("read_text_file", {"path": str(path)})
            assert TOKEN not in text(result) and SECRET not in text(result), path
        before = (workspace / "ipybox.toml").read_bytes()
        result = await connection.call_tool(
            "write_file", {"path": str(workspace / "ipybox.toml"), "content": ""}
        )
        assert result.is_error and (workspace / "ipybox.toml").read_bytes() == before
        # The control: what it was given otherwise, it reads.
        assert (
            text(await connection.call_tool("read_text_file", {"path": str(workspace / "readme.md")}))
            == "shown"
        )
    finally:
        await connection.stop()
