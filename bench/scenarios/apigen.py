"""`generate_mcp_sources` for one real MCP server, end to end (server start, list_tools, generation).

Each sample writes into a fresh directory. With --split (our implementation only: the peer has no
public pure generator), also times the two halves separately, from a fresh server each time:
`fetch`: server start + initialize + list_tools; `stop`: stopping the server;
`generate`: generating (rendering and writing) from the fetched tool list.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from _protocol import Stopwatch, emit, parse_args
from _servers import SERVER_NAMES, server_params

from ipybox import generate_mcp_sources


async def servers_stopped() -> None:
    """Ours stops the server in the background after generating; untimed, let it finish before the next
    sample so samples don't overlap."""
    try:
        from ipybox.mcp_apigen.sources import wait_for_stopped_servers
    except ImportError:  # the peer stops it before returning
        return
    await wait_for_stopped_servers()


async def measure_total(name: str, params: dict[str, object], scratch: Path, runs: int, warmup: int) -> None:
    watch = Stopwatch()
    tools: list[str] = []
    for i in range(warmup + runs):
        root = scratch / f"total-{i}"
        with watch.measure(keep=i >= warmup):
            tools = await generate_mcp_sources(name, params, root)
        await servers_stopped()
    emit(f"apigen.{name}.total", watch.samples_ms, info={"tools": len(tools)})


async def measure_split(name: str, params: dict[str, object], scratch: Path, runs: int, warmup: int) -> None:
    import _split  # our implementation's internals; never imported under the peer

    fetch, stop, generate = Stopwatch(), Stopwatch(), Stopwatch()
    count = 0
    try:
        for i in range(warmup + runs):
            keep = i >= warmup
            with fetch.measure(keep):
                tools, stop_server = await _split.fetch_tools(name, params)
            with stop.measure(keep):
                await stop_server()
            with generate.measure(keep):
                count = _split.generate(name, tools, scratch / f"split-{i}")
    except _split.SplitUnavailable as e:
        for part in ("fetch", "stop", "generate", "generate_per_tool"):
            emit(f"apigen.{name}.{part}", [], status=f"not measured: {e}")
        return
    emit(f"apigen.{name}.fetch", fetch.samples_ms, info={"tools": count})
    emit(f"apigen.{name}.stop", stop.samples_ms)
    emit(f"apigen.{name}.generate", generate.samples_ms, info={"tools": count})
    emit(f"apigen.{name}.generate_per_tool", [s / max(count, 1) for s in generate.samples_ms])


async def main() -> None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--server", choices=SERVER_NAMES, required=True)
    extra.add_argument("--split", action="store_true", help="also time fetch and generation apart")
    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1, extra=extra)
    with tempfile.TemporaryDirectory(prefix="bench-apigen-") as tmp:
        scratch = Path(tmp)
        params = server_params(args.server, scratch)
        await measure_total(args.server, params, scratch, args.runs, args.warmup)
        if args.split:
            await measure_split(args.server, params, scratch, args.runs, args.warmup)


if __name__ == "__main__":
    asyncio.run(main())
