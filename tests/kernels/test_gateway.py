"""KernelGateway against the real Jupyter Kernel Gateway process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import pytest

from ipybox import process
from ipybox.kernels.gateway import GatewayStartError, KernelGateway
from ipybox.kernels.kernel_client import KernelClient

pytestmark = pytest.mark.integration


async def test_gateway_requires_its_token_and_listens_on_loopback() -> None:
    async with KernelGateway() as gateway:
        url = gateway.endpoint.url
        assert url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/api/kernels") as response:
                assert response.status == 401
            async with http.get(f"{url}/api/kernels", headers={"Authorization": "token wrong"}) as response:
                assert response.status == 401
            headers = {"Authorization": f"token {gateway.token}"}
            async with http.get(f"{url}/api/kernels", headers=headers) as response:
                assert response.status == 200


async def test_gateway_refuses_non_loopback_hosts() -> None:
    with pytest.raises(ValueError, match="loopback"):
        KernelGateway(host="0.0.0.0")


async def test_gateway_on_a_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "gw.sock"
    async with KernelGateway(unix_socket=sock) as gateway:
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        async with KernelClient(gateway.endpoint, spare_kernel=False) as client:
            result = await client.execute("print(6 * 7)")
            assert result.text == "42"
    assert not sock.exists()


async def test_kernel_gets_no_host_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPYBOX_HOST_SECRET", "s3cret")
    async with (
        KernelGateway(env={"WANTED": "yes"}) as gateway,
        KernelClient(gateway.endpoint, spare_kernel=False) as client,
    ):
        result = await client.execute("import os, json; print(json.dumps(dict(os.environ)))")

    assert result.text is not None
    env = json.loads(result.text)
    assert "IPYBOX_HOST_SECRET" not in env
    assert env["WANTED"] == "yes"
    assert env["HOME"] == os.environ.get("HOME", str(Path.home()))
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    # The gateway's own credentials and paths stay with the gateway.
    assert not [key for key in env if key.startswith(("KG_", "JUPYTER_"))]
    assert gateway.token not in result.text


async def test_gateway_start_failure_reports_its_log() -> None:
    gateway = KernelGateway(log_level="NOT-A-LEVEL")
    with pytest.raises(GatewayStartError, match="log_level"):
        await gateway.start()
    assert not gateway.running


async def test_stop_ends_gateway_and_kernels() -> None:
    gateway = KernelGateway()
    await gateway.start()
    client = KernelClient(gateway.endpoint)
    await client.connect()
    kernel_pid = int((await client.execute("import os; print(os.getpid())")).text or 0)
    gateway_pid = gateway.pid
    assert gateway_pid is not None and process.is_alive(kernel_pid)
    await gateway.stop()  # without disconnecting the client first: the gateway must still clean up
    await client.disconnect()
    assert not process.is_alive(gateway_pid)
    assert not process.is_alive(kernel_pid)


HOST_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    from ipybox import CodeExecutor

    async def main():
        async with CodeExecutor(working_dir=sys.argv[1] if len(sys.argv) > 1 else None) as ex:
            result = await ex.execute("import os; print(os.getpid())")
            print(ex.kernel_gateway.pid, result.text, flush=True)
            await asyncio.sleep(60)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
async def test_host_signal_leaves_no_processes(sig: signal.Signals, tmp_path: Path) -> None:
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert host.stdout is not None
        line = await asyncio.to_thread(host.stdout.readline)
        gateway_pid, kernel_pid = map(int, line.split())
        tree = [gateway_pid, *process.descendants(gateway_pid)]
        assert kernel_pid in tree
        host.send_signal(sig)
        await asyncio.to_thread(host.wait, 30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(process.is_alive(pid) for pid in tree):
            await asyncio.sleep(0.1)
        assert [pid for pid in tree if process.is_alive(pid)] == []
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()


async def test_no_file_in_the_working_directory_is_imported_by_the_gateway_instead_of_its_own(
    tmp_path: Path,
) -> None:
    # The gateway runs in the workspace, which kernels write: a module there named like one the gateway
    # imports must stay a file, not become code the host runs. (Kernels do import from their working
    # directory, as Jupyter's do: these two are the gateway's alone.)
    planted = tmp_path / "planted"
    for name in ("kernel_gateway", "jupyter_server"):
        (tmp_path / f"{name}.py").write_text(f"open({str(planted)!r}, 'a').write('{name}')\n")
    async with KernelGateway(working_dir=tmp_path) as gateway, KernelClient(gateway.endpoint) as client:
        assert (await client.execute("print(1)")).text == "1"
    assert not planted.exists()
