"""Print N MB from the kernel: how long it takes and whether the text comes back intact.

The kernel prints a known pattern, so the result classifies as intact, truncated (how much was kept,
and whether a notice says so) or lost (silently or with a notice). Errors are a status too: a lost
output is a result here, not a failed benchmark.
"""

from __future__ import annotations

import argparse
import asyncio

from _protocol import Stopwatch, emit, log, parse_args, summarize_statuses

from ipybox import CodeExecutor

LINE = "0123456789abcde"  # 16 bytes with its newline


def classify(text: str | None, total_lines: int) -> str:
    lines = (text or "").splitlines()
    kept = sum(1 for line in lines if line == LINE)
    notices = [line.strip() for line in lines if line != LINE and line.strip()]
    notice = f"notice {notices[0][:70]!r}" if notices else None
    if kept == total_lines and not notices:
        return "intact"
    if kept > 0:
        return (
            f"truncated, {kept * 16 / 1e6:.2f}/{total_lines * 16 / 1e6:.2f} MB kept, {notice or 'no notice'}"
        )
    return f"lost, {notice}" if notice else "lost silently"


async def main() -> None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--mb", type=int, required=True, help="megabytes to print")
    args = parse_args(__doc__ or "", default_runs=5, default_warmup=0, extra=extra)
    total_lines = args.mb * 1_000_000 // 16
    code = f"print({LINE + chr(10)!r} * {total_lines}, end='')"
    watch = Stopwatch()
    statuses: list[str] = []
    async with CodeExecutor() as executor:
        await executor.execute("x = 1")  # warm the path without tripping any output rate limit
        for i in range(args.warmup + args.runs):
            with watch.measure(keep=i >= args.warmup):
                try:
                    result = await executor.execute(code)
                except Exception as e:
                    status = f"error {type(e).__name__}: {str(e)[:70]!r}"
                else:
                    status = classify(result.text, total_lines)
            if i >= args.warmup:
                statuses.append(status)
            log(f"{args.mb} MB sample {i}: {status}")
    emit(f"kernel.print_{args.mb}mb", watch.samples_ms, status=summarize_statuses(statuses))


if __name__ == "__main__":
    asyncio.run(main())
