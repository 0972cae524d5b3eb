"""Kernels under limits, for real: each limit's runaway cell ends in its documented error, the host and the
kernel's neighbours are untouched, and nothing the cell started outlives the kernel.

Every test runs for each mechanism this user has (root: a cgroup v1 group and `setrlimit`; another user:
`setrlimit`; `tests/sandbox/test_unprivileged.py` runs this module again as one), sandboxed and not. What
a mechanism can't enforce (a process limit by `setrlimit` as root) is not asked of the kernel: the fork
test checks instead that asking for it is refused before anything starts.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from ipybox import CodeExecutionError, CodeExecutor, ResourceLimitError, ResourceLimits
from ipybox.limits import LimitUnavailableError, detect_enforcement

pytestmark = pytest.mark.integration

ROOT = os.geteuid() == 0
CGROUPS = detect_enforcement().mechanism != "rlimit"


def _limits(enforce: str, sandboxed: bool) -> ResourceLimits:
    rlimit = enforce == "rlimit"
    memory = "2GiB" if rlimit else "1GiB"  # setrlimit's is address space: an idle kernel reserves 0.7 GiB
    return ResourceLimits(
        # setrlimit can't bound an unsandboxed kernel's memory (the host's /dev/shm): it refuses to try.
        memory=None if rlimit and not sandboxed else memory,
        processes=None if (rlimit and ROOT) else 64,
        open_files=1024,
        file_size="100MiB",
        tmp="64MiB" if sandboxed else None,
        enforce="rlimit" if rlimit else "cgroup",
    )


def _kernel(enforce: str, sandboxed: bool) -> Any:
    # The control-group kernels are root's here: the unprivileged run (which must run what root runs but
    # for `root_only`) has setrlimit only.
    marks = [pytest.mark.root_only] if enforce == "cgroup" else []
    return pytest.param(
        (enforce, sandboxed), marks=marks, id=f"{enforce}-{'sandboxed' if sandboxed else 'unsandboxed'}"
    )


KERNELS = [_kernel(m, s) for m in (["cgroup"] if CGROUPS else []) + ["rlimit"] for s in (False, True)]
SANDBOXED = [kernel for kernel in KERNELS if kernel.values[0][1]]
MEMORY_LIMITED = [kernel for kernel in KERNELS if kernel.values[0] != ("rlimit", False)]


def _on(kernels: list[Any]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("limited", kernels, indirect=True)


@pytest.fixture(scope="module")
async def limited(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[CodeExecutor]:
    enforce, sandboxed = request.param
    workdir = tmp_path_factory.mktemp("limited")
    (workdir / "out").mkdir()  # a sandboxed kernel adds no name at the working dir's top level
    async with CodeExecutor(
        working_dir=workdir, sandbox=sandboxed, limits=_limits(enforce, sandboxed)
    ) as executor:
        yield executor


@_on(KERNELS)
async def test_a_10_gb_allocation_ends_in_a_resource_limit_error_naming_the_limit_and_the_peak(
    limited: CodeExecutor,
) -> None:
    if limited.limits.memory is None:  # setrlimit, unsandboxed
        with pytest.raises(LimitUnavailableError, match=r"memory 2 GiB: .* the host's /dev/shm"):
            await CodeExecutor(limits=ResourceLimits(memory="2GiB", enforce="rlimit")).start()
        return
    await limited.execute("kept = 41")
    with pytest.raises(ResourceLimitError) as caught:
        await limited.execute("x = b'1' * (10 * 2**30)")
    error = caught.value
    assert isinstance(error, CodeExecutionError) and error.limit == "memory"
    assert error.value == limited.limits.memory and "limit " in str(error)
    if error.kernel_restarted:  # a control group: the OOM killer ended the kernel
        assert error.peak is not None and "peak" in str(error) and "state is lost" in str(error)
        assert (await limited.execute("print('fresh')")).text == "fresh"
        with pytest.raises(CodeExecutionError, match="NameError"):
            await limited.execute("kept")
    else:  # setrlimit: the allocation failed, the kernel lives on with its state
        assert error.ename == "MemoryError" and "keeps its state" in str(error)
        assert (await limited.execute("print(kept + 1)")).text == "42"


@_on(KERNELS)
async def test_a_hundred_thousand_open_files_fail_in_the_cell_with_the_kernel_alive(
    limited: CodeExecutor,
) -> None:
    code = (
        "import tempfile\n"
        "files = []\n"
        "try:\n"
        "    for _ in range(100_000):\n"
        "        files.append(tempfile.TemporaryFile())\n"
        "finally:\n"
        "    opened = len(files)\n"
        "    for f in files:\n"
        "        f.close()\n"
        "    del files\n"
    )
    with pytest.raises(CodeExecutionError, match="Too many open files"):
        await limited.execute(code)
    opened = int((await limited.execute("print(opened)")).text)
    assert 900 < opened < 1024


@_on(KERNELS)
async def test_forking_without_end_fails_in_the_cell_and_what_it_forked_ends_with_the_kernel(
    limited: CodeExecutor,
) -> None:
    if limited.limits.processes is None:  # setrlimit as root: RLIMIT_NPROC does not apply to root
        with pytest.raises(LimitUnavailableError, match="processes 64: RLIMIT_NPROC does not apply to root"):
            await CodeExecutor(limits=ResourceLimits(processes=64, enforce="rlimit")).start()
        return
    marker = f"ipybox-bomb-{uuid.uuid4().hex}"
    # Every child holds its slot (and is marked, by the command line it execs into): forks fail at the limit.
    bomb = (
        "import os\n"
        "forked = 0\n"
        "while True:\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['{marker}', '3600'])\n"
        "    forked += 1\n"
    )
    with pytest.raises(
        CodeExecutionError, match=r"BlockingIOError: \[Errno 11\] Resource temporarily unavailable"
    ):
        await limited.execute(bomb)
    forked = int((await limited.execute("print(forked)")).text)
    assert 0 < forked < 64
    await _until(lambda: len(_processes_with(marker)) == forked)  # the last ones may still be exec'ing
    await limited.reset()  # the kernel goes (shut down in the background), and with it everything it forked
    await _until(lambda: not _processes_with(marker))
    assert (await limited.execute("print('after')")).text == "after"


@_on(KERNELS)
async def test_a_file_past_the_file_size_limit_fails_in_the_cell_with_the_kernel_alive(
    limited: CodeExecutor,
) -> None:
    code = "with open('out/big', 'wb') as f:\n    for _ in range(128):\n        f.write(b'0' * 2**20)"
    with pytest.raises(CodeExecutionError, match=r"\[Errno 27\] File too large"):
        await limited.execute(code)
    size = int(
        (await limited.execute("import os; print(os.path.getsize('out/big')); os.remove('out/big')")).text
    )
    assert size == 100 * 2**20


# Only sandboxed kernels have a private /tmp: a tmp limit without the sandbox is refused (test_enforcement).
@_on(SANDBOXED)
async def test_filling_the_private_tmp_fails_with_no_space_left(limited: CodeExecutor) -> None:
    with pytest.raises(CodeExecutionError, match="No space left on device"):
        await limited.execute(
            "with open('/tmp/fill', 'wb') as f:\n    for _ in range(128):\n        f.write(b'0' * 2**20)"
        )
    assert (await limited.execute("import os; os.remove('/tmp/fill'); print('alive')")).text == "alive"


# Memory a process keeps without a mapping: RLIMIT_AS does not count it (issue 31: 1.5 GiB held past a
# 1 GiB limit this way), a control group does.
# Many memfds: each is a file, which `file_size` (RLIMIT_FSIZE) bounds one by one.
HOLD_UNMAPPED = """
import os
limit = {limit}
held, chunk, fds = 0, b"1" * 2**24, []
while held < limit + 2**29:
    fds.append(os.memfd_create("hold"))
    for _ in range(4):
        held += os.write(fds[-1], chunk)
