"""MCP tool calls from code in the kernel, through the generated API, the tool server and approval.

- `tools.<tool>`: 100 calls in one cell, each timed inside the kernel (`execute()`, auto-approved).
- `tools.approval_added`: per cell with one call, `stream()` + `accept()` minus `execute()` (paired,
  alternating), i.e. what an application's approval round trip adds.
- `tools.first_call_fresh_kernel`: import + first call in a fresh kernel to an already running server,
  timed inside the kernel.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from _protocol import emit, log, parse_args
from _servers import populate_fs_root, server_params

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, generate_mcp_sources

TIMED_CELL = """
import json as _json, time as _time
from mcptools.{server}.{tool} import Params as _Params, run as _run
_params = _Params(**{args!r})
_samples = []
for _i in range({n}):
    _t = _time.perf_counter()
    _run(_params)
    _samples.append((_time.perf_counter() - _t) * 1000)
print(_json.dumps(_samples))
"""

FIRST_CALL_CELL = """
import json as _json, time as _time
_t = _time.perf_counter()
from mcptools.everything.echo import Params as _Params, run as _run
_run(_Params(message="first"))
print(_json.dumps((_time.perf_counter() - _t) * 1000))
"""

ONE_CALL_CELL = "from mcptools.everything.echo import Params, run\nrun(Params(message='x'))"


async def timed_calls(
    executor: CodeExecutor, server: str, tool: str, args: dict[str, str], n: int
) -> list[float]:
    result = await executor.execute(TIMED_CELL.format(server=server, tool=tool, args=args, n=n))
    assert result.text is not None
    samples: list[float] = json.loads(result.text.strip().splitlines()[-1])
    return samples


async def approved_cell(executor: CodeExecutor) -> float:
    start = time.perf_counter()
    async for item in executor.stream(ONE_CALL_CELL):
        if isinstance(item, ApprovalRequest):
            await item.accept()
        elif isinstance(item, CodeExecutionResult):
            pass
    return (time.perf_counter() - start) * 1000


async def auto_cell(executor: CodeExecutor) -> float:
    start = time.perf_counter()
    await executor.execute(ONE_CALL_CELL)
    return (time.perf_counter() - start) * 1000


async def fresh_kernel(executor: CodeExecutor) -> None:
    """A new kernel, leaving the MCP servers running (`reset()` would stop them too)."""
    client = getattr(executor, "kernel_client", None)  # ours
    if client is None:
        client = executor._client  # type: ignore[attr-defined]  # the peer's
    await client.reset()


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=100, default_warmup=20)
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        workdir = Path(tmp)
        populate_fs_root(workdir)
        mcptools = Path("mcptools")  # in the scratch working dir, where the kernel starts
        for server in ("everything", "filesystem"):
            await generate_mcp_sources(server, server_params(server, workdir), mcptools)
        async with CodeExecutor() as executor:
            calls = {
                "echo": ("everything", {"message": "hi"}),
                "list_directory": ("filesystem", {"path": str(workdir / "fs-root")}),
            }
            for tool, (server, tool_args) in calls.items():
                samples = await timed_calls(executor, server, tool, tool_args, args.warmup + args.runs)
                emit(f"tools.{tool}", samples[args.warmup :])

            approved, auto = [], []
            for i in range(args.warmup + args.runs):
                a, b = await approved_cell(executor), await auto_cell(executor)
                if i >= args.warmup:
                    approved.append(a)
                    auto.append(b)
            emit(
                "tools.approval_added",
                [a - b for a, b in zip(approved, auto, strict=True)],
                info={"stream_accept_ms": statistics.median(approved), "execute_ms": statistics.median(auto)},
            )

            first = []
            for _ in range(max(3, args.runs // 10)):
                await fresh_kernel(executor)
                await executor.execute(
                    "from mcptools.everything.echo import Params, run\nrun(Params(message='w'))"
                )
                await fresh_kernel(executor)  # the server is running; the kernel has imported nothing
                result = await executor.execute(FIRST_CALL_CELL)
                assert result.text is not None
                first.append(float(result.text.strip().splitlines()[-1]))
            log(f"first calls: {first}")
            emit("tools.first_call_fresh_kernel", first)


if __name__ == "__main__":
    asyncio.run(main())
