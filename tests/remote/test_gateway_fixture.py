"""The test Enterprise Gateway itself (`tests.remote.eg`): restarts where clients find it, leaves no process
behind. A gateway of the test's own, so the session's is not disturbed."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipybox import process
from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.kernels.kernel_client import KernelClient
from tests.remote.eg import EnterpriseGateway

pytestmark = pytest.mark.integration


@pytest.fixture
def own_gateway(tmp_path: Path) -> Iterator[EnterpriseGateway]:
    gateway = EnterpriseGateway(tmp_path / "eg")
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


async def answers(gateway: EnterpriseGateway, tmp_path: Path) -> str:
    endpoint = GatewayEndpoint(gateway.url, gateway.token)
    async with KernelClient(endpoint, spare_kernel=False, images_dir=tmp_path) as client:
        return (await client.execute("print(6 * 7)")).text or ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["shut down", "crashed"])
async def test_a_restarted_gateway_answers_on_the_same_port_and_token_without_its_old_kernels(
    own_gateway: EnterpriseGateway, tmp_path: Path, sig: signal.Signals
) -> None:
    url, token = own_gateway.url, own_gateway.token
    status, kernel = own_gateway.request("POST", "/api/kernels", body={"name": own_gateway.kernel_name})
    assert status == 201 and isinstance(kernel, dict)
    old_processes = own_gateway.kernel_pids()
    assert old_processes

    own_gateway.restart(sig)

    assert (own_gateway.url, own_gateway.token) == (url, token)
    assert not [pid for pid in old_processes if process.is_alive(pid)]
    assert own_gateway.request("GET", f"/api/kernels/{kernel['id']}")[0] == 404
    assert await answers(own_gateway, tmp_path) == "42"


async def test_a_stopped_gateway_leaves_no_process_behind(
    own_gateway: EnterpriseGateway, tmp_path: Path
) -> None:
    endpoint = GatewayEndpoint(own_gateway.url, own_gateway.token)
    async with KernelClient(endpoint, spare_kernel=False, images_dir=tmp_path) as client:
        await client.execute("import subprocess; subprocess.Popen(['sleep', '600'])")
        gateway_pid = own_gateway.pid
        assert gateway_pid is not None
        started = [gateway_pid, *own_gateway.kernel_pids()]
        assert len(started) >= 3  # the gateway, bubblewrap, the kernel (and the sleep, in the sandbox)
        own_gateway.stop()
        own_gateway.stop()  # idempotent
    assert not [pid for pid in started if process.is_alive(pid)]