"""
SHMGET = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
segment = libc.shmget(0, 2**30, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
print(segment, os.strerror(ctypes.get_errno()) if segment < 0 else "")
"""


@_on(MEMORY_LIMITED)  # (setrlimit refuses the memory limit of an unsandboxed kernel: the 10 GB test)
async def test_a_kernel_cannot_hold_memory_past_its_limit_in_a_memfd_or_a_shared_memory_segment(
    limited: CodeExecutor,
) -> None:
    limit = limited.limits.memory
    assert limit is not None
    await limited.execute("kept = 41")
    with pytest.raises(CodeExecutionError) as caught:
        await limited.execute(HOLD_UNMAPPED.format(limit=limit))
    if isinstance(caught.value, ResourceLimitError):  # a control group counted the memfd's pages
        assert caught.value.kernel_restarted and caught.value.peak is not None
        assert caught.value.peak <= limit
    else:  # setrlimit: the seccomp filter refused memfd_create, before a byte was held
        assert "PermissionError: [Errno 1] Operation not permitted" in str(caught.value)
        assert (await limited.execute("print(kept + 1)")).text == "42"
        segment, why = (await limited.execute(SHMGET)).text.split(maxsplit=1)
        assert (segment, why) == ("-1", "Operation not permitted")


async def _until(condition: Callable[[], bool], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@_on(SANDBOXED)
async def test_a_sandboxed_kernel_can_neither_raise_its_limits_nor_leave_its_group(
    limited: CodeExecutor,
) -> None:
    code = (
        "import glob, resource\n"
        "refused = []\n"
        "for path in glob.glob('/sys/fs/cgroup/*/cgroup.procs') + glob.glob('/sys/fs/cgroup/*/memory.limit_in_bytes'):\n"
        "    try:\n"
        "        open(path, 'w').write('0')\n"
        "    except OSError:\n"
        "        refused.append(path)\n"
        "try:\n"
        "    resource.setrlimit(resource.RLIMIT_NOFILE, (100_000, 100_000))\n"
        "except ValueError:\n"
        "    refused.append('nofile')\n"
        "print(len(refused), len(glob.glob('/sys/fs/cgroup/*/cgroup.procs')) + len(glob.glob('/sys/fs/cgroup/*/memory.limit_in_bytes')) + 1)"
    )
    refused, tried = (await limited.execute(code)).text.split()
    assert refused == tried and int(tried) > 1
