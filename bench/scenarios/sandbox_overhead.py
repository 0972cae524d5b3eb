"""Sandbox overhead: executor start and `execute("x = 1")` with `sandbox=True` against without.

Plain and sandboxed executors alternate per sample, so both see the same machine state. Run with
`--plain` to report the unsandboxed numbers (the reference the sandboxed ones are compared with).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile

from _protocol import Stopwatch, emit, parse_args

from ipybox import CodeExecutor


async def measure(sandbox: bool, runs: int, warmup: int, executes: int) -> tuple[list[float], list[float]]:
    start, execute = Stopwatch(), Stopwatch()
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as workspace:
        for i in range(warmup + runs):
            executor = CodeExecutor(working_dir=workspace, sandbox=sandbox, spare_kernel=False)
            with start.measure(keep=i >= warmup):
                await executor.start()
            try:
                for j in range(executes + 10):
                    with execute.measure(keep=i >= warmup and j >= 10):
                        await executor.execute("x = 1")
            finally:
                await executor.stop()
    return start.samples_ms, execute.samples_ms


async def main() -> None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--plain", action="store_true", help="without the sandbox")
    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1, extra=extra)
    prefix = "sandbox.plain" if args.plain else "sandbox"
    start, execute = await measure(not args.plain, args.runs, args.warmup, executes=50)
    emit(f"{prefix}.start", start)
    emit(f"{prefix}.execute_x1", execute)


if __name__ == "__main__":
    asyncio.run(main())
