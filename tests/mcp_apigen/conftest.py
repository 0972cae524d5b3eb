"""Generated packages for the real servers and our edge server, generated once per session, served by a
real `ToolServer` so that generated `run()` functions reach the real servers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from ipybox.mcp_apigen import write_mcp_sources
from ipybox.mcp_client import MCPConnection
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params


@dataclass
class Generated:
    """Generated packages under `root` (an importable `mcptools` directory), their module names, the
    tools they were generated from and the server parameters behind them."""

    root: Path
    modules: dict[str, list[str]]
    tools: dict[str, list[types.Tool]]
    servers: dict[str, dict[str, Any]]
    workdir: Path

    def output_schema(self, server: str, tool_name: str) -> dict[str, Any] | None:
        tool = next(t for t in self.tools[server] if t.name == tool_name)
        return tool.output_schema


@pytest.fixture(scope="session")
def edge_urls() -> Iterator[dict[str, str]]:
    with params.edge_http_server("streamable-http") as http_url, params.edge_http_server("sse") as sse_url:
        yield {"edge_http": http_url, "edge_sse": sse_url}


@pytest.fixture(scope="session")
async def generated(
    tmp_path_factory: pytest.TempPathFactory, edge_urls: dict[str, str]
) -> AsyncIterator[Generated]:
    base = tmp_path_factory.mktemp("apigen")
    workdir = base / "work"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("hello from the filesystem server\n")
    repository = base / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repository)], check=True)
    servers = {
        "everything": params.everything(),
        "filesystem": params.filesystem(workdir),
        "memory": params.memory(base / "memory.jsonl"),
        "time": params.time_server(),
        "git": params.git(repository),
        "edge": params.edge(),
        "edge_http": {"url": edge_urls["edge_http"]},
        "edge_sse": {"url": edge_urls["edge_sse"]},
    }
    connections = {name: MCPConnection(name, server, connect_timeout=30) for name, server in servers.items()}
    root = base / "mcptools"
    await asyncio.gather(*(connection.start() for connection in connections.values()))
    try:
        tools = await asyncio.gather(*(connection.list_tools() for connection in connections.values()))
    finally:
        await asyncio.gather(*(connection.stop() for connection in connections.values()))
    modules = {name: write_mcp_sources(name, t, root) for name, t in zip(connections, tools, strict=True)}
    async with ToolServer(servers=servers, media_dir=base / "media") as tool_server:
        old_env = {key: os.environ.get(key) for key in tool_server.kernel_env}
        os.environ.update(tool_server.kernel_env)
        sys.path.insert(0, str(base))
        try:
            yield Generated(root, modules, dict(zip(connections, tools, strict=True)), servers, workdir)
        finally:
            sys.path.remove(str(base))
            for key, value in old_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
