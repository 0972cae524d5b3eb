"""KernelClient and CodeExecutor against a kernel gateway started separately, as users run one to scale out."""

from __future__ import annotations

import asyncio
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from ipybox import CodeExecutor
from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.kernels.kernel_client import KernelClient
from ipybox.kernels.kernel_connection import GatewayError, KernelConnection, KernelStartError

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def external_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayEndpoint]:
    """The stock `jupyter kernelgateway` command, configured the way its own docs say."""
    token = secrets.token_hex(16)
    port = _free_port()
    runtime = tmp_path_factory.mktemp("gw-runtime")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "jupyter-kernelgateway"),
            "--KernelGatewayApp.ip=127.0.0.1",
            f"--KernelGatewayApp.port={port}",
            "--JupyterWebsocketPersonality.list_kernels=True",
        ],
        env={
            "PATH": str(Path(sys.executable).parent),
            "KG_AUTH_TOKEN": token,
            "JUPYTER_RUNTIME_DIR": str(runtime),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = GatewayEndpoint(f"http://127.0.0.1:{port}", token)

    async def wait_ready() -> None:
        async with aiohttp.ClientSession(headers={"Authorization": f"token {token}"}) as http:
            for _ in range(600):
                try:
                    async with http.get(f"{endpoint.url}/api") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError("the external gateway did not start")

    try:
        asyncio.run(wait_ready())
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


async def test_client_against_external_gateway(external_gateway: GatewayEndpoint) -> None:
    async with KernelClient(
        external_gateway, kernel_env={"KERNEL_GREETING": "hi"}, spare_kernel=False
    ) as client:
        await client.execute("x = 5")
        result = await client.execute("import os; print(x, os.environ['KERNEL_GREETING'])")
        assert result.text == "5 hi"


async def test_interrupt_until_idle_repeats_until_the_kernel_is_free(
    external_gateway: GatewayEndpoint,
) -> None:
    # The code swallows interrupts, as code catching KeyboardInterrupt does (and as a cell that had not
    # started yet when an interrupt came would): a single interrupt leaves the kernel busy.
    code = "import time\nn = 0\nwhile n < 3:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        n += 1"
    async with KernelClient(external_gateway, spare_kernel=False) as client:
        running = asyncio.create_task(client.execute(code, timeout=300))
        await asyncio.sleep(1)
        await client.interrupt()
        await asyncio.sleep(1)
        assert not running.done()
        assert await client.interrupt_until_idle(timeout=30)
        await asyncio.wait_for(running, 10)  # it ended on its own terms, not by a timeout
        assert (await client.execute("print(n)")).text == "3"


async def test_executor_against_external_gateway(external_gateway: GatewayEndpoint) -> None:
    async with CodeExecutor(
        kernel_gateway_url=external_gateway.url, kernel_gateway_token=external_gateway.token
    ) as executor:
        assert executor.kernel_gateway is None
        await executor.execute("y = 'kept'")
        assert (await executor.execute("print(y)")).text == "kept"
        await executor.reset()
        with pytest.raises(Exception, match="NameError"):
            await executor.execute("print(y)")


async def test_a_kernel_whose_set_up_fails_is_deleted_and_the_error_raised(
    external_gateway: GatewayEndpoint,
) -> None:
    set_up: list[str] = []

    async def fail(kernel: KernelConnection) -> None:
        set_up.append(kernel.kernel_id)
        raise KernelStartError("set-up refused")

    with pytest.raises(KernelStartError, match="set-up refused"):
        async with KernelClient(external_gateway, spare_kernel=False, set_up=fail):
            pass
    assert len(set_up) == 1
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"token {external_gateway.token}"}) as http,
        http.get(f"{external_gateway.url}/api/kernels") as response,
    ):
        assert set_up[0] not in {kernel["id"] for kernel in await response.json()}


async def test_every_kernel_of_the_client_is_set_up_before_use(external_gateway: GatewayEndpoint) -> None:
    async def mark(kernel: KernelConnection) -> None:
        reply = await kernel.request("execute_request", {"code": "SET_UP = True", "silent": True}, timeout=30)
        assert reply["status"] == "ok"

    async with KernelClient(external_gateway, spare_kernel=True, set_up=mark) as client:
        assert (await client.execute("print(SET_UP)")).text == "True"
        await client.reset()  # the spare
        assert (await client.execute("print(SET_UP)")).text == "True"


async def test_wrong_token_is_a_clear_error(external_gateway: GatewayEndpoint) -> None:
    bad = GatewayEndpoint(external_gateway.url, "wrong")
    with pytest.raises(GatewayError, match="HTTP 401"):
        async with KernelClient(bad, spare_kernel=False):
            pass


async def test_unreachable_gateway_is_a_clear_error() -> None:
    endpoint = GatewayEndpoint(f"http://127.0.0.1:{_free_port()}", "x")
    with pytest.raises(GatewayError, match="cannot reach the kernel gateway"):
        async with KernelClient(endpoint, spare_kernel=False):
            pass


async def test_client_context_is_required() -> None:
    client = KernelClient(GatewayEndpoint("http://127.0.0.1:1"))
    with pytest.raises(RuntimeError, match="not connected"):
        await client.execute("1")


async def test_a_gateway_kernel_without_ipybox_still_runs_code_and_says_why_tools_fail(
    external_gateway: GatewayEndpoint, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from ipybox.executor.external_kernels import ExternalKernels
    from ipybox.executor.options import ExternalGateway
    from ipybox.kernels.remote_setup import RemoteKernelSetup

    kernels = ExternalKernels(ExternalGateway(external_gateway.url, external_gateway.token), tmp_path)
    kernels._setup = RemoteKernelSetup("tls://127.0.0.1:9", "pem")  # what bind() makes, unused here
    kernels._token = "token"

    async def without_ipybox(kernel: KernelConnection) -> None:
        # The kernel's Python as an image without ipybox has it: the in-kernel part does not import.
        reply = await kernel.request(
            "execute_request",
            {"code": "import sys\nsys.modules['ipybox.in_kernel.remote'] = None", "silent": True},
            timeout=30,
        )
        assert reply["status"] == "ok"
        await kernels.set_up(kernel)

    with caplog.at_level("WARNING", logger="ipybox.executor.external_kernels"):
        async with KernelClient(external_gateway, spare_kernel=False, set_up=without_ipybox) as client:
            assert (await client.execute("print(6 * 7)")).text == "42"
    assert "have no ipybox" in caplog.text
