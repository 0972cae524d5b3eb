"""Time to interactive: a process that has imported ipybox attaches to a running workspace and runs code.

`ipybox up` runs as a subprocess (sandbox on, warm pool 1, the `edge` test server, approval `allow`), as
a user's would. Each sample is a new session on a kernel from the warm pool (refilled between samples):

- `startup.time_to_interactive`: `CodeExecutor(workspace=...)`, `start()` and the first
  `execute("x = 1")`, until it returns.
- `startup.attach`, `startup.attach_first_execute`: the same, split into `start()` and that execute.
- `startup.first_tool_call`: then, in that fresh kernel, the import of the generated `mcptools.edge.echo`
  and its first call (the server already runs), timed inside the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _protocol import emit, log, parse_args

from ipybox import CodeExecutor
from ipybox.supervisor import ControlClient

EDGE = Path(__file__).resolve().parents[2] / "tests" / "servers" / "edge_server.py"
IPYBOX = Path(sys.executable).parent / "ipybox"
READY_TIMEOUT_S = 180.0
WARM_POOL = 1

FIRST_CALL_CELL = """
import json as _json, time as _time
_t = _time.perf_counter()
from mcptools.edge.echo import Params as _Params, run as _run
_run(_Params(text="first"))
print(_json.dumps((_time.perf_counter() - _t) * 1000))
"""


async def ready(workspace: Path, supervisor: subprocess.Popen[bytes], timeout: float) -> None:
    """Until `edge` is ready and the pool is warm (the previous session's kernel replaced)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if supervisor.poll() is not None:
            raise RuntimeError(
                f"ipybox up exited with {supervisor.returncode} (see interactive.supervisor.log)"
            )
        with contextlib.suppress(Exception):
            async with ControlClient.of(workspace) as control:
                status = await control.status()
            edge = status.reconciler.servers.get("edge")
            if edge is not None and edge.state == "ready" and status.pool.idle >= WARM_POOL:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"ipybox up was not ready within {timeout:.0f} s")


async def session(workspace: Path) -> tuple[float, float, float]:
    """One new session: (attach, first execute, first tool call timed in the kernel), in ms."""
    started = time.perf_counter()
    executor = CodeExecutor(workspace=workspace)
    await executor.start()
    try:
        attached = time.perf_counter()
        await executor.execute("x = 1")
        executed = time.perf_counter()
        result = await executor.execute(FIRST_CALL_CELL)
        assert result.text is not None, "the first tool call printed nothing"
        call_ms = float(result.text.strip().splitlines()[-1])
    finally:
        await executor.stop()
    return (attached - started) * 1000, (executed - attached) * 1000, call_ms


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=20, default_warmup=2)
    with tempfile.TemporaryDirectory(prefix="bench-interactive-") as tmp:
        workspace = Path(tmp)
        (workspace / "ipybox.toml").write_text(
            f"[kernel]\nwarm_pool = {WARM_POOL}\n[sandbox]\nenabled = true\n"
            '[approval]\ndefault = "allow"\n'
            f'[servers.edge]\ncommand = "{sys.executable}"\nargs = ["{EDGE}"]\n'
        )
        with open(Path.cwd() / "interactive.supervisor.log", "wb") as supervisor_log:
            # Same process group as this script: whatever it leaves behind, the bench runner ends.
            supervisor = subprocess.Popen(
                [str(IPYBOX), "up", str(workspace)],
                stdin=subprocess.DEVNULL,
                stdout=supervisor_log,
                stderr=subprocess.STDOUT,
            )
        try:
            await ready(workspace, supervisor, READY_TIMEOUT_S)
            attach: list[float] = []
            first: list[float] = []
            calls: list[float] = []
            for i in range(args.warmup + args.runs):
                await ready(workspace, supervisor, 60.0)
                # The refilled kernel's start settles, and its warm-up (`ipybox.kernels.warm_up`) ends: a
                # session that comes at once finds it warming, and waits for one step of that at most.
                await asyncio.sleep(1.0)
                a, e, c = await session(workspace)
                if i >= args.warmup:
                    attach.append(a)
                    first.append(e)
                    calls.append(c)
            log(f"first tool calls (ms): {[round(c, 1) for c in calls]}")
            emit("startup.time_to_interactive", [a + e for a, e in zip(attach, first, strict=True)])
            emit("startup.attach", attach)
            emit("startup.attach_first_execute", first)
            emit("startup.first_tool_call", calls)
        finally:
            supervisor.terminate()
            try:
                supervisor.wait(60)
            except subprocess.TimeoutExpired:
                log("ipybox up did not stop within 60 s of SIGTERM: killing it")
                supervisor.kill()
                supervisor.wait()


if __name__ == "__main__":
    asyncio.run(main())
