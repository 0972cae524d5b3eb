"""`reset()` and the first `execute("x = 1")` after it, in one executor."""

from __future__ import annotations

import asyncio

from _protocol import Stopwatch, emit, parse_args

from ipybox import CodeExecutor


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1)
    reset, first = Stopwatch(), Stopwatch()
    async with CodeExecutor() as executor:
        await executor.execute("x = 1")
        for i in range(args.warmup + args.runs):
            keep = i >= args.warmup
            with reset.measure(keep):
                await executor.reset()
            with first.measure(keep):
                await executor.execute("x = 1")
    emit("kernel.reset", reset.samples_ms)
    emit("kernel.first_execute_after_reset", first.samples_ms)


if __name__ == "__main__":
    asyncio.run(main())
