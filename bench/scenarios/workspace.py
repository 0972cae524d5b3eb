"""A running workspace (`ipybox up`, here an in-process Supervisor, sandbox on):

- `workspace.attach`: `CodeExecutor(workspace=...)` start, i.e. lease + warm kernel + approval socket,
  until the kernel answers (the pool is refilled between samples).
- `workspace.reconcile`: save an `ipybox.toml` that adds a server, until `import mcptools.<new>` works
  in an attached, running kernel; minus `workspace.server_start` (the same server's own start and
  tool listing, measured alone), which the target excludes.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from _protocol import Stopwatch, emit, log, parse_args

from ipybox import CodeExecutor
from ipybox.mcp_client import MCPConnection
from ipybox.supervisor import Supervisor

EDGE = Path(__file__).resolve().parents[2] / "tests" / "servers" / "edge_server.py"


def server_table(name: str) -> str:
    return f'\n[servers.{name}]\ncommand = "{sys.executable}"\nargs = ["{EDGE}"]\n'


async def pool_ready(supervisor: Supervisor) -> None:
    while supervisor.status().pool.idle < supervisor.config.kernel.warm_pool:
        await asyncio.sleep(0.01)


async def server_start(runs: int) -> list[float]:
    watch = Stopwatch()
    for _ in range(runs):
        connection = MCPConnection("edge", {"command": sys.executable, "args": [str(EDGE)]})
        with watch.measure():
            await connection.start()
            await connection.list_tools()
        await connection.stop()
    return watch.samples_ms


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=20, default_warmup=2)
    with tempfile.TemporaryDirectory(prefix="bench-workspace-") as tmp:
        workspace = Path(tmp)
        config = "[kernel]\nwarm_pool = 1\n[sandbox]\nenabled = true\n" + server_table("edge")
        config += '[approval]\ndefault = "allow"\n'
        (workspace / "ipybox.toml").write_text(config)
        supervisor = Supervisor(workspace)
        await supervisor.start()
        try:
            attach = Stopwatch()
            for i in range(args.warmup + args.runs):
                await pool_ready(supervisor)
                executor = CodeExecutor(workspace=workspace)
                with attach.measure(keep=i >= args.warmup):
                    await executor.start()
                await executor.stop()
            emit("workspace.attach", attach.samples_ms)

            starts = await server_start(max(3, args.runs // 4))
            emit("workspace.server_start", starts)
            reconcile: list[float] = []
            async with CodeExecutor(workspace=workspace) as executor:
                for i in range(max(3, args.runs // 4)):
                    name = f"added{i}"
                    config += server_table(name)
                    started = time.perf_counter()
                    (workspace / "ipybox.toml").write_text(config)
                    while True:
                        result = await executor.execute(
                            f"try:\n import mcptools.{name}\n print(1)\nexcept ImportError:\n print(0)"
                        )
                        if result.text == "1":
                            break
                        await asyncio.sleep(0.005)
                    reconcile.append((time.perf_counter() - started) * 1000)
            start_ms = sorted(starts)[len(starts) // 2]
            log(
                f"reconcile totals (ms): {[round(r) for r in reconcile]}, server start median {start_ms:.0f} ms"
            )
            emit("workspace.reconcile", [r - start_ms for r in reconcile], info={"server_start_ms": start_ms})
        finally:
            await supervisor.stop()


if __name__ == "__main__":
    asyncio.run(main())
