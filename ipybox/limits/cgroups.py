"""Control groups: where this process may make them, and `Cgroup`, one group of processes with limits.

ipybox makes one group per kernel gateway (or tool server) under the group it runs in, and one per
kernel (or stdio MCP server) under that; the processes join their group before they start (see
[wrapper][ipybox.limits.wrapper]) and the group is emptied and removed when they end. Everything a kernel
starts stays in its group, also what left its process tree (`setsid`, double forks): ending a kernel ends
all of it.

Two layouts, one interface:

- cgroup v2 (one hierarchy): a group is one directory. A delegated subtree (systemd's `Delegate=yes`, a
  container's private namespace) is writable by its user; controllers are enabled for children in
  `cgroup.subtree_control`, which the kernel refuses while the parent itself holds processes, so ipybox
  first moves the processes of its own group into a leaf (`ipybox-host`), as container runtimes do.
- cgroup v1 (one hierarchy per controller, e.g. `/sys/fs/cgroup/memory`): a group is one directory per
  controller; making one needs root (or a directory chowned to the user). Used when v2 has no usable
  controllers, as on machines whose controllers are all bound to v1.

Stdlib only: the kernel gateway's process uses it at every kernel start.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from ipybox.limits.usage import Usage

Version = Literal[1, 2]
CONTROLLERS = ("memory", "pids", "cpu")
"""What limits need: memory (memory), processes (pids), cpus (cpu)."""
_V1_USAGE_ONLY = ("cpuacct",)  # v1 counts CPU time in its own controller (often mounted with cpu)
_HOST_LEAF = "ipybox-host"
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupSupport:
    """Whether this process can make control groups, and where.

    Attributes:
        base: The group new groups are made under (`None`: none can be made).
        problems: Why each layout is not usable (for `ipybox doctor` and errors), v2 first.
    """

    base: Cgroup | None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cgroup:
    """One control group: a directory per controller (v1) or one directory (v2).

    Attributes:
        version: 1 or 2.
        dirs: Controller -> directory (v1; controllers mounted together share one); v2: `{"": directory}`.
    """

    version: Version
    dirs: dict[str, str] = field(default_factory=dict)

    # -- layout ---------------------------------------------------------------------------------------

    def child(self, name: str) -> Cgroup:
        """The group `name` under this one (not made yet: see `create`)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a cgroup name: {name!r}")
        return Cgroup(self.version, {c: os.path.join(d, name) for c, d in self.dirs.items()})

    def directories(self) -> list[str]:
        """Each directory once (controllers mounted together share one)."""
        return list(dict.fromkeys(self.dirs.values()))

    def procs_files(self) -> list[str]:
        """The `cgroup.procs` files a process writes its pid to, to join this group."""
        return [os.path.join(d, "cgroup.procs") for d in self.directories()]

    def as_json(self) -> dict[str, Any]:
        return {"version": self.version, "dirs": dict(self.dirs)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cgroup:
        version: Version = 2 if data["version"] == 2 else 1
        return cls(version, {str(k): str(v) for k, v in data["dirs"].items()})

    # -- life -----------------------------------------------------------------------------------------

    def create(self) -> None:
        """Make the group (its parent must exist). v2: enables the controllers for it in its parent.

        Raises:
            OSError: The system refused (no permission, a controller missing).
        """
        if self.version == 2:
            parent = os.path.dirname(self.dirs[""])
            _enable_controllers(parent)
        for directory in self.directories():
            os.mkdir(directory)
        if self.version == 1 and "memory" in self.dirs:
            # Children of a v1 memory group are charged to it only with hierarchy on (the default on
            # current kernels; set anyway where the file still exists, before any child is made).
            with contextlib.suppress(OSError):
                _write(self.dirs["memory"], "memory.use_hierarchy", "1")

    def apply(
        self, memory: int | None = None, cpus: float | None = None, processes: int | None = None
    ) -> None:
        """Set the limits that are not `None`.

        Raises:
            OSError: The system refused one.
        """
        if self.version == 2:
            directory = self.dirs[""]
            if memory is not None:
                _write(directory, "memory.max", str(memory))
                # Swap is memory too: none, or the limit would only move the excess to disk.
                with contextlib.suppress(FileNotFoundError):
                    _write(directory, "memory.swap.max", "0")
            if processes is not None:
                _write(directory, "pids.max", str(processes))
            if cpus is not None:
                _write(directory, "cpu.max", f"{max(1000, round(cpus * _CPU_PERIOD_US))} {_CPU_PERIOD_US}")
            return
        if memory is not None:
            _write(self.dirs["memory"], "memory.limit_in_bytes", str(memory))
            # memsw (memory + swap) exists only with swap accounting; it must not be below the memory limit.
            with contextlib.suppress(FileNotFoundError):
                _write(self.dirs["memory"], "memory.memsw.limit_in_bytes", str(memory))
        if processes is not None:
            _write(self.dirs["pids"], "pids.max", str(processes))
        if cpus is not None:
            _write(self.dirs["cpu"], "cpu.cfs_period_us", str(_CPU_PERIOD_US))
            _write(self.dirs["cpu"], "cpu.cfs_quota_us", str(max(1000, round(cpus * _CPU_PERIOD_US))))

    def pids(self) -> set[int]:
        """The processes in this group and the groups under it."""
        found: set[int] = set()
        for directory in self.directories():
            for root, _dirs, _files in os.walk(directory):
                with contextlib.suppress(OSError):
                    found.update(int(line) for line in _read(root, "cgroup.procs").split())
        return found

    def kill(self, timeout: float = 2.0) -> bool:
        """SIGKILL every process in the group (and under it) until none is left, also ones forked meanwhile.

        Returns:
            Whether the group is empty.
        """
        if self.version == 2:
            with contextlib.suppress(OSError):
                _write(self.dirs[""], "cgroup.kill", "1")  # Linux 5.14: the kernel kills them, forks included
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def remove(self, timeout: float = 2.0) -> None:
        """Kill what is left in the group and remove it with the groups under it. Never raises: a group that
        cannot be removed (its processes would not die) is left, and the next `ipybox up` tries again."""
        self.kill(timeout)
        deadline = time.monotonic() + timeout
        for directory in self.directories():
            for root, _dirs, _files in sorted(os.walk(directory), key=lambda w: -len(w[0])):
                while True:
                    try:
                        os.rmdir(root)
                        break
                    except FileNotFoundError:
                        break
                    except OSError as e:
                        # EBUSY: a killed process has not left yet.
                        if e.errno != errno.EBUSY or time.monotonic() > deadline:
                            break
                        time.sleep(0.005)

    # -- reading --------------------------------------------------------------------------------------

    def usage(self) -> Usage:
        """What the group uses (and has used at most)."""
        if self.version == 2:
            d = self.dirs[""]
            events = _keyed(d, "memory.events")
            cpu = _keyed(d, "cpu.stat").get("usage_usec")
            return Usage(
                memory=_int(d, "memory.current"),
                memory_peak=_int(d, "memory.peak"),
                cpu_seconds=cpu / 1e6 if cpu is not None else None,
                processes=_int(d, "pids.current"),
                oom_kills=events.get("oom_kill", 0),
            )
        memory = self.dirs.get("memory")
        cpuacct = self.dirs.get("cpuacct")
        pids = self.dirs.get("pids")
        cpu_ns = _int(cpuacct, "cpuacct.usage") if cpuacct else None
        return Usage(
            memory=_int(memory, "memory.usage_in_bytes") if memory else None,
            memory_peak=_int(memory, "memory.max_usage_in_bytes") if memory else None,
            cpu_seconds=cpu_ns / 1e9 if cpu_ns is not None else None,
            processes=_int(pids, "pids.current") if pids else None,
            oom_kills=(_keyed(memory, "memory.oom_control").get("oom_kill", 0) if memory else 0),
        )


def cgroup_support(
    mountinfo: str | None = None, self_cgroup: str | None = None, *, sys_root: str = ""
) -> CgroupSupport:
    """Where this process can make groups with the memory, pids and cpu controllers: cgroup v2 first, then
    v1. The arguments are for tests (the contents of `/proc/self/mountinfo` and `/proc/self/cgroup`, a
    directory standing for `/`)."""
    try:
        mountinfo = _read("/proc/self", "mountinfo") if mountinfo is None else mountinfo
        self_cgroup = _read("/proc/self", "cgroup") if self_cgroup is None else self_cgroup
    except OSError:
        return CgroupSupport(None, ("no /proc/self/cgroup: this system has no control groups",))
    mounts = _cgroup_mounts(mountinfo, sys_root)
    paths = _own_paths(self_cgroup)
    problems: list[str] = []
    v2 = _v2_base(mounts, paths, problems)
    if v2 is not None:
        return CgroupSupport(v2, tuple(problems))
    v1 = _v1_base(mounts, paths, problems)
    return CgroupSupport(v1, tuple(problems))


def _v2_base(
    mounts: list[tuple[str, str, set[str]]], paths: dict[str, str], problems: list[str]
) -> Cgroup | None:
    unified = [(root, point) for root, point, controllers in mounts if controllers == {"<v2>"}]
    if not unified or "" not in paths:
        problems.append("cgroup v2: not mounted")
        return None
    root, point = unified[0]
    own = paths[""]
    if os.path.basename(own) == _HOST_LEAF:
        # This process was moved into the leaf by an earlier limiter (see `_enable_controllers`): groups go
        # beside it, not under it.
        own = os.path.dirname(own)
    directory = _join(point, root, own)
    try:
        available = set(_read(directory, "cgroup.controllers").split())
    except OSError as e:
        problems.append(f"cgroup v2: cannot read {directory}: {e.strerror}")
        return None
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        problems.append(
            f"cgroup v2: {directory} has no {', '.join(missing)} controller"
            + ("s" if len(missing) > 1 else "")
            + (" (they are bound to cgroup v1)" if len(missing) == len(CONTROLLERS) else "")
        )
        return None
    if not (
        os.access(directory, os.W_OK)
        and os.access(os.path.join(directory, "cgroup.subtree_control"), os.W_OK)
    ):
        problems.append(
            f"cgroup v2: {directory} is not delegated to this user (run ipybox in a delegated scope, e.g. "
            "`systemd-run --user --scope -p Delegate=yes ipybox up`)"
        )
        return None
    return Cgroup(2, {"": directory})


def _v1_base(
    mounts: list[tuple[str, str, set[str]]], paths: dict[str, str], problems: list[str]
) -> Cgroup | None:
    dirs: dict[str, str] = {}
    for controller in (*CONTROLLERS, *_V1_USAGE_ONLY):
        for root, point, controllers in mounts:
            if controller in controllers:
                own = next((p for names, p in paths.items() if controller in names.split(",")), "/")
                dirs[controller] = _join(point, root, own)
                break
    missing = [c for c in CONTROLLERS if c not in dirs]
    if missing:
        problems.append(f"cgroup v1: no {', '.join(missing)} hierarchy mounted")
        return None
    unwritable = [dirs[c] for c in CONTROLLERS if not os.access(dirs[c], os.W_OK)]
    if unwritable:
        why = (
            "read-only here (a container's cgroup mount?)"
            if os.geteuid() == 0
            else "not writable by this user (cgroup v1 needs root, or the directories given to this user)"
        )
        problems.append(f"cgroup v1: {', '.join(unwritable)} {why}")
        return None
    return Cgroup(1, dirs)


def _cgroup_mounts(mountinfo: str, sys_root: str) -> list[tuple[str, str, set[str]]]:
    """(root within the hierarchy, mount point, controllers; `{"<v2>"}` for cgroup2) of each cgroup mount."""
    mounts: list[tuple[str, str, set[str]]] = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), sys_root + _unescape(fields[4])
        if tail[0] == "cgroup2":
            mounts.append((root, point, {"<v2>"}))
        elif tail[0] == "cgroup":
            mounts.append((root, point, set(tail[2].split(","))))
    return mounts


