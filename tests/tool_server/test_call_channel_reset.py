"""A kernel's `{"op": "reset"}` resets its own session only (issue 14, item 4).

Before, any kernel's reset stopped every MCP server of the workspace, and another session's in-flight
call failed. Kernels are played by `ToolRunner`s with tokens of their own (`add_caller`), as a workspace
gives them; the servers are our edge server over stdio, tagged to find their processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from ipybox import process
from ipybox.in_kernel.tool_runner import ToolRunner
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params
from tests.servers.processes import pids, tagged

pytestmark = pytest.mark.integration

NAMES = ("shared", "mine", "theirs")
GUARD = 30  # seconds: only against a hang


def servers(prefix: str) -> dict[str, dict[str, Any]]:
    return {name: tagged(params.edge(), f"{prefix}-{name}") for name in NAMES}


@dataclass
class Workspace:
    server: ToolServer
    tokens: dict[str, str]  # of kernels "a" and "b"

    @property
    def servers(self) -> Any:
        return self.server.servers


@pytest.fixture(scope="module")
async def workspace() -> AsyncIterator[Workspace]:
    """A tool server shared by kernels "a" and "b", each with a token of its own."""
    async with ToolServer(servers=servers("reset-ws")) as server:
        yield Workspace(server, {caller: server.add_caller(caller) for caller in ("a", "b")})


def kernel(ws: Workspace, caller: str, name: str = "") -> ToolRunner:
    return ToolRunner(name, address=ws.server.calls_address, token=ws.tokens[caller])


async def call(ws: Workspace, caller: str, name: str, tool: str = "echo", **args: Any) -> Any:
    run = asyncio.to_thread(kernel(ws, caller, name).run_sync, tool, args or {"text": caller})
    return await asyncio.wait_for(run, GUARD)


async def reset(ws: Workspace, caller: str) -> None:
    await asyncio.wait_for(asyncio.to_thread(kernel(ws, caller).reset_sync), GUARD)


def pid_of(prefix: str, name: str) -> int | None:
    found = pids(f"{prefix}-{name}")
    return found[0] if found else None


async def test_a_kernels_reset_leaves_another_kernels_in_flight_call_and_the_shared_server_running(
    workspace: Workspace,
) -> None:
    await call(workspace, "a", "shared")
    pid = pid_of("reset-ws", "shared")
    in_flight = asyncio.ensure_future(call(workspace, "b", "shared", "slow", seconds=2))
    for _ in range(GUARD * 100):
        if workspace.servers.calls_in_flight("shared").get("b"):
            break
        await asyncio.sleep(0.01)
    await reset(workspace, "a")
    assert await in_flight == "slept 2.0"
    assert pid is not None and process.is_alive(pid)
    assert pid_of("reset-ws", "shared") == pid


async def test_a_kernels_reset_stops_the_servers_only_it_used_and_not_the_others(
    workspace: Workspace,
) -> None:
    await asyncio.gather(call(workspace, "a", "mine"), call(workspace, "b", "theirs"))  # both start at once
    mine, theirs = pid_of("reset-ws", "mine"), pid_of("reset-ws", "theirs")
    assert mine is not None and theirs is not None
    await reset(workspace, "a")
    assert not process.is_alive(mine) and workspace.servers.started("mine") is None
    assert process.is_alive(theirs) and workspace.servers.started("theirs") is not None
    assert await call(workspace, "a", "mine") == "a"  # it starts again on the kernel's next call


async def test_a_shared_server_stops_once_every_kernel_that_used_it_has_reset(workspace: Workspace) -> None:
    await call(workspace, "a", "shared")
    await call(workspace, "b", "shared")
    pid = pid_of("reset-ws", "shared")
    assert pid is not None
    await reset(workspace, "a")
    assert process.is_alive(pid)  # b still uses it
    await reset(workspace, "b")
    assert not process.is_alive(pid)


async def test_a_kernel_that_never_used_a_server_does_not_stop_it(workspace: Workspace) -> None:
    await call(workspace, "b", "theirs")
    pid = pid_of("reset-ws", "theirs")
    await reset(workspace, "a")
    assert pid is not None and process.is_alive(pid)


async def test_the_applications_reset_over_http_stops_every_server(workspace: Workspace) -> None:
    await asyncio.gather(call(workspace, "a", "mine"), call(workspace, "b", "theirs"))  # both start at once
    started = [pid_of("reset-ws", name) for name in ("mine", "theirs")]
    connector = aiohttp.UnixConnector(path=str(workspace.server.unix_socket))
    async with aiohttp.ClientSession(connector=connector) as http:
        headers = {"Authorization": f"Bearer {workspace.server.token}"}
        async with http.put("http://localhost/reset", headers=headers) as response:
            assert response.status == 200
    assert all(pid is not None and not process.is_alive(pid) for pid in started)


async def test_an_embedded_tool_servers_only_kernel_resets_every_started_server() -> None:
    async with ToolServer(servers=servers("reset-embedded")) as server:
        runners = [
            ToolRunner(name, address=server.calls_address, token=server.call_token) for name in NAMES[1:]
        ]
        server.servers.register("unused", params.edge())  # started by the host, not by the kernel
        await asyncio.gather(
            *(asyncio.to_thread(runner.run_sync, "echo", {"text": "x"}) for runner in runners),
            server.servers.connection("unused"),
        )
        runner = runners[0]
        started = [pid_of("reset-embedded", name) for name in ("mine", "theirs")]
        await asyncio.wait_for(asyncio.to_thread(runner.reset_sync), GUARD)
        assert all(pid is not None and not process.is_alive(pid) for pid in started)
        assert server.servers.started("unused") is None  # it is the only user: everything stops, as before
