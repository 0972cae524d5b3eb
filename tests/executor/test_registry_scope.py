"""The host's server registry from an attacker's side (issue 30, finding 5): code in an embedded executor's
kernel names another project's package root, hoping to get that project's server (and its secrets)
started; and what the registry file gives away once a secret was passed to `generate_mcp_sources`.

With the real `mcp-server-time` (PyPI) as the other project's server (registered, never started when all
goes well), and our edge server, whose `getenv` shows what reached the server's environment.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, generate_mcp_sources
from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
from ipybox.mcp_apigen.sources import wait_for_stopped_servers
from ipybox.mcp_client import registry as registry_module
from ipybox.mcp_client.registry import ServerRegistry, default_registry_path
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params
from tests.servers.processes import pids, tagged

pytestmark = pytest.mark.integration

GUARD = 60  # seconds: only against a hang
SECRET = "sk-literal-secret-i30"


async def test_a_kernel_naming_another_projects_package_root_gets_nothing_started(tmp_path: Path) -> None:
    project = tmp_path / "project" / "mcptools"  # another project of the same user, with a secret
    foreign = tagged({**params.time_server(), "env": {"TIME_API_TOKEN": SECRET}}, "i30-foreign-time")
    ServerRegistry().register(project, "time", foreign)  # as generate_mcp_sources records it
    own = tmp_path / "own"
    own.mkdir()
    code = f"""
    from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
    for root in ({str(project)!r}, {str(project.parent)!r} + "/./mcptools"):
        try:
            print(ToolRunner("time", package=root).run_sync("get_current_time", {{"timezone": "UTC"}}))
        except ToolRunnerError as e:
            print(e)
    """
    asked: list[ApprovalRequest] = []
    result: CodeExecutionResult | None = None
    async with CodeExecutor(working_dir=own, approval_timeout=GUARD, spare_kernel=False) as executor:
        async for item in executor.stream(textwrap.dedent(code), timeout=GUARD):
            if isinstance(item, ApprovalRequest):
                asked.append(item)
                await item.accept()
            elif isinstance(item, CodeExecutionResult):
                result = item
        started = executor.tool_server.servers.names
        running = pids("i30-foreign-time")
    assert result is not None
    lines = (result.text or "").strip().splitlines()
    assert len(lines) == 2
    assert all("which is not one of this executor's package roots" in line for line in lines), lines
    assert asked == []  # refused before the application is asked
    assert running == [] and started == []


async def test_generating_with_a_literal_secret_records_only_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "mcptools"
    await generate_mcp_sources("edge", {**params.edge(), "env": {"API_KEY": SECRET}}, root)
    await wait_for_stopped_servers()
    recorded = default_registry_path().read_text()
    assert SECRET not in recorded
    assert ServerRegistry().servers(root)["edge"]["env"] == {"API_KEY": SECRET}  # this process: as given

    async def getenv(environ: dict[str, str]) -> str:
        registry = ServerRegistry()
        async with ToolServer(
            environ=environ, lookup=lambda name: registry.servers(root).get(name)
        ) as server:
            runner = ToolRunner("edge", address=server.calls_address, token=server.call_token)
            return str(
                await asyncio.wait_for(
                    asyncio.to_thread(runner.run_sync, "getenv", {"name": "API_KEY"}), GUARD
                )
            )

    # Another process knows only the name: the value comes from its environment, else the call says which.
    monkeypatch.setattr(registry_module, "_given_here", {})
    assert await getenv({"API_KEY": "from-the-environment"}) == "from-the-environment"
    with pytest.raises(ToolRunnerError, match=r"environment variable API_KEY is not set"):
        await getenv({})
