"""Control groups: `cgroup_support` reads `/proc/self/mountinfo`, `/proc/self/cgroup` and the group's files,
so hand-written texts and a directory standing for `/` (`sys_root`) give each layout: cgroup v2 delegated,
v2 without controllers (hybrid, as on this machine), v1 writable or not, namespaced mount roots. `Cgroup`
only writes and reads files, so a v2 group is a directory of plain files here; the v2 kernel's refusal to
enable controllers in a group that holds processes (EBUSY) is played by a small stand-in for the kernel's
`cgroup.procs`/`cgroup.subtree_control` rules, since no plain file can answer EBUSY.

The real thing (cgroup v1 as root, `@root_only`): create, apply, join, usage, OOM kill, kill, remove."""

from __future__ import annotations

import errno
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipybox.limits import cgroups
from ipybox.limits.cgroups import Cgroup, cgroup_support
from ipybox.limits.usage import Usage
from ipybox.limits.wrapper import limited_argv

ROOT = os.geteuid() == 0
MiB = 1024**2

V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
SCOPE = "/user.slice/user-1000.slice/user@1000.service/app.slice/ipybox.scope"
HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_SELF = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
"""


def _files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _dirs(root: Path, *names: str) -> None:
    for name in names:
        (root / name.lstrip("/")).mkdir(parents=True, exist_ok=True)


# -- cgroup_support: which layout, from the texts ----------------------------------------------------------


def test_a_delegated_v2_group_with_the_controllers_is_where_groups_are_made(tmp_path: Path) -> None:
    own = f"/sys/fs/cgroup{SCOPE}"
    _files(
        tmp_path,
        {f"{own}/cgroup.controllers": "cpuset cpu io memory pids\n", f"{own}/cgroup.subtree_control": ""},
    )

    support = cgroup_support(V2_MOUNT, f"0::{SCOPE}\n", sys_root=str(tmp_path))

    assert support.base == Cgroup(2, {"": f"{tmp_path}{own}"})
    assert support.problems == ()


def test_v2_without_controllers_falls_back_to_v1_and_says_why(tmp_path: Path) -> None:
    _files(
        tmp_path,
        {
            "/sys/fs/cgroup/unified/cgroup.controllers": "",
            "/sys/fs/cgroup/unified/cgroup.subtree_control": "",
        },
    )
    _dirs(
        tmp_path,
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/cpuacct",
        "/sys/fs/cgroup/memory/process_api/abc",
        "/sys/fs/cgroup/pids",
    )

    support = cgroup_support(HYBRID_MOUNTS, HYBRID_SELF, sys_root=str(tmp_path))

    fs = f"{tmp_path}/sys/fs/cgroup"
    assert support.base == Cgroup(
        1,
        {
            "memory": f"{fs}/memory/process_api/abc",
            "pids": f"{fs}/pids",
            "cpu": f"{fs}/cpu",
            "cpuacct": f"{fs}/cpuacct",
        },
    )
    assert support.problems == (
        f"cgroup v2: {fs}/unified has no memory, pids, cpu controllers (they are bound to cgroup v1)",
    )


def test_v2_missing_one_controller_names_it_and_is_not_used(tmp_path: Path) -> None:
    own = f"/sys/fs/cgroup{SCOPE}"
    _files(tmp_path, {f"{own}/cgroup.controllers": "cpu memory\n", f"{own}/cgroup.subtree_control": ""})

    support = cgroup_support(V2_MOUNT, f"0::{SCOPE}\n", sys_root=str(tmp_path))

    assert support.base is None
    assert support.problems[0] == f"cgroup v2: {tmp_path}{own} has no pids controller"
    assert support.problems[1] == "cgroup v1: no memory, pids, cpu hierarchy mounted"


def test_v2_that_is_not_delegated_says_how_to_get_a_delegated_scope(tmp_path: Path) -> None:
    own = f"/sys/fs/cgroup{SCOPE}"
    # No writable cgroup.subtree_control (a plain file can't be unwritable for root: this one is absent).
    _files(tmp_path, {f"{own}/cgroup.controllers": "cpu memory pids\n"})

    support = cgroup_support(V2_MOUNT, f"0::{SCOPE}\n", sys_root=str(tmp_path))

    assert support.base is None
    assert support.problems[0].startswith(f"cgroup v2: {tmp_path}{own} is not delegated to this user")
    assert "Delegate=yes" in support.problems[0]


def test_an_unreadable_v2_group_is_named(tmp_path: Path) -> None:
    support = cgroup_support(V2_MOUNT, "0::/gone\n", sys_root=str(tmp_path))

    assert support.base is None
    assert support.problems[0].startswith(f"cgroup v2: cannot read {tmp_path}/sys/fs/cgroup/gone:")


def test_no_cgroup_mounts_at_all_gives_no_base_and_both_reasons(tmp_path: Path) -> None:
    support = cgroup_support("22 1 0:21 / /proc rw - proc proc rw\n", "", sys_root=str(tmp_path))

    assert support.base is None
    assert support.problems == ("cgroup v2: not mounted", "cgroup v1: no memory, pids, cpu hierarchy mounted")


@pytest.mark.user_dependent  # the unprivileged pass runs it again: see tests/sandbox/test_unprivileged.py
def test_unwritable_v1_hierarchies_give_no_base_and_a_problem_naming_them(tmp_path: Path) -> None:
    # The v1 directories do not exist: unwritable for root as for anyone (a mode can't stop root).
    fs = f"{tmp_path}/sys/fs/cgroup"

    support = cgroup_support(HYBRID_MOUNTS, HYBRID_SELF.replace("0::/\n", ""), sys_root=str(tmp_path))

    assert support.base is None
    assert support.problems[0] == "cgroup v2: not mounted"
    problem = support.problems[1]
    assert problem.startswith(f"cgroup v1: {fs}/memory/process_api/abc, {fs}/pids, {fs}/cpu ")
    if ROOT:
        assert problem.endswith("read-only here (a container's cgroup mount?)")
    else:
        assert problem.endswith(
            "not writable by this user (cgroup v1 needs root, or the directories given to this user)"
        )


def test_v1_without_a_pids_hierarchy_names_the_missing_one(tmp_path: Path) -> None:
    mounts = "\n".join(line for line in HYBRID_MOUNTS.splitlines() if "pids" not in line)

    support = cgroup_support(mounts, HYBRID_SELF, sys_root=str(tmp_path))

    assert support.base is None
    assert support.problems[-1] == "cgroup v1: no pids hierarchy mounted"


def test_v1_controllers_mounted_together_share_one_directory(tmp_path: Path) -> None:
    mounts = """\
