"""The floor for tool calls: the same calls made directly with the mcp client (ClientSession over stdio),
no kernel, no tool server, no approval."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from _protocol import Stopwatch, emit, parse_args
from _servers import populate_fs_root, server_params
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CALLS: dict[str, tuple[str, str, Any]] = {
    "echo": ("everything", "echo", lambda workdir: {"message": "hi"}),
    "list_directory": ("filesystem", "list_directory", lambda workdir: {"path": str(workdir / "fs-root")}),
}


async def measure(metric: str, workdir: Path, runs: int, warmup: int) -> None:
    server, tool, make_args = CALLS[metric]
    params = server_params(server, workdir)
    stdio = StdioServerParameters(command=params["command"], args=params["args"])
    args = make_args(workdir)
    watch = Stopwatch()
    async with stdio_client(stdio) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for i in range(warmup + runs):
            with watch.measure(keep=i >= warmup):
                result = await session.call_tool(tool, args)
            assert not result.is_error, result
    emit(f"floor.tools.{metric}", watch.samples_ms)


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=100, default_warmup=20)
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        workdir = Path(tmp)
        populate_fs_root(workdir)
        for metric in CALLS:
            await measure(metric, workdir, args.runs, args.warmup)


if __name__ == "__main__":
    asyncio.run(main())
