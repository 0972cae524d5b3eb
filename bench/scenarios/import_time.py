"""`from ipybox import CodeExecutor` in a fresh interpreter, no server configured.

- `startup.import`: the import alone, timed inside a fresh interpreter (its own start is not counted),
  one interpreter per sample. The status says whether the MCP SDK was imported on the way (it is not
  needed to construct an executor); `info` lists which heavy packages were, the median number of modules,
  and the median wall time of the whole process (interpreter start, import, exit).

Runs under either interpreter: the peer's ipybox 0.9.2 has the same import.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from _protocol import emit, parse_args

# Run in the fresh interpreter. `time` and `json` are imported before the clock starts: they are not
# ipybox's cost.
CHILD = """
import json, sys, time
started = time.perf_counter()
from ipybox import CodeExecutor
elapsed_ms = (time.perf_counter() - started) * 1000
heavy = ("mcp", "mcp_types", "pydantic", "pydantic_settings", "aiohttp", "httpx", "jinja2", "starlette")
print(json.dumps({
    "ms": elapsed_ms,
    "modules": len(sys.modules),
    "heavy": [name for name in heavy if name in sys.modules],
}))
"""


def one_sample() -> tuple[dict[str, object], float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=120
    )
    wall_ms = (time.perf_counter() - started) * 1000
    return json.loads(done.stdout.strip().splitlines()[-1]), wall_ms


def main() -> None:
    args = parse_args(__doc__ or "", default_runs=20, default_warmup=2)
    samples: list[float] = []
    walls: list[float] = []
    modules: list[int] = []
    heavy: set[str] = set()
    for i in range(args.warmup + args.runs):
        report, wall_ms = one_sample()  # warm-ups also write the .pyc files a first import would
        if i < args.warmup:
            continue
        samples.append(float(report["ms"]))  # type: ignore[arg-type]
        walls.append(wall_ms)
        modules.append(int(report["modules"]))  # type: ignore[call-overload]
        heavy.update(report["heavy"])  # type: ignore[arg-type]
    emit(
        "startup.import",
        samples,
        status="mcp imported" if "mcp" in heavy else "without mcp",
        info={
            "heavy_packages": sorted(heavy),
            "modules": statistics.median(modules),
            "process_wall_ms": round(statistics.median(walls), 1),
        },
    )


if __name__ == "__main__":
    main()