25 24 0:22 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
26 24 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
27 24 0:24 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
not a mountinfo line
"""
    own = "3:cpu,cpuacct:/user.slice\n2:memory:/user.slice\n1:pids:/user.slice/user-0.slice\n"
    fs = f"{tmp_path}/sys/fs/cgroup"
    _dirs(tmp_path, "/sys/fs/cgroup/cpu,cpuacct/user.slice", "/sys/fs/cgroup/memory/user.slice")
    _dirs(tmp_path, "/sys/fs/cgroup/pids/user.slice/user-0.slice")

    support = cgroup_support(mounts, own, sys_root=str(tmp_path))

    assert support.base is not None
    assert support.base.dirs["cpu"] == support.base.dirs["cpuacct"] == f"{fs}/cpu,cpuacct/user.slice"
    assert support.base.directories() == [
        f"{fs}/memory/user.slice",
        f"{fs}/pids/user.slice/user-0.slice",
        f"{fs}/cpu,cpuacct/user.slice",
    ]


def test_a_namespaced_mount_root_is_taken_off_the_own_path(tmp_path: Path) -> None:
    mounts = "30 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    _files(
        tmp_path,
        {
            "/sys/fs/cgroup/sub/cgroup.controllers": "memory pids cpu",
            "/sys/fs/cgroup/sub/cgroup.subtree_control": "",
        },
    )

    support = cgroup_support(mounts, "0::/docker/abc/sub\n", sys_root=str(tmp_path))

    assert support.base == Cgroup(2, {"": f"{tmp_path}/sys/fs/cgroup/sub"})


def test_an_escaped_mount_point_is_unescaped(tmp_path: Path) -> None:
    mounts = "30 23 0:26 / /cgroup\\040v2 rw - cgroup2 cgroup2 rw\n"
    _files(
        tmp_path,
        {"/cgroup v2/cgroup.controllers": "memory pids cpu", "/cgroup v2/cgroup.subtree_control": ""},
    )

    support = cgroup_support(mounts, "0::/\n", sys_root=str(tmp_path))

    assert support.base == Cgroup(2, {"": f"{tmp_path}/cgroup v2"})


@pytest.mark.parametrize(
    ("root", "path", "directory"),
    [
        ("/", "/", "/sys/fs/cgroup"),
        ("/", "/a/b", "/sys/fs/cgroup/a/b"),
        ("/docker/abc", "/docker/abc", "/sys/fs/cgroup"),
        ("/docker/abc", "/docker/abc/x/y", "/sys/fs/cgroup/x/y"),
        ("/docker/abc", "/docker/abcdef", "/sys/fs/cgroup/docker/abcdef"),
        ("/docker/abc", "/x", "/sys/fs/cgroup/x"),
    ],
)
def test_join_makes_the_own_path_relative_to_a_namespaced_root_only_at_a_path_boundary(
    root: str, path: str, directory: str
) -> None:
    assert cgroups._join("/sys/fs/cgroup", root, path) == directory


@pytest.mark.user_dependent  # the unprivileged pass runs it again: see tests/sandbox/test_unprivileged.py
def test_this_machine_offers_a_group_to_root_and_no_v1_group_to_other_users() -> None:
    support = cgroup_support()

    if ROOT:
        assert support.base is not None, support.problems
    else:
        assert support.base is None or support.base.version == 2, "v1 hierarchies are root's"
        if support.base is None:
            assert any("not writable by this user" in p or "no " in p for p in support.problems)


# -- Cgroup on a plain-file v2 tree ------------------------------------------------------------------------


@pytest.fixture
def v2(tmp_path: Path) -> Cgroup:
    """A v2 parent group: the files the kernel would give it."""
    _files(tmp_path, {"parent/cgroup.subtree_control": "", "parent/cgroup.procs": ""})
    return Cgroup(2, {"": str(tmp_path / "parent")})


V2_CONTROL_FILES = (
    "memory.max",
    "memory.swap.max",
    "pids.max",
    "cpu.max",
    "cgroup.procs",
    "cgroup.kill",
    "cgroup.subtree_control",
)


def _v2_child(parent: Cgroup, name: str = "kernel", files: tuple[str, ...] = V2_CONTROL_FILES) -> Cgroup:
    child = parent.child(name)
    child.create()
    _files(Path(child.dirs[""]), {f: "max\n" if f.endswith("max") else "" for f in files})
    return child


@pytest.mark.parametrize("name", ["", "a/b", ".", ".."])
def test_a_child_name_that_is_not_one_directory_is_refused(v2: Cgroup, name: str) -> None:
    with pytest.raises(ValueError, match="not a cgroup name"):
        v2.child(name)


def test_a_group_round_trips_through_json() -> None:
    group = Cgroup(1, {"memory": "/m/g", "cpu": "/c/g", "cpuacct": "/c/g"})

    assert Cgroup.from_json(group.as_json()) == group
    assert group.procs_files() == ["/m/g/cgroup.procs", "/c/g/cgroup.procs"]


def test_creating_a_v2_group_enables_the_controllers_in_its_parent(v2: Cgroup) -> None:
    child = v2.child("kernel")

    child.create()

    assert Path(child.dirs[""]).is_dir()
    assert (Path(v2.dirs[""]) / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_controllers_already_enabled_are_not_written_again(v2: Cgroup) -> None:
    control = Path(v2.dirs[""]) / "cgroup.subtree_control"
    control.write_text("cpu io memory pids\n")

    v2.child("kernel").create()

    assert control.read_text() == "cpu io memory pids\n"


def test_creating_a_group_whose_parent_is_missing_raises(v2: Cgroup) -> None:
    with pytest.raises(OSError):
        v2.child("missing").child("kernel").create()


def test_a_v2_group_gets_memory_without_swap_pids_and_a_cpu_quota(v2: Cgroup) -> None:
    child = _v2_child(v2)

    child.apply(memory=256 * MiB, cpus=1.5, processes=64)

    directory = Path(child.dirs[""])
    assert (directory / "memory.max").read_text() == str(256 * MiB)
    assert (directory / "memory.swap.max").read_text() == "0"
    assert (directory / "pids.max").read_text() == "64"
    assert (directory / "cpu.max").read_text() == "150000 100000"


def test_a_tiny_cpu_share_is_raised_to_the_kernels_minimum_quota(v2: Cgroup) -> None:
    child = _v2_child(v2)

    child.apply(cpus=0.001)

    assert (Path(child.dirs[""]) / "cpu.max").read_text() == "1000 100000"


def test_limits_not_asked_for_are_left_alone(v2: Cgroup) -> None:
    child = _v2_child(v2)

    child.apply(processes=8)

    directory = Path(child.dirs[""])
    assert (directory / "memory.max").read_text() == "max\n"
    assert (directory / "cpu.max").read_text() == "max\n"


def test_without_swap_accounting_the_memory_limit_is_set_and_no_swap_file_is_made(v2: Cgroup) -> None:
    child = _v2_child(v2, files=("memory.max", "pids.max", "cpu.max"))

    child.apply(memory=256 * MiB)

    directory = Path(child.dirs[""])
    assert (directory / "memory.max").read_text() == str(256 * MiB)
    assert not (directory / "memory.swap.max").exists()


def test_a_limit_file_the_group_lacks_is_an_error_not_a_new_file(v2: Cgroup) -> None:
    child = _v2_child(v2, files=("memory.max",))

    with pytest.raises(FileNotFoundError):
        child.apply(processes=8)
    assert not (Path(child.dirs[""]) / "pids.max").exists()


def test_v2_usage_reads_memory_peak_events_cpu_and_pids(v2: Cgroup) -> None:
    child = _v2_child(v2)
    _files(
        Path(child.dirs[""]),
        {
            "memory.current": "123456\n",
            "memory.peak": "654321\n",
            "memory.events": "low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n",
            "cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
            "pids.current": "7\n",
        },
    )

    assert child.usage() == Usage(
        memory=123456, memory_peak=654321, cpu_seconds=2.5, processes=7, oom_kills=2
    )


def test_v2_usage_of_a_kernel_without_peak_or_counters_is_unknown_not_zero(v2: Cgroup) -> None:
    child = _v2_child(v2)  # no memory.current, memory.peak (Linux < 5.19), cpu.stat, ...

    assert child.usage() == Usage(
        memory=None, memory_peak=None, cpu_seconds=None, processes=None, oom_kills=0
    )


def test_v1_usage_reads_each_controllers_directory(tmp_path: Path) -> None:
    _files(
        tmp_path,
        {
            "memory/g/memory.usage_in_bytes": "1000\n",
            "memory/g/memory.max_usage_in_bytes": "2000\n",
            "memory/g/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
            "cpuacct/g/cpuacct.usage": "1500000000\n",
            "pids/g/pids.current": "4\n",
        },
    )
    group = Cgroup(1, {c: str(tmp_path / c / "g") for c in ("memory", "pids", "cpu", "cpuacct")})

    assert group.usage() == Usage(memory=1000, memory_peak=2000, cpu_seconds=1.5, processes=4, oom_kills=3)


def test_pids_are_those_of_the_group_and_every_group_under_it(v2: Cgroup) -> None:
    child = _v2_child(v2)
    grandchild = _v2_child(child, "inner")
    Path(child.procs_files()[0]).write_text("10\n11\n")
    Path(grandchild.procs_files()[0]).write_text("12\n")

    assert child.pids() == {10, 11, 12}
    assert grandchild.pids() == {12}


def test_killing_an_empty_v2_group_asks_the_kernel_to_kill_and_reports_it_empty(v2: Cgroup) -> None:
    child = _v2_child(v2)

    assert child.kill() is True
    assert (Path(child.dirs[""]) / "cgroup.kill").read_text() == "1"


class _V2Kernel:
    """Stands in for the v2 kernel's rules on plain files: a pid written to a `cgroup.procs` leaves the
    other groups' files (it is in one group); `cgroup.subtree_control` can't be written (EBUSY) while the
    group itself holds processes; a pid that is not running can't be moved (ESRCH)."""

    def __init__(self, root: Path, running: set[str]) -> None:
        self.root = root
        self.running = running
        self.writes: list[tuple[str, str]] = []
        self.real_write = cgroups._write

    def write(self, directory: str, name: str, value: str) -> None:
        path = Path(directory) / name
        self.writes.append((str(path.relative_to(self.root)), value))
        if name == "cgroup.subtree_control" and (Path(directory) / "cgroup.procs").read_text().split():
            raise OSError(errno.EBUSY, "Device or resource busy")
        if name == "cgroup.procs":
            for procs in self.root.rglob("cgroup.procs"):
                procs.write_text("".join(f"{p}\n" for p in procs.read_text().split() if p != value))
            if value not in self.running:
                raise ProcessLookupError(errno.ESRCH, "No such process")
            path.touch()
            path.write_text(path.read_text() + f"{value}\n")
            return
        self.real_write(directory, name, value)


