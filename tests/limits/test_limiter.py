"""`Limiter` and `Limited`: nothing is made without limits; a limiter survives its JSON trip to the gateway;
with a control group (cgroup v1 as root here, `@root_only`) each process starts inside its group, is
reported against its limits, and `release` ends it with everything it started, also what left its process
tree (`setsid` and a double fork); `close` removes the parent; a dead host's groups go at the next `open`.
Without a group (`setrlimit`, any user) the process gets its rlimits and is reported from its tree."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from ipybox.limits.cgroups import Cgroup, cgroup_support
from ipybox.limits.enforcement import Enforcement, LimitUnavailableError
from ipybox.limits.limiter import NPROC_PER_USER_NAMESPACE, Limited, Limiter
from ipybox.limits.seccomp import filter_path
from ipybox.limits.spec import ResourceLimits, WorkspaceLimits
from ipybox.limits.wrapper import SHELL, limited_argv

Test = TypeVar("Test", bound=Callable[..., None])
ROOT = os.geteuid() == 0
# Without a group (any user) processes get rlimits: the unprivileged pass runs it again.
pytestmark = pytest.mark.user_dependent
MiB = 1024**2
RLIMIT = Enforcement("rlimit", None, ("cgroup v2: not mounted",))
ON_ROOT = [
    pytest.mark.integration,
    pytest.mark.root_only,
    pytest.mark.skipif(not ROOT, reason="cgroup v1 groups are root's"),
]

# Starts a grandchild that leaves the tree (setsid, double fork), then says its pid and its open-file limit.
ESCAPE = """
import os, resource, sys, time
read, write = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(write, str(os.getpid()).encode())
        time.sleep(600)
    os._exit(0)
os.wait()
grandchild = os.read(read, 32).decode()
print(grandchild, resource.getrlimit(resource.RLIMIT_NOFILE)[1], flush=True)
sys.stdin.read()
"""


def _gone(pid: int) -> bool:
    """Whether `pid` ended (a zombie waiting for init counts), waiting for it a while."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat[stat.rfind(")") + 2] in "ZX":
            return True
        time.sleep(0.01)
    return False


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    assert not os.path.exists(f"/proc/{done.pid}")
    return done.pid


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


