"""`execute("x = 1")` round trips in one warm executor."""

from __future__ import annotations

import asyncio

from _protocol import Stopwatch, emit, parse_args

from ipybox import CodeExecutor


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=200, default_warmup=20)
    watch = Stopwatch()
    async with CodeExecutor() as executor:
        for i in range(args.warmup + args.runs):
            with watch.measure(keep=i >= args.warmup):
                await executor.execute("x = 1")
    emit("kernel.execute_x1", watch.samples_ms)


if __name__ == "__main__":
    asyncio.run(main())
