"""A gateway with limits: each kernel starts in a control group of its own made before it runs, the
gateway's kernel models tell what each kernel may use and uses, and a kernel's group (with whatever the
kernel left running, detached or not) goes when the kernel does; the gateway itself stays outside.

Root only for the groups (cgroup v1 here); the models' usage without limits holds for every user."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.kernel_client import KernelClient
from ipybox.kernels.kernelspec import KernelSpec
from ipybox.limits import LimitUnavailableError, ResourceLimits, detect_enforcement

pytestmark = pytest.mark.integration

CGROUPS = detect_enforcement().mechanism != "rlimit"


async def _models(gateway: KernelGateway) -> list[dict[str, Any]]:
    headers = {"Authorization": f"token {gateway.token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        # jupyter_server's listing can answer an error while a kernel's model is being made (seen once in
        # a loaded parallel run): asked again, briefly.
        for _ in range(20):
            async with http.get(f"{gateway.endpoint.url}/api/kernels") as r:
                models = await r.json()
            if r.status == 200 and isinstance(models, list):
                return models
            await asyncio.sleep(0.1)
        raise AssertionError(f"GET /api/kernels kept failing: {r.status} {models}")


async def _until(condition: Callable[[], bool], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)


def _cgroups_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return {controllers: path for _, controllers, path in (line.split(":", 2) for line in lines)}


def _alive(marker: str) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


async def test_a_kernel_without_limits_is_reported_with_its_usage_and_no_mechanism() -> None:
    async with KernelGateway() as gateway, KernelClient(gateway.endpoint) as client:
        await client.execute("x = b'1' * (50 * 2**20)")
        # Read from /proc, which the gateway reads at most every 2 s.
        async with asyncio.timeout(10):
            while True:
                model = next(m for m in await _models(gateway) if m["id"] == client.kernel_id)
                report = model["ipybox"]
                if report["usage"]["memory"] > 50 * 2**20:
                    break
                await asyncio.sleep(0.2)
        assert report["mechanism"] is None and report["limits"] == {}
        assert report["usage"]["processes"] >= 1 and report["usage"]["cpu_seconds"] > 0


@pytest.mark.skipif(not CGROUPS, reason="needs a control group (root here); setrlimit is tested as a user")
async def test_each_kernel_runs_in_a_group_of_its_own_under_the_gateways_and_the_gateway_outside() -> None:
    limits = ResourceLimits(memory="768MiB", processes=100, open_files=512)
    async with KernelGateway(limits=limits) as gateway, KernelClient(gateway.endpoint) as client:
        pid = int((await client.execute("import os; print(os.getpid())")).text)
        kernel_group = _cgroups_of(pid)["memory"]
        assert gateway.pid is not None
        gateway_group = _cgroups_of(gateway.pid)["memory"]
        assert kernel_group.startswith(
            gateway_group + "/ipybox-"
        )  # under the host's group, the gateway not in it
        model = next(m for m in await _models(gateway) if m["id"] == client.kernel_id)
        report = model["ipybox"]
        assert report["mechanism"] == "cgroup1"
        assert report["limits"] == {"memory": 768 * 2**20, "processes": 100, "open_files": 512}
        assert 0 < report["usage"]["memory"] <= report["usage"]["memory_peak"] <= 768 * 2**20
        assert report["usage"]["oom_kills"] == 0


@pytest.mark.skipif(not CGROUPS, reason="needs a control group (root here); setrlimit is tested as a user")
async def test_what_a_kernel_detached_from_itself_ends_when_the_kernel_is_shut_down() -> None:
    marker = f"ipybox-detached-{uuid.uuid4().hex}"
    async with KernelGateway(limits=ResourceLimits(processes=50)) as gateway:
        client = KernelClient(gateway.endpoint, spare_kernel=False)
        await client.connect()
        # setsid + a double fork: out of the kernel's process tree and session, still in its group.
        await client.execute(
            "import subprocess\n"
            f"subprocess.Popen(['setsid', 'sh', '-c', 'sleep 3600 # {marker} &'], start_new_session=True)"
        )
        await _until(lambda: _alive(marker))
        await client.disconnect()
        await _until(lambda: not _alive(marker))


@pytest.mark.skipif(not CGROUPS, reason="needs a control group (root here); setrlimit is tested as a user")
async def test_stopping_the_gateway_removes_every_group_it_made() -> None:
    base = detect_enforcement().cgroup
    assert base is not None

    def ours() -> set[Path]:
        return {p for d in base.directories() for p in Path(d).glob(f"ipybox-{os.getpid()}-*")}

    before = ours()
    gateway = KernelGateway(limits=ResourceLimits(memory="512MiB", processes=50))
    await gateway.start()
    async with KernelClient(gateway.endpoint) as client:
        await client.execute("pass")
        made = ours() - before
        assert made and all(any(p.iterdir()) for p in made)  # the gateway's groups, kernels' groups in them
        await gateway.stop()
    assert not (ours() - before)


async def test_a_limit_the_machine_cannot_enforce_fails_the_start_before_any_process() -> None:
    # An unsandboxed kernel has no private /tmp to size, whatever the machine.
    gateway = KernelGateway(
        kernel_spec=KernelSpec(), limits=ResourceLimits(tmp="1GiB"), limits_source="[kernel.limits]"
    )
    with pytest.raises(
        LimitUnavailableError,
        match=r'\[kernel\.limits\].*/tmp 1 GiB: an unsandboxed kernel has no private /tmp.*tmp = "unlimited"',
    ):
        await gateway.start()
    assert gateway.pid is None and gateway.runtime_dir is None