def test_v2_moves_the_parents_own_processes_to_a_leaf_when_the_kernel_refuses_controllers(
    v2: Cgroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = Path(v2.dirs[""])
    (parent / "cgroup.procs").write_text("100\n101\n102\n")
    kernel = _V2Kernel(tmp_path, running={"100", "102"})  # 101 ended meanwhile
    monkeypatch.setattr(cgroups, "_write", kernel.write)

    v2.child("kernel").create()

    assert kernel.writes == [
        ("parent/cgroup.subtree_control", "+memory +pids +cpu"),
        ("parent/ipybox-host/cgroup.procs", "100"),
        ("parent/ipybox-host/cgroup.procs", "101"),
        ("parent/ipybox-host/cgroup.procs", "102"),
        ("parent/cgroup.subtree_control", "+memory +pids +cpu"),
    ]
    assert (parent / "ipybox-host" / "cgroup.procs").read_text().split() == ["100", "102"]
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (parent / "kernel").is_dir()


def test_v2_controllers_refused_for_another_reason_are_an_error_and_nothing_is_moved(
    v2: Cgroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(directory: str, name: str, value: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cgroups, "_write", refuse)

    with pytest.raises(PermissionError):
        v2.child("kernel").create()
    assert not (Path(v2.dirs[""]) / "ipybox-host").exists()
    assert not (Path(v2.dirs[""]) / "kernel").exists()


# -- the real cgroup filesystem ----------------------------------------------------------------------------


def _cgroupfs_mount() -> str:
    mounts = cgroups._cgroup_mounts(Path("/proc/self/mountinfo").read_text(), "")
    assert mounts, "this machine mounts cgroups"
    return mounts[0][1]


@pytest.mark.integration
def test_writing_a_control_file_the_kernel_lacks_raises_file_not_found_and_creates_nothing() -> None:
    # What the suppressions of memory.swap.max and memory.memsw.limit_in_bytes count on: opening the file
    # for writing with O_CREAT answers EACCES on cgroupfs instead.
    directory = _cgroupfs_mount()

    with pytest.raises(FileNotFoundError):
        cgroups._write(directory, "memory.swap.max", "0")
    assert not os.path.exists(os.path.join(directory, "memory.swap.max"))


@pytest.fixture
def real_group() -> Iterator[Cgroup]:
    """A v1 group under this process's own (named like a limiter's, so a run killed midway is cleaned up by
    the next `Limiter.open`)."""
    base = cgroup_support().base
    assert base is not None and base.version == 1, "this machine offers root cgroup v1"
    group = base.child(f"ipybox-{os.getpid()}-test{secrets.token_hex(4)}")
    try:
        yield group
    finally:
        group.remove()


ALLOCATE = "import sys; blocks = [bytearray(1024**2) for _ in range(int(sys.argv[1]))]; print('allocated')"


@pytest.mark.integration
@pytest.mark.root_only
@pytest.mark.skipif(not ROOT, reason="cgroup v1 groups are root's")
def test_a_real_v1_group_limits_counts_and_kills_its_process_and_leaves_no_directory(
    real_group: Cgroup,
) -> None:
    real_group.create()
    real_group.apply(memory=256 * MiB, cpus=0.5, processes=32)

    memory, pids, cpu = (Path(real_group.dirs[c]) for c in ("memory", "pids", "cpu"))
    assert (memory / "memory.limit_in_bytes").read_text().strip() == str(256 * MiB)
    if (memory / "memory.memsw.limit_in_bytes").exists():
        assert (memory / "memory.memsw.limit_in_bytes").read_text().strip() == str(256 * MiB)
    assert (pids / "pids.max").read_text().strip() == "32"
    assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"

    script = "import sys; data = bytearray(64 * 1024**2); print('ready', flush=True); sys.stdin.read()"
    process = subprocess.Popen(
        limited_argv([sys.executable, "-c", script], join=real_group.procs_files()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        assert real_group.pids() == {process.pid}
        own = Path(f"/proc/{process.pid}/cgroup").read_text()
        assert f"memory:/{Path(real_group.dirs['memory']).relative_to('/sys/fs/cgroup/memory')}" in own

        usage = real_group.usage()
        assert usage.memory is not None and usage.memory >= 64 * MiB
        assert usage.memory_peak is not None and usage.memory_peak >= usage.memory
        assert usage.processes == 1
        assert usage.cpu_seconds is not None and usage.cpu_seconds > 0
        assert usage.oom_kills == 0

        assert real_group.kill() is True
        assert process.wait(timeout=30) == -9
    finally:
        process.kill()
        process.wait()

    real_group.remove()
    assert not any(os.path.exists(d) for d in real_group.directories())


@pytest.mark.integration
@pytest.mark.root_only
@pytest.mark.skipif(not ROOT, reason="cgroup v1 groups are root's")
def test_a_process_over_the_groups_memory_is_oom_killed_and_counted(real_group: Cgroup) -> None:
    real_group.create()
    real_group.apply(memory=64 * MiB)

    done = subprocess.run(
        limited_argv([sys.executable, "-c", ALLOCATE, "256"], join=real_group.procs_files()),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == -9, done.stderr
    usage = real_group.usage()
    assert usage.oom_kills >= 1
    assert usage.memory_peak is not None and usage.memory_peak <= 64 * MiB


@pytest.mark.integration
@pytest.mark.root_only
@pytest.mark.skipif(not ROOT, reason="cgroup v1 groups are root's")
def test_removing_a_real_group_kills_what_is_in_its_subgroups_too(real_group: Cgroup) -> None:
    real_group.create()
    inner = real_group.child("inner")
    inner.create()
    script = "import sys; print('ready', flush=True); sys.stdin.read()"
    process = subprocess.Popen(
        limited_argv([sys.executable, "-c", script], join=inner.procs_files()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        assert real_group.pids() == {process.pid}

        real_group.remove()

        assert process.wait(timeout=30) == -9
        assert not any(os.path.exists(d) for d in [*real_group.directories(), *inner.directories()])
    finally:
        process.kill()
        process.wait()
