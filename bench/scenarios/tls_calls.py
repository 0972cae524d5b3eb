"""The call channel over TCP+TLS (remote kernels) against its Unix socket (local kernels).

One `ToolServer` with the `everything` server and a TLS listener on loopback (the workspace-generated
certificate, pinned by the client); the client is a separate Python process using the kernel's
`ToolRunner`, as a kernel does (not a thread of the server's process: they would share a GIL). Samples
alternate Unix / TLS, so both see the same minute of the machine.

- `calls.{unix,tls}.echo`: `everything.echo` round trip on the thread's kept connection (blocks of 10
  alternating).
- `calls.{unix,tls}.noop`: a request the channel answers without an MCP server (a shell-command
  approval decided by `ApproveAll`): the transport and the channel alone.
- `calls.{unix,tls}.connect`: that no-op on a new connection (connect, and for TLS the handshake and the
  pin check), what the first call of a new thread pays.

Ours only (0.9.2 has no TLS listener).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _protocol import emit, log, parse_args
from _servers import server_params

from ipybox.tool_server.remote_calls import RemoteCalls
from ipybox.tool_server.tls import workspace_certificate
from ipybox.tool_server.tool_server import ToolServer

CLIENT = r"""
import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
from ipybox.in_kernel import tool_runner
from ipybox.in_kernel.tool_runner import ToolRunner

runs, warmup = int(sys.argv[1]), int(sys.argv[2])
token, cert = os.environ["BENCH_TOKEN"], os.environ["BENCH_CERT"]
addresses = {"unix": os.environ["BENCH_UNIX"], "tls": os.environ["BENCH_TLS"]}
samples = {f"{kind}.{what}": [] for kind in addresses for what in ("echo", "noop", "connect")}

def timed(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000

NOOP = {"op": "shell", "kind": "shell", "cmd": "true"}  # approve_shell's request, with the pinned cert

runners = {
    kind: (
        ToolRunner("everything", address=address, token=token, cert=cert),
        ToolRunner("ipybox", address=address, token=token, cert=cert),
    )
    for kind, address in addresses.items()
}
# Calls on the kept connection (one per thread, as in a kernel): one thread per kind, so switching
# kinds does not reconnect; blocks of 10, alternating.
threads = {kind: ThreadPoolExecutor(1) for kind in addresses}

def block(kind, n, keep):
    runner, shell = runners[kind]
    for _ in range(n):
        echo = timed(lambda: runner.run_sync("echo", {"message": "hi"}))
        noop = timed(lambda: shell._request(NOOP))
        if keep:
            samples[f"{kind}.echo"].append(echo)
            samples[f"{kind}.noop"].append(noop)

done = 0
while done < warmup + runs:
    n = min(10, warmup + runs - done)
    for kind in addresses:
        threads[kind].submit(block, kind, n, done >= warmup).result()
    done += n

# A new connection per request (the main thread's, closed before each): connect, and for TLS the
# handshake and the pin check.
for i in range(warmup + runs):
    for kind in addresses:
        if tool_runner._local.conn is not None:
            tool_runner._local.conn.close()
            tool_runner._local.conn = None
        connect = timed(lambda: runners[kind][1]._request(NOOP))
        if i >= warmup:
            samples[f"{kind}.connect"].append(connect)
print(json.dumps(samples))
"""


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=200, default_warmup=20)
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        workdir = Path(tmp)
        remote = RemoteCalls(certificate=workspace_certificate(workdir / "tls", "127.0.0.1"))
        servers = {"everything": server_params("everything", workdir)}
        async with ToolServer(servers=servers, media_dir=workdir / "media", remote=remote) as server:
            env = {
                "BENCH_TOKEN": server.call_token,
                "BENCH_CERT": server.remote_certificate_pem,
                "BENCH_UNIX": server.calls_address,
                "BENCH_TLS": server.remote_address,
            }
            log(
                f"client: {args.runs} samples per metric after {args.warmup} warm-ups, unix and tls alternating"
            )
            client = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                CLIENT,
                str(args.runs),
                str(args.warmup),
                env={**env, "PATH": "/usr/bin:/bin"},
                stdout=subprocess.PIPE,
            )
            out, _ = await client.communicate()
            if client.returncode != 0:
                raise SystemExit(f"the client failed (exit {client.returncode})")
    samples: dict[str, list[float]] = json.loads(out.decode().strip().splitlines()[-1])
    for metric, values in samples.items():
        emit(f"calls.{metric}", values)


if __name__ == "__main__":
    asyncio.run(main())
