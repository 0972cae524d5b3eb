"""Finding a gateway's kernel processes, to kill one as a crash or the out-of-memory killer would; and how
many rounds the recovery tests (tests/kernels/test_recovery.py, tests/supervisor/test_recovery.py) run."""

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


# The recovery tests alternate two ways of dying (even and odd rounds). Four rounds run each way twice, and
# each way both from a fresh start and after the other way's recovery: every code path and every transition
# between them. More rounds repeat those same paths; they only raise the odds of catching a race that strikes
# now and then (the one these tests were written for, shared ZMQ socket names, struck every few rounds), at
# about 2.6 s a round and test (20 rounds took 313 s of the suite's worker time in CI, 4 take about 63 s).
# Set IPYBOX_TEST_RECOVERY_ROUNDS=20 (or more) for that soak after touching kernel start-up or recovery.
RECOVERY_ROUNDS_VARIABLE = "IPYBOX_TEST_RECOVERY_ROUNDS"
DEFAULT_RECOVERY_ROUNDS = 4


def recovery_rounds() -> int:
    """The recovery tests' rounds: IPYBOX_TEST_RECOVERY_ROUNDS, an even number >= 2, else 4."""
    text = os.environ.get(RECOVERY_ROUNDS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_RECOVERY_ROUNDS
    if not text.isdigit() or int(text) < 2 or int(text) % 2:
        raise ValueError(
            f"{RECOVERY_ROUNDS_VARIABLE}={text!r}: give an even number of rounds, 2 or more (each test "
            "alternates two ways of dying), e.g. 20; unset, the tests run 4"
        )
    return int(text)


def ready_timeouts() -> int:
    """How many kernel ready timeouts fired in this process so far."""
    return connection.ready_timeouts