@contextlib.contextmanager
def _running(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    process = _start(argv)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _ready(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, "the process started"
    return line.strip()


# -- without limits, and the JSON trip ---------------------------------------------------------------------


@pytest.mark.parametrize("sandboxed", [False, True])
def test_no_limits_make_no_limiter(sandboxed: bool) -> None:
    assert Limiter.open(ResourceLimits(), sandboxed=sandboxed) is None
    assert Limiter.open(ResourceLimits(enforce="cgroup"), sandboxed=sandboxed, enforcement=RLIMIT) is None


def test_limits_that_cannot_be_enforced_are_refused_with_the_source_and_nothing_is_made() -> None:
    with pytest.raises(LimitUnavailableError, match=r"\[kernel.limits\].*cpus 2"):
        Limiter.open(ResourceLimits(cpus=2), sandboxed=False, source="[kernel.limits]", enforcement=RLIMIT)


def test_a_limiter_round_trips_through_json() -> None:
    limits = WorkspaceLimits(cpus=1.5, enforce="cgroup")
    parent = Cgroup(1, {"memory": "/m/ipybox-1-ab", "pids": "/p/ipybox-1-ab", "cpu": "/c/ipybox-1-ab"})

    for limiter in (Limiter(limits, "cgroup1", parent), Limiter(limits, "rlimit", None)):
        data = json.loads(json.dumps(limiter.as_json()))
        assert Limiter.from_json(data) == Limiter(
            ResourceLimits(**limits.model_dump()), limiter.mechanism, limiter.parent
        )


def test_with_setrlimit_the_command_line_sets_the_users_processes_on_top_and_the_file_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The user's task count moves while parallel workers start and end processes: pin it.
    monkeypatch.setattr("ipybox.limits.limiter.user_tasks", lambda: 413)
    limiter = Limiter(ResourceLimits(processes=64, open_files=128, file_size="1MiB"), "rlimit", None)

    argv = limiter.start("kernel").argv(["kernel", "--flag"])

    assert argv[0] == SHELL and argv[-3:] == ["--", "kernel", "--flag"]
    steps = argv[4 : argv.index("--")]
    assert steps[0] == "nofile=128"
    assert steps[1] == f"nproc={413 + 64}"
    assert steps[2] == "fsize=2048"


def test_with_setrlimit_a_memory_limit_is_never_set_on_a_command_bubblewrap_does_not_start() -> None:
    limited = Limiter(ResourceLimits(memory="1GiB", tmp="64MiB"), "rlimit", None).start("kernel")

    with pytest.raises(ValueError, match="needs bubblewrap"):
        limited.argv(["kernel"])
    with pytest.raises(ValueError, match="needs bubblewrap"):
        limited.argv(["sandbox-exec", "kernel"], sandboxed=True)


@pytest.mark.skipif(not NPROC_PER_USER_NAMESPACE, reason="a sandbox has its own process count on Linux only")
def test_with_setrlimit_a_sandbox_gets_exactly_its_processes_inside_its_user_namespace() -> None:
    limits = ResourceLimits(memory="1GiB", processes=64, open_files=128, tmp="64MiB")
    limiter = Limiter(limits, "rlimit", None)

    inside = limiter.sandbox_argv(["kernel", "--flag"])
    outside = limiter.start("kernel").argv(["/usr/bin/bwrap", "--", *inside], sandboxed=True)

    # Inside, the sandbox's own count: exactly 64, whatever else the user runs.
    assert inside == limited_argv(["kernel", "--flag"], processes=64)
    # Outside, everything but the process limit (which would bound the user's total instead), and the
    # seccomp filter bubblewrap installs: memory RLIMIT_AS does not count is refused.
    bwrap = ["/usr/bin/bwrap", "--add-seccomp-fd", "9", "--", *inside]
    assert outside == limited_argv(bwrap, open_files=128, address_space=1024**3, seccomp=filter_path())


def test_without_setrlimit_or_a_process_limit_the_sandboxed_command_is_left_as_it_is() -> None:
    cgroup = Limiter(ResourceLimits(processes=64), "cgroup2", None)
    no_processes = Limiter(ResourceLimits(open_files=128), "rlimit", None)

    assert cgroup.sandbox_argv(["kernel"]) == ["kernel"]
    assert no_processes.sandbox_argv(["kernel"]) == ["kernel"]


def test_under_a_cgroup_the_command_line_joins_and_sets_only_open_files() -> None:
    group = Cgroup(1, {"memory": "/m/g", "pids": "/p/g", "cpu": "/c/g", "cpuacct": "/c/g"})
    limited = Limited(Limiter(ResourceLimits(memory="1GiB", processes=64, open_files=128), "cgroup1"), group)

    assert limited.argv(["kernel"]) == limited_argv(
        ["kernel"], join=["/m/g/cgroup.procs", "/p/g/cgroup.procs", "/c/g/cgroup.procs"], open_files=128
    )


# -- setrlimit, for real (any user) ------------------------------------------------------------------------

RLIMITS = "import resource, sys; print(resource.getrlimit(resource.RLIMIT_FSIZE)[1], resource.getrlimit(resource.RLIMIT_NOFILE)[1], flush=True); sys.stdin.read()"


@pytest.mark.integration
def test_with_setrlimit_the_process_gets_its_limits_and_is_reported_from_its_tree() -> None:
    # (A memory limit under setrlimit is for sandboxed processes: see test_kernel_limits.)
    limits = ResourceLimits(file_size="1GiB", open_files=128, processes=None if ROOT else 4096)
    limiter = Limiter.open(limits, sandboxed=False, enforcement=RLIMIT)
    assert limiter is not None and limiter.parent is None and limiter.mechanism == "rlimit"
    limited = limiter.start("kernel")
    assert limited.group is None

    with _running(limited.argv([sys.executable, "-c", RLIMITS])) as process:
        assert _ready(process) == f"{1024**3} 128"

        report = limited.report(process.pid)

        assert report["mechanism"] == "rlimit"
        assert report["limits"] == limits.set_limits()
        assert report["usage"]["processes"] == 1
        assert report["usage"]["memory"] > 0
        limited.release()  # no group: ending the process is its starter's business
        limiter.close()
    assert limited.report(None)["usage"] == {
        "memory": None,
        "memory_peak": None,
        "cpu_seconds": None,
        "processes": None,
        "oom_kills": 0,
    }


@pytest.mark.integration
def test_this_user_gets_a_group_as_root_and_setrlimit_otherwise() -> None:
    # Memory too where a group can be made; setrlimit refuses it for an unsandboxed process.
    limits = WorkspaceLimits() if ROOT else WorkspaceLimits(memory="unlimited")
    limiter = Limiter.open(limits.without_tmp(), sandboxed=False)
    assert limiter is not None
    try:
        if ROOT:
            assert limiter.mechanism in ("cgroup1", "cgroup2")
            assert limiter.parent is not None and all(os.path.isdir(d) for d in limiter.parent.directories())
        else:
            assert limiter.mechanism in ("rlimit", "cgroup2")
    finally:
        limiter.close()


# -- cgroups, for real (root) ------------------------------------------------------------------------------


@pytest.fixture
def limiter() -> Iterator[Limiter]:
    limits = ResourceLimits(memory="256MiB", cpus=0.5, processes=32, open_files=256)
    opened = Limiter.open(limits, sandboxed=False, source="[kernel.limits]")
    assert opened is not None and opened.parent is not None, "root gets a control group here"
    try:
        yield opened
    finally:
        opened.close()


def _on_root(test: Test) -> Test:
    """Starts processes in cgroup v1 groups: root's (deselected from the unprivileged run)."""
    for mark in ON_ROOT:
        test = mark(test)
    return test


@_on_root
def test_open_makes_a_parent_named_after_this_host_under_its_own_group(limiter: Limiter) -> None:
    assert limiter.mechanism == "cgroup1"
    assert limiter.parent is not None
    names = {os.path.basename(d) for d in limiter.parent.directories()}
    assert len(names) == 1
    name = names.pop()
    assert name.startswith(f"ipybox-{os.getpid()}-") and len(name.rsplit("-", 1)[1]) == 8
    assert all(os.path.isdir(d) for d in limiter.parent.directories())


@_on_root
def test_a_started_process_is_in_its_group_under_its_limits_and_reported(limiter: Limiter) -> None:
    limited = limiter.start("kernel-1")
    assert limited.group is not None
    memory = Path(limited.group.dirs["memory"])
    assert (memory / "memory.limit_in_bytes").read_text().strip() == str(256 * MiB)
    assert (Path(limited.group.dirs["pids"]) / "pids.max").read_text().strip() == "32"
    assert (Path(limited.group.dirs["cpu"]) / "cpu.cfs_quota_us").read_text().strip() == "50000"

    with _running(limited.argv([sys.executable, "-c", ESCAPE])) as process:
        grandchild, open_files = map(int, _ready(process).split())

        assert open_files == 256
        assert limited.group.pids() == {process.pid, grandchild}
        report = limited.report(process.pid)
        assert report["mechanism"] == "cgroup1"
        assert report["limits"] == {"memory": 256 * MiB, "cpus": 0.5, "processes": 32, "open_files": 256}
        assert report["usage"]["processes"] == 2
        assert report["usage"]["memory"] > 0
        assert report["usage"]["oom_kills"] == 0
        limited.release()
        assert _gone(grandchild)
    limited.release()  # idempotent


@_on_root
def test_release_kills_the_process_and_what_left_its_tree_and_removes_its_group(limiter: Limiter) -> None:
    limited = limiter.start("kernel-1")
    assert limited.group is not None and limiter.parent is not None
    with _running(limited.argv([sys.executable, "-c", ESCAPE])) as process:
        grandchild = int(_ready(process).split()[0])
        assert os.getsid(grandchild) != os.getsid(process.pid), "the grandchild is in another session"
        stat = Path(f"/proc/{grandchild}/stat").read_text()
        assert int(stat[stat.rfind(")") + 2 :].split()[1]) != process.pid, "and another parent"

        limited.release()

        assert process.wait(timeout=30) == -signal.SIGKILL
        assert _gone(grandchild)
    assert not any(os.path.exists(d) for d in limited.group.directories())
    assert all(os.path.isdir(d) for d in limiter.parent.directories()), "the parent stays for other kernels"


@_on_root
def test_a_restarted_process_keeps_its_group(limiter: Limiter) -> None:
    first = limiter.start("kernel-1")
    again = limiter.start("kernel-1")

    assert first.group == again.group
    assert again.group is not None and all(os.path.isdir(d) for d in again.group.directories())


@_on_root
def test_a_limiter_from_json_starts_processes_in_the_same_parent(limiter: Limiter) -> None:
    copy = Limiter.from_json(json.loads(json.dumps(limiter.as_json())))
    limited = copy.start("kernel-2")
    assert limited.group is not None and limiter.parent is not None

    with _running(
        limited.argv([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"])
    ) as process:
        _ready(process)
        assert process.pid in limiter.parent.pids()
    limited.release()


@_on_root
def test_close_kills_everything_under_the_parent_and_removes_it(limiter: Limiter) -> None:
    limited = limiter.start("kernel-1")
    assert limiter.parent is not None
    with _running(limited.argv([sys.executable, "-c", ESCAPE])) as process:
        grandchild = int(_ready(process).split()[0])

        limiter.close()

        assert process.wait(timeout=30) == -signal.SIGKILL
        assert _gone(grandchild)
    assert not any(os.path.exists(d) for d in limiter.parent.directories())
    limiter.close()  # idempotent


@_on_root
def test_a_group_left_by_a_dead_host_is_removed_with_its_processes_by_the_next_open() -> None:
    base = cgroup_support().base
    assert base is not None
    abandoned = base.child(f"ipybox-{_dead_pid()}-deadbeef")
    abandoned.create()
    kernel = abandoned.child("kernel-1")
    kernel.create()
    with _running(
        limited_argv(
            [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
            join=kernel.procs_files(),
        )
    ) as orphan:
        _ready(orphan)

        limiter = Limiter.open(ResourceLimits(memory="256MiB"), sandboxed=False)
        assert limiter is not None
        try:
            assert orphan.wait(timeout=30) == -signal.SIGKILL
            assert not any(os.path.exists(d) for d in abandoned.directories())
        finally:
            limiter.close()
            abandoned.remove()


@_on_root
def test_a_group_of_a_live_host_is_left_alone_by_the_next_open() -> None:
    base = cgroup_support().base
    assert base is not None
    with _running(["sleep", "600"]) as host:
        alive = base.child(f"ipybox-{host.pid}-cafe0000")
        alive.create()
        try:
            limiter = Limiter.open(ResourceLimits(memory="256MiB"), sandboxed=False)
            assert limiter is not None
            limiter.close()
            assert all(os.path.isdir(d) for d in alive.directories())
        finally:
            alive.remove()


@_on_root
def test_open_files_alone_need_no_group_even_where_one_could_be_made() -> None:
    limiter = Limiter.open(ResourceLimits(open_files=64), sandboxed=False)

    assert limiter is not None and limiter.mechanism != "rlimit"
    assert limiter.parent is None
    assert limiter.start("kernel").group is None
