"""Kernel start through Jupyter Enterprise Gateway against ipybox's own (local) kernel gateway, in one run.

Ours only. A sample is `POST /api/kernels` until the new kernel answers `kernel_info` over the gateway's
websocket (ipybox's `KernelConnection.open`, the same client code for both), then `DELETE` (timed as the
stop). The Enterprise Gateway is the one tests/remote starts (`.cache/eg-venv`, LocalProcessProxy) with its
kernelspec whose kernels run in bubblewrap and see no host files; the local gateway is `KernelGateway()`
with ipybox's kernelspec. Samples alternate local / remote, so both see the same minute of the machine.
The Enterprise Gateway's own start (to its first answer) is reported in `info`.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from _protocol import Stopwatch, emit, log, parse_args

from ipybox.kernels.gateway import GatewayEndpoint, KernelGateway
from ipybox.kernels.kernel_connection import KernelConnection

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for tests.remote.eg
from tests.remote.eg import EnterpriseGateway


async def start_and_stop(
    endpoint: GatewayEndpoint, kernel_name: str | None, start: Stopwatch, stop: Stopwatch, keep: bool
) -> None:
    headers = {"Authorization": f"token {endpoint.token}"} if endpoint.token else {}
    async with aiohttp.ClientSession(headers=headers) as http:
        with start.measure(keep):
            kernel = await KernelConnection.open(http, endpoint, kernel_name=kernel_name, ready_timeout=120)
        with stop.measure(keep):
            await kernel.shutdown()


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1)
    root = Path(tempfile.mkdtemp(prefix="ipybox-bench-eg-"))
    eg = EnterpriseGateway(root)
    began = time.perf_counter()
    await asyncio.to_thread(eg.start)
    eg_start_ms = (time.perf_counter() - began) * 1000.0
    log(f"Enterprise Gateway answered after {eg_start_ms:.0f} ms")
    local_start, local_stop, remote_start, remote_stop = Stopwatch(), Stopwatch(), Stopwatch(), Stopwatch()
    remote_endpoint = GatewayEndpoint(eg.url, eg.token)
    try:
        async with KernelGateway() as local:
            for i in range(args.warmup + args.runs):
                keep = i >= args.warmup
                await start_and_stop(local.endpoint, None, local_start, local_stop, keep)
                await start_and_stop(remote_endpoint, eg.kernel_name, remote_start, remote_stop, keep)
    finally:
        await asyncio.to_thread(eg.stop)
        shutil.rmtree(root, ignore_errors=True)
    emit("remote.local_kernel_start", local_start.samples_ms)
    emit("remote.kernel_start", remote_start.samples_ms, info={"eg_start_ms": round(eg_start_ms, 1)})
    emit("remote.local_kernel_stop", local_stop.samples_ms)
    emit("remote.kernel_stop", remote_stop.samples_ms)


if __name__ == "__main__":
    asyncio.run(main())
