"""A `run` request's `package` (issue 15, item 6): the tool server looks the server up in the root the
calling module names, runs that root's server under the name the approver sees, refuses a malformed root,
and ignores the field when it has no `package_lookup` (a workspace's tool server). With our edge server."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from ipybox import process
from ipybox.approval.approver import Approval, Approved, FunctionApprover
from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
from ipybox.mcp_client.pool import MCPServers
from ipybox.mcp_client.registry import ServerRegistry
from ipybox.rules.calls import ToolCall
from ipybox.tool_server.call_channel import run_package
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params

GUARD = 30  # seconds: only against a hang


def _edge(which: str) -> dict[str, Any]:
    return {**params.edge(), "env": {"WHICH": which}}


async def _call(server: ToolServer, name: str, package: str | None, tool: str = "getenv") -> Any:
    runner = ToolRunner(name, address=server.calls_address, token=server.call_token, package=package)
    return await asyncio.wait_for(asyncio.to_thread(runner.run_sync, tool, {"name": "WHICH"}), GUARD)


@pytest.mark.parametrize("package", [None, "/abs/root"])
def test_run_package_reads_an_absent_or_absolute_root(package: str | None) -> None:
    request: dict[str, Any] = {"op": "run"} if package is None else {"op": "run", "package": package}
    assert run_package(request) == package


@pytest.mark.parametrize("package", ["relative/root", "", 7, ["/a"], "/a\0b", "/" + "a" * 5000])
def test_run_package_refuses_anything_but_an_absolute_path(package: object) -> None:
    with pytest.raises(ValueError, match="'package' must be the absolute path"):
        run_package({"op": "run", "package": package})


async def test_a_malformed_root_is_a_bad_request_and_reaches_no_approver() -> None:
    asked: list[ToolCall] = []

    async def approve(call: ToolCall) -> Approval:
        asked.append(call)
        return Approved()

    async with ToolServer(servers={"edge": _edge("given")}, approver=FunctionApprover(approve)) as server:
        with pytest.raises(ToolRunnerError, match="'package' must be the absolute path"):
            await _call(server, "edge", "mcptools")
    assert asked == []


@pytest.mark.integration
async def test_a_call_naming_its_root_runs_that_roots_server_under_its_plain_name(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "mcp_servers.json")
    mcptools, other = tmp_path / "work" / "mcptools", tmp_path / "other" / "tools"
    registry.register(mcptools, "edge", _edge("default"))
    registry.register(other, "edge", _edge("other"), {"getenv": {"readOnlyHint": True}})
    asked: list[ToolCall] = []

    async def approve(call: ToolCall) -> Approval:
        asked.append(call)
        return Approved()

    servers = MCPServers(
        lookup=lambda name: registry.servers(mcptools).get(name),
        package_lookup=registry.package_server,
        package_roots=[mcptools, other],
    )
    async with ToolServer(servers=servers, approver=FunctionApprover(approve)) as server:
        assert await _call(server, "edge", str(other)) == "other"
        assert await _call(server, "edge", None) == "default"  # a module of an earlier version
        assert await _call(server, "edge", str(mcptools)) == "default"
        # The approver sees the name the code uses; the root's recorded annotations decide its first call.
        assert [(c.server, c.tool) for c in asked] == [("edge", "getenv")] * 3
        assert asked[0].annotations == {"readOnlyHint": True}
        assert len(server.servers.names) == 2  # the root's server and the name's own


@pytest.mark.integration
async def test_a_forged_root_is_an_unknown_server_and_starts_nothing(tmp_path: Path) -> None:
    registry = ServerRegistry(tmp_path / "state" / "mcp_servers.json")
    hidden = tmp_path / "hidden"
    registry.register(hidden, "secret", _edge("secret"))
    servers = MCPServers(
        lookup=lambda name: None,
        package_lookup=registry.package_server,
        package_roots=[tmp_path / "mcptools"],
    )
    async with ToolServer(servers=servers) as server:
        before = set(process.descendants(os.getpid()))
        for root in (str(tmp_path / "forged"), str(hidden)):
            with pytest.raises(ToolRunnerError, match=f"tool package in {root}, which is not one of"):
                await _call(server, "secret", root)
        assert set(process.descendants(os.getpid())) - before == set()
        assert server.servers.names == []


@pytest.mark.integration
async def test_a_tool_server_without_package_lookup_ignores_the_root(tmp_path: Path) -> None:
    # A workspace's: its servers come from ipybox.toml, whichever root a generated module names.
    registry = ServerRegistry(tmp_path / "state" / "mcp_servers.json")
    other = tmp_path / "other"
    registry.register(other, "edge", _edge("other"))
    async with ToolServer(servers={"edge": _edge("workspace")}) as server:
        assert await _call(server, "edge", str(other)) == "workspace"
