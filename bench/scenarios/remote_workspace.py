"""A workspace whose kernels are on Jupyter Enterprise Gateway (`[kernel.gateway]`, tool calls over TCP+TLS,
generated modules imported over the call channel) against the same workspace with local kernels (Unix
sockets, modules from disk), in one run.

Ours only. Two supervisors run side by side (`ipybox up` in-process), each with our edge server and an
allow rule; one application attaches to each (`CodeExecutor(workspace=...)`). Samples alternate local /
remote. Metrics:

- `remote.ws.execute`: `execute("x = 1")` round trip (remote: the gateway's websocket over TCP, plus the
  kernel's per-cell generation check over the channel).
- `remote.ws.tool_call`: one `echo.run()` inside the kernel, timed in the kernel (the call channel only).
- `remote.ws.first_import`: `import mcptools.edge.echo` in a fresh kernel (after `reset()`), timed in the
  kernel: the module's source comes over the channel for remote kernels, from disk for local ones.
The local figures are emitted as `remote.ws.local_*` (the floors).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from _protocol import Stopwatch, emit, log, parse_args

from ipybox import CodeExecutor
from ipybox.supervisor import Supervisor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for tests.*
from tests.remote.eg import EnterpriseGateway
from tests.servers.params import EDGE_SERVER

RULE = '[[approval.rules]]\nserver = "edge"\ndecision = "allow"\n'
CALL = (
    "import time as _t\nfrom mcptools.edge import echo as _e\n_s = _t.perf_counter()\n"
    "_e.run(_e.Params(text='hi'))\nprint((_t.perf_counter() - _s) * 1000)"
)
IMPORT = "import time as _t\n_s = _t.perf_counter()\nimport mcptools.edge.echo\nprint((_t.perf_counter() - _s) * 1000)"


def workspace(directory: Path, gateway: EnterpriseGateway | None) -> Path:
    remote = ""
    if gateway is not None:
        remote = f'[kernel.gateway]\nurl = "{gateway.url}"\ntoken = "{gateway.token}"\nkernelspec = "{gateway.kernel_name}"\n'
    (directory / "ipybox.toml").write_text(
        "[kernel]\nwarm_pool = 1\n"
        + remote
        + '[kernel.limits]\nmemory = "unlimited"\n'
        + "[sandbox]\nenabled = false\n[endpoints]\nmcp = false\nconsole = false\n"
        + f'[servers.edge]\ncommand = "{sys.executable}"\nargs = ["{EDGE_SERVER}"]\n'
        + RULE
    )
    return directory


def layout(tmp: str) -> Path:
    root = Path(os.path.realpath(tmp))
    for name in ("eg", "local", "remote"):
        (root / name).mkdir()
    return root


async def sample(executor: CodeExecutor, execute: Stopwatch, keep: bool) -> tuple[float, float]:
    with execute.measure(keep):
        await executor.execute("x = 1")
    call = float((await executor.execute(CALL)).text or "nan")
    await executor.reset()
    await asyncio.sleep(1.0)  # the pool's refill settles
    first = float((await executor.execute(IMPORT)).text or "nan")
    return call, first


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=10, default_warmup=1)
    with tempfile.TemporaryDirectory(prefix="ipybox-bench-remote-ws-") as tmp:
        root = layout(tmp)
        eg = EnterpriseGateway(root / "eg")
        await asyncio.to_thread(eg.start)
        local_ws, remote_ws = workspace(root / "local", None), workspace(root / "remote", eg)
        local, remote = Supervisor(local_ws), Supervisor(remote_ws)
        try:
            began = time.perf_counter()
            await local.start()
            await remote.start()
            log(f"both workspaces up after {(time.perf_counter() - began) * 1000:.0f} ms")
            watches = {side: (Stopwatch(), Stopwatch(), Stopwatch()) for side in ("local", "remote")}
            async with (
                CodeExecutor(workspace=local_ws, images_dir=root / "li") as on_local,
                CodeExecutor(workspace=remote_ws, images_dir=root / "ri") as on_remote,
            ):
                for i in range(args.warmup + args.runs):
                    keep = i >= args.warmup
                    for side, executor in (("local", on_local), ("remote", on_remote)):
                        execute, call, first = watches[side]
                        c, f = await sample(executor, execute, keep)
                        if keep:
                            call.samples_ms.append(c)
                            first.samples_ms.append(f)
        finally:
            await remote.stop()
            await local.stop()
            await asyncio.to_thread(eg.stop)
    for side, prefix in (("local", "remote.ws.local_"), ("remote", "remote.ws.")):
        execute, call, first = watches[side]
        emit(f"{prefix}execute", execute.samples_ms)
        emit(f"{prefix}tool_call", call.samples_ms)
        emit(f"{prefix}first_import", first.samples_ms)


if __name__ == "__main__":
    asyncio.run(main())
