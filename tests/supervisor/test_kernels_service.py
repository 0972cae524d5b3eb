"""`KernelsService` alone, with a real kernel gateway (unsandboxed kernels) and a real in-process tool server
(`ToolsService`), but no supervisor, reconciler or endpoints: leases, tokens, a recycle and closing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.config import CONFIG_FILE, WorkspaceConfig, load_config
from ipybox.kernels.kernel_connection import GatewayError
from ipybox.lifecycle import ServiceState
from ipybox.mcp_client.params import ServerParams
from ipybox.rules import AuditLog
from ipybox.running.status import CallerId, LeaseId
from ipybox.supervisor.kernels import KernelsService
from ipybox.supervisor.leases import LeaseTable, UnknownLeaseError
from ipybox.supervisor.tools import ToolsService
from ipybox.tool_server.tool_server import ToolServer
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration


class Parts:
    """The service under test and what it was wired to."""

    def __init__(self, config: WorkspaceConfig, run_dir: Path) -> None:
        self.leases = LeaseTable()
        self.forgotten: list[LeaseId] = []
        self.state_writes = 0

        async def prepare(name: str, params: ServerParams, secrets: bool) -> ServerParams:
            return params

        async def on_restart(server: ToolServer) -> None:
            pass

        approver = WorkspaceApprover(config.approval, AuditLog(run_dir / "audit.jsonl"), lambda caller: None)
        self.tools = ToolsService(
            config.root,
            run_dir / "tools.sock",
            config=lambda: config,
            approver=approver,
            prepare=prepare,
            on_restart=on_restart,
        )
        self.kernels = KernelsService(
            config.root,
            run_dir / "state",
            run_dir,
            gateway_token="test-token",
            leases=self.leases,
            tools=self.tools,
            config=lambda: config,
            settings=lambda: config.kernel,
            forget_session=self.forgotten.append,
            on_new_gateway=self._wrote_state,
        )

    def _wrote_state(self) -> None:
        self.state_writes += 1


@pytest.fixture(scope="module")
async def parts(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Parts]:
    workspace = make_workspace(tmp_path_factory.mktemp("kernels-service"), "kernels-service")
    config = load_config(workspace / CONFIG_FILE)
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "state").mkdir()
    parts = Parts(config, run_dir)
    async with parts.tools, parts.kernels:
        yield parts


async def test_a_leased_kernel_calls_with_a_token_of_its_own_which_release_revokes(parts: Parts) -> None:
    kernels, tools = parts.kernels, parts.tools
    lease = kernels.leases.new_lease()
    leased = await kernels.lease_kernel(lease)
    assert parts.leases.kernels(lease) == (leased.kernel_id,) and leased.lost is None
    server = tools.running_server()
    assert kernels.pool is not None
    caller = kernels.pool.callers[leased.kernel_id]
    [token] = [token for token, of in server._callers.items() if of == caller]  # its own, and only its
    assert parts.leases.lease_of(CallerId(caller)) == lease  # its asks go to this lease's application
    await kernels.release_lease(lease)
    assert lease in parts.forgotten  # its answers "for this session" end with it
    assert token not in server._callers  # the released kernel's token no longer works
    with pytest.raises(UnknownLeaseError):
        await kernels.release_lease(lease)


async def test_a_recycle_replaces_the_gateway_and_tells_the_lease_why_its_kernel_went(parts: Parts) -> None:
    kernels = parts.kernels
    lease = kernels.leases.new_lease()
    await kernels.lease_kernel(lease)
    gateway, generation, writes = kernels.gateway, kernels.generation, parts.state_writes
    await kernels.recycle("kernel.warm_pool: 1 -> 1")
    assert kernels.gateway is not gateway and kernels.generation == generation + 1
    assert parts.state_writes == writes + 1 and kernels.restarts == 0  # on purpose: not a restart
    again = await kernels.lease_kernel(lease)
    assert again.lost is not None and "kernel.warm_pool: 1 -> 1" in again.lost
    await kernels.release_lease(lease)


async def test_code_checked_in_a_fresh_kernel_runs_there_and_leaves_no_lease(parts: Parts) -> None:
    leases = len(parts.leases)
    assert (await parts.kernels.run_in_fresh_kernel("print(6 * 7)")).strip() == "42"
    assert len(parts.leases) == leases


async def test_closing_releases_every_lease_and_stops_the_gateway(tmp_path: Path) -> None:
    config = load_config(make_workspace(tmp_path, "kernels-service-close") / CONFIG_FILE)
    (tmp_path / "state").mkdir()
    parts = Parts(config, tmp_path)
    async with parts.tools:
        await parts.kernels.start()
        lease = parts.kernels.leases.new_lease()
        await parts.kernels.lease_kernel(lease)
        gateway = parts.kernels.gateway
        assert gateway is not None and gateway.running
        await parts.kernels.aclose()
        assert parts.kernels.state is ServiceState.CLOSED and not gateway.running
        assert len(parts.leases) == 0 and parts.forgotten == [lease]
        with pytest.raises(GatewayError, match="the kernel gateway is not running"):
            await parts.kernels.lease_kernel(parts.kernels.leases.new_lease())
