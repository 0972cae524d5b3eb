"""CodeExecutor start (construct + enter, until ready), first execute, and stop (exit).

Every sample is a fresh executor, started and stopped in sequence.
"""

from __future__ import annotations

import asyncio

from _protocol import Stopwatch, emit, parse_args

from ipybox import CodeExecutor


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1)
    start, first, stop = Stopwatch(), Stopwatch(), Stopwatch()
    for i in range(args.warmup + args.runs):
        keep = i >= args.warmup
        with start.measure(keep):
            executor = CodeExecutor()
            await executor.__aenter__()
        try:
            with first.measure(keep):
                await executor.execute("x = 1")
        finally:
            with stop.measure(keep):
                await executor.__aexit__(None, None, None)
    emit("kernel.start", start.samples_ms)
    emit("kernel.first_execute", first.samples_ms)
    emit("kernel.stop", stop.samples_ms)


if __name__ == "__main__":
    asyncio.run(main())
