"""`reset()` and the first `execute("x = 1")` after it, in one executor.

`kernel.reset` leaves a second between resets (an agent's turn), so the warm spare kernel is ready;
`kernel.reset_back_to_back` resets again right away, so it waits for the spare's start.
"""

from __future__ import annotations

import asyncio

from _protocol import Stopwatch, emit, parse_args

from ipybox import CodeExecutor


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1)
    reset, first, back_to_back = Stopwatch(), Stopwatch(), Stopwatch()
    async with CodeExecutor() as executor:
        await executor.execute("x = 1")
        for i in range(args.warmup + args.runs):
            keep = i >= args.warmup
            await asyncio.sleep(1.0)
            with reset.measure(keep):
                await executor.reset()
            with first.measure(keep):
                await executor.execute("x = 1")
        for i in range(args.warmup + args.runs):
            with back_to_back.measure(i >= args.warmup):
                await executor.reset()
    emit("kernel.reset", reset.samples_ms)
    emit("kernel.first_execute_after_reset", first.samples_ms)
    emit("kernel.reset_back_to_back", back_to_back.samples_ms)


if __name__ == "__main__":
    asyncio.run(main())
