"""The floor: a direct jupyter_client round trip, no ipybox, no gateway.

AsyncKernelManager + AsyncKernelClient on stock ipykernel. A round trip ends when both the shell
`execute_reply` and the iopub `status: idle` of the same request have arrived (waiting for the reply
alone can lose output that arrives after it). With --lifecycle, measures kernel start (until
`wait_for_ready`) and shutdown instead.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from _protocol import Stopwatch, emit, parse_args
from jupyter_client.manager import AsyncKernelManager


async def round_trip(client: Any, code: str) -> None:
    msg_id = client.execute(code)

    async def shell_reply() -> None:
        while True:
            msg = await client.get_shell_msg()
            if msg["parent_header"].get("msg_id") == msg_id:
                return

    async def iopub_idle() -> None:
        while True:
            msg = await client.get_iopub_msg()
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                return

    await asyncio.gather(shell_reply(), iopub_idle())


async def start_kernel() -> tuple[AsyncKernelManager, Any]:
    manager = AsyncKernelManager(kernel_name="python3")
    await manager.start_kernel()
    client = manager.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    return manager, client


async def stop_kernel(manager: AsyncKernelManager, client: Any) -> None:
    client.stop_channels()
    await manager.shutdown_kernel()


async def measure_execute(runs: int, warmup: int) -> None:
    watch = Stopwatch()
    manager, client = await start_kernel()
    try:
        for i in range(warmup + runs):
            with watch.measure(keep=i >= warmup):
                await round_trip(client, "x = 1")
    finally:
        await stop_kernel(manager, client)
    emit("floor.execute_x1", watch.samples_ms)


async def measure_lifecycle(runs: int, warmup: int) -> None:
    start, stop = Stopwatch(), Stopwatch()
    for i in range(warmup + runs):
        keep = i >= warmup
        with start.measure(keep):
            manager, client = await start_kernel()
        await round_trip(client, "x = 1")
        with stop.measure(keep):
            await stop_kernel(manager, client)
    emit("floor.kernel_start", start.samples_ms)
    emit("floor.kernel_stop", stop.samples_ms)


async def main() -> None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--lifecycle", action="store_true", help="measure kernel start/stop")
    args = parse_args(__doc__ or "", default_runs=200, default_warmup=20, extra=extra)
    if args.lifecycle:
        await measure_lifecycle(args.runs, args.warmup)
    else:
        await measure_execute(args.runs, args.warmup)


if __name__ == "__main__":
    asyncio.run(main())
