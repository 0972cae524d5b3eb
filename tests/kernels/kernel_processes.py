"""Finding a gateway's kernel processes, to kill one as a crash or the out-of-memory killer would."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

from ipybox import process
from ipybox.kernels import kernel_connection as connection

_CONNECTION_FILE = re.compile(rb"kernel-([0-9a-f-]{36})\.json")


def kernel_processes(gateway_pid: int) -> dict[str, int]:
    """Kernel id -> pid of the process running it, for the gateway's live kernels (under a sandbox, the
    innermost process: the kernel itself)."""
    found: dict[str, int] = {}
    for pid in process.descendants(gateway_pid):  # parents before their children
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        match = _CONNECTION_FILE.search(cmdline)
        if match is not None and b"ipybox.in_kernel.kernel_main" in cmdline and process.is_alive(pid):
            found[match.group(1).decode()] = pid
    return found


def kill_kernel(gateway_pid: int, kernel_id: str) -> None:
    pid = kernel_processes(gateway_pid)[kernel_id]
    os.kill(pid, signal.SIGKILL)


async def kill_next_kernel(gateway_pid: int, known: set[str], tries: int = 1000) -> str:
    """Kill the first kernel process that appears which is not one of `known` (a kernel being started),
    as soon as it appears; returns its id."""
    for _ in range(tries):
        for kernel_id, pid in kernel_processes(gateway_pid).items():
            if kernel_id not in known:
                os.kill(pid, signal.SIGKILL)
                return kernel_id
        await asyncio.sleep(0.005)
    raise AssertionError("no new kernel process appeared")


def ready_timeouts() -> int:
    """How many kernel ready timeouts fired in this process so far."""
    return connection.ready_timeouts