def _own_paths(self_cgroup: str) -> dict[str, str]:
    """controllers ("" for v2) -> this process's group path, from `/proc/self/cgroup`."""
    paths: dict[str, str] = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2]
    return paths


def _join(point: str, root: str, path: str) -> str:
    # A namespaced mount shows the group it was made in as its root: the path is relative to that.
    relative = path[len(root) :] if root != "/" and (path == root or path.startswith(root + "/")) else path
    return os.path.normpath(point + "/" + relative.lstrip("/"))


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _enable_controllers(directory: str) -> None:
    """Enable memory, pids and cpu for the children of the v2 group `directory`, first moving its own
    processes into a leaf when the kernel refuses controllers on a group that holds processes."""
    wanted = " ".join(f"+{c}" for c in CONTROLLERS)
    enabled = set(_read(directory, "cgroup.subtree_control").split())
    if all(c in enabled for c in CONTROLLERS):
        return
    try:
        _write(directory, "cgroup.subtree_control", wanted)
    except OSError as e:
        if e.errno != errno.EBUSY:
            raise
        leaf = os.path.join(directory, _HOST_LEAF)
        with contextlib.suppress(FileExistsError):
            os.mkdir(leaf)
        for pid in _read(directory, "cgroup.procs").split():
            with contextlib.suppress(ProcessLookupError):
                _write(leaf, "cgroup.procs", pid)
        _write(directory, "cgroup.subtree_control", wanted)


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as f:
        return f.read()


def _write(directory: str, name: str, value: str) -> None:
    # No O_CREAT: cgroupfs answers a create of a file it lacks (no swap accounting) with EACCES, not ENOENT.
    with open(os.open(os.path.join(directory, name), os.O_WRONLY | os.O_TRUNC), "w") as f:
        f.write(value)


def _int(directory: str | None, name: str) -> int | None:
    if directory is None:
        return None
    try:
        text = _read(directory, name).strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _keyed(directory: str | None, name: str) -> dict[str, int]:
    values: dict[str, int] = {}
    if directory is None:
        return values
    try:
        for line in _read(directory, name).splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(value)
    except OSError:
        pass
    return values
