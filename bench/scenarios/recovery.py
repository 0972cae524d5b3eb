"""Recovery from the death of a kernel and of the gateway.

SDK (`CodeExecutor()`, one executor):
- `kernel.death_error`: `execute("os._exit(1)")` until its `KernelDiedError`.
- `kernel.execute_after_death`: the next `execute("x = 1")` (on the spare kernel).
- `kernel.reset_after_death`: a second later (the user's next turn), `reset()`.
- `kernel.first_execute_after_death_reset`: the first `execute("x = 1")` after that reset.
- `kernel.gateway_death_error`: the gateway is killed (SIGKILL) under a running cell, until the cell's
  `KernelDiedError` (an executor of its own per sample: without its gateway it cannot run code).

Workspace (`ipybox up`, here an in-process Supervisor, sandbox off, warm pool of 1):
- `kernel.ws_execute_after_gateway_death`: the gateway is killed while the attached application is idle,
  which calls `execute("x = 1")` 0.2 s later: from the kill until that execute returns, i.e. the gateway's
  restart and a fresh kernel.
- `kernel.ws_gateway_death_error`: killed under a running cell, until the cell's `KernelDiedError`
  (raised once the application has a fresh kernel on the restarted gateway).
- `kernel.ws_reset_after_death`: a cell kills its kernel; a second later, `reset()`.

Ours only: the published 0.9.2 has no workspace, and waits for a cell's timeout when its kernel dies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from pathlib import Path

from _protocol import Stopwatch, emit, log, parse_args

from ipybox import CodeExecutionError, CodeExecutor
from ipybox.supervisor import Supervisor

RUNNING = "print('running', flush=True)\nimport time\ntime.sleep(120)"


async def expect_death(executor: CodeExecutor, code: str) -> None:
    try:
        await executor.execute(code, timeout=60)
    except CodeExecutionError as e:
        if e.ename != "KernelDied":
            raise
    else:
        raise AssertionError("the kernel did not die")


async def kill_gateway_under_cell(executor: CodeExecutor, pid: int, watch: Stopwatch, keep: bool) -> None:
    stream = executor.stream(RUNNING, chunks=True, timeout=60)
    await anext(stream)  # the cell runs
    with watch.measure(keep):
        os.kill(pid, signal.SIGKILL)
        try:
            async for _ in stream:
                pass
        except CodeExecutionError as e:
            if e.ename != "KernelDied":
                raise
        else:
            raise AssertionError("the cell survived its gateway")


async def sdk(runs: int, warmup: int) -> None:
    error, execute, reset, first = Stopwatch(), Stopwatch(), Stopwatch(), Stopwatch()
    async with CodeExecutor() as executor:
        await executor.execute("x = 1")
        await asyncio.sleep(1.0)
        for i in range(warmup + runs):
            keep = i >= warmup
            with error.measure(keep):
                await expect_death(executor, "import os; os._exit(1)")
            with execute.measure(keep):
                await executor.execute("x = 1")
            await asyncio.sleep(1.0)
            with reset.measure(keep):
                await executor.reset()
            with first.measure(keep):
                await executor.execute("x = 1")
            await asyncio.sleep(1.0)
    emit("kernel.death_error", error.samples_ms)
    emit("kernel.execute_after_death", execute.samples_ms)
    emit("kernel.reset_after_death", reset.samples_ms)
    emit("kernel.first_execute_after_death_reset", first.samples_ms)

    gateway_error = Stopwatch()
    for i in range(warmup + max(3, runs // 2)):
        async with CodeExecutor() as executor:
            gateway = executor.kernel_gateway
            assert gateway is not None and gateway.pid is not None
            await executor.execute("x = 1")
            await kill_gateway_under_cell(executor, gateway.pid, gateway_error, i >= warmup)
        await asyncio.sleep(1.5)  # its kernels notice that the gateway is gone and exit
    emit("kernel.gateway_death_error", gateway_error.samples_ms)


async def pool_ready(supervisor: Supervisor) -> None:
    while supervisor.status().pool.idle < supervisor.config.kernel.warm_pool:
        await asyncio.sleep(0.01)


def gateway_pid(supervisor: Supervisor) -> int:
    pid = supervisor.status().gateway.pid
    assert isinstance(pid, int)
    return pid


async def workspace(runs: int, warmup: int) -> None:
    execute, error, reset = Stopwatch(), Stopwatch(), Stopwatch()
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        (Path(tmp) / "ipybox.toml").write_text("[kernel]\nwarm_pool = 1\n[sandbox]\nenabled = false\n")
        supervisor = Supervisor(Path(tmp))
        await supervisor.start()
        try:
            async with CodeExecutor(workspace=tmp) as executor:
                await executor.execute("x = 1")
                for i in range(warmup + runs):
                    keep = i >= warmup
                    await pool_ready(supervisor)
                    await asyncio.sleep(1.0)
                    pid = gateway_pid(supervisor)
                    with execute.measure(keep):
                        os.kill(pid, signal.SIGKILL)
                        await asyncio.sleep(0.2)  # the application is idle: its kernel's websocket closes
                        await executor.execute("x = 1")
                    await pool_ready(supervisor)
                    await asyncio.sleep(1.0)
                    await kill_gateway_under_cell(executor, gateway_pid(supervisor), error, keep)
                    await pool_ready(supervisor)
                    await expect_death(executor, "import os; os._exit(1)")
                    await pool_ready(supervisor)
                    await asyncio.sleep(1.0)
                    with reset.measure(keep):
                        await executor.reset()
                    await executor.execute("x = 1")
                log(f"gateway restarts: {supervisor.status().restarts['gateway']}")
        finally:
            await supervisor.stop()
    emit("kernel.ws_execute_after_gateway_death", execute.samples_ms)
    emit("kernel.ws_gateway_death_error", error.samples_ms)
    emit("kernel.ws_reset_after_death", reset.samples_ms)


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1)
    await sdk(args.runs, args.warmup)
    await workspace(args.runs, args.warmup)


if __name__ == "__main__":
    asyncio.run(main())
