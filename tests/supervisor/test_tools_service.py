"""`ToolsService` alone, in process: a real `ToolServer` on a Unix socket (no MCP server is started: none is
called), restarted when it stops, and stopped for good by `aclose()`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.config import CONFIG_FILE, WorkspaceConfig, load_config
from ipybox.lifecycle import ServiceState
from ipybox.mcp_client.params import ServerParams
from ipybox.rules import AuditLog
from ipybox.supervisor.tools import ToolsService
from ipybox.tool_server.tool_server import ToolServer
from tests.supervisor.workspaces import make_workspace


@pytest.fixture
def config(tmp_path: Path) -> WorkspaceConfig:
    return load_config(make_workspace(tmp_path, "tools-service") / CONFIG_FILE)


def tools_service(config: WorkspaceConfig, restarted: list[ToolServer]) -> ToolsService:
    async def prepare(name: str, params: ServerParams, secrets: bool) -> ServerParams:
        return params

    async def on_restart(server: ToolServer) -> None:
        restarted.append(server)

    approver = WorkspaceApprover(config.approval, AuditLog(config.root / "audit.jsonl"), lambda caller: None)
    return ToolsService(
        config.root,
        config.root / "tools.sock",
        config=lambda: config,
        approver=approver,
        prepare=prepare,
        on_restart=on_restart,
    )


async def until(condition: object, guard: float = 10) -> None:
    async with asyncio.timeout(guard):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def test_a_started_tool_server_decides_by_the_workspace_approver_and_issues_tokens(
    config: WorkspaceConfig,
) -> None:
    restarted: list[ToolServer] = []
    async with tools_service(config, restarted) as tools:
        server = tools.running_server()
        assert server.approver is tools.approver and server.unix_socket == config.root / "tools.sock"
        # Constructed complete: the servers' `prepare` hook and environment are the workspace's from the start.
        assert server.servers.prepare is tools.prepare and server.servers.dotenv_path == config.root / ".env"
        assert server.servers.environ is not None and server.servers.environ["IPYBOX_WORKSPACE"] == str(
            config.root
        )
        token = tools.add_caller("kernel-1")
        assert server._caller_of(token) == "kernel-1"
        tools.remove_caller(token)
        assert server._caller_of(token) is None
    assert tools.server is None and tools.state is ServiceState.CLOSED and restarted == []


async def test_a_tool_server_that_stops_is_replaced_with_the_enabled_servers_and_counted(
    config: WorkspaceConfig,
) -> None:
    restarted: list[ToolServer] = []
    async with tools_service(config, restarted) as tools:
        first = tools.running_server()
        await first._http.stop()  # as if it crashed
        await until(lambda: tools.restarts == 1)
        assert restarted == [tools.server] and tools.server is not first
        second = tools.running_server()
        assert second.approver is tools.approver and second.servers.prepare is tools.prepare
        assert sorted(tools.running_server().servers.names) == sorted(config.enabled_servers())
        assert tools.failure is None


async def test_closing_stops_the_tool_server_without_taking_it_for_a_crash(config: WorkspaceConfig) -> None:
    restarted: list[ToolServer] = []
    tools = tools_service(config, restarted)
    await tools.start()
    server = tools.running_server()
    await tools.aclose()
    await asyncio.sleep(0.1)
    assert restarted == [] and tools.restarts == 0 and tools.server is None
    with pytest.raises(RuntimeError, match="the tool server is closed"):
        tools.running_server()
    assert not server._http.running
