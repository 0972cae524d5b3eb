"""`Usage` and what is read from `/proc` without a group: `tree_usage` of a real process tree (memory summed,
threads counted, descendants included), and `user_tasks`, what RLIMIT_NPROC counts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipybox.limits.usage import Usage, tree_usage, user_tasks

MiB = 1024**2

# A parent and a child, each holding 48 MiB (touched: resident) and running one extra thread.
HOLD = """
import sys, threading
data = b"x" * (48 * 1024**2)
threading.Thread(target=sys.stdin.read, daemon=True).start()
"""
TREE = (
    HOLD
    + """
import subprocess
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "ready\\n"
print(child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""
)
LEAF = HOLD + "\nprint('ready', flush=True)\nimport time\ntime.sleep(600)\n"


@pytest.fixture
def tree() -> Iterator[tuple[int, int]]:
    """(parent pid, child pid) of a running two-process tree."""
    parent = subprocess.Popen(
        [sys.executable, "-c", TREE, LEAF], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        yield parent.pid, child
    finally:
        parent.kill()
        parent.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


@pytest.mark.integration
def test_tree_usage_sums_the_memory_and_threads_of_a_process_and_its_descendants(
    tree: tuple[int, int],
) -> None:
    parent, child = tree

    usage = tree_usage(parent)
    alone = tree_usage(child)

    assert usage.processes == 4, "two processes, two threads each"
    assert alone.processes == 2
    assert usage.memory is not None and alone.memory is not None
    assert usage.memory >= 2 * 48 * MiB
    assert alone.memory >= 48 * MiB and usage.memory > alone.memory
    assert usage.memory_peak is not None and 48 * MiB <= usage.memory_peak < usage.memory, "the largest one's"
    assert usage.cpu_seconds is not None and usage.cpu_seconds >= alone.cpu_seconds  # type: ignore[operator]
    assert usage.oom_kills == 0


@pytest.mark.integration
def test_tree_usage_reads_a_process_whose_name_has_spaces_and_parentheses(tmp_path: Path) -> None:
    odd = tmp_path / "a) b (c"
    odd.symlink_to(sys.executable)
    process = subprocess.Popen(
        [str(odd), "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        assert Path(f"/proc/{process.pid}/comm").read_text().strip() == "a) b (c"

        usage = tree_usage(process.pid)

        assert usage.processes == 1
        assert usage.memory is not None and usage.memory > 0
    finally:
        process.kill()
        process.wait()


def test_tree_usage_of_a_process_that_is_gone_is_unknown() -> None:
    # pid_max is at most 2**22: no process has this pid.
    assert tree_usage(2**22 + 1) == Usage()


def test_tree_usage_of_this_process_counts_its_threads() -> None:
    threads = int(
        next(
            line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("Threads:")
        ).split()[1]
    )

    usage = tree_usage(os.getpid())

    assert usage.processes is not None and usage.processes >= threads


@pytest.mark.user_dependent  # the unprivileged pass runs it again: see tests/sandbox/test_unprivileged.py
def test_user_tasks_counts_at_least_this_processs_threads() -> None:
    threads = int(
        next(
            line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("Threads:")
        ).split()[1]
    )

    assert user_tasks() >= threads


@pytest.mark.user_dependent  # the unprivileged pass runs it again: see tests/sandbox/test_unprivileged.py
def test_user_tasks_of_a_user_without_processes_is_zero() -> None:
    assert user_tasks(uid=4_000_000_000) == 0


def test_usage_round_trips_through_json_and_tolerates_missing_keys() -> None:
    usage = Usage(memory=1, memory_peak=2, cpu_seconds=0.5, processes=3, oom_kills=4)

    assert Usage.from_json(usage.as_json()) == usage
    assert Usage.from_json({}) == Usage()
    assert Usage.from_json({"oom_kills": None, "memory": 5}) == Usage(memory=5)
