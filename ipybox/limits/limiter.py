"""`Limiter`: one set of limits for the processes started under it (a gateway's kernels, a tool server's
stdio servers), and `Limited`, one such process.

Lifecycle: the host opens a `Limiter` (checks that every limit can be enforced, makes the parent group
`ipybox-<pid>-<random>` under its own) before it starts the gateway or server, hands it over as JSON where
another process starts the limited processes, and closes it after they stopped (whatever is left in the
groups is killed, the groups removed). Groups left by a host that was killed are removed by the next
`Limiter.open` (their name carries the dead host's pid).

Per process: `start(name)` makes its group (`cgroup*`) and gives the command line that joins it and sets
the rlimits (`Limited.argv`); `report(pid)` says what it uses against what it may; `release()` kills what
is left of it and removes its group.

Stdlib only but for `ResourceLimits`' model (the gateway process imports it anyway).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipybox.limits.cgroups import Cgroup
from ipybox.limits.disk import apply_quota
from ipybox.limits.enforcement import (
    Enforcement,
    LimitUnavailableError,
    Mechanism,
    check_limits,
    detect_enforcement,
)
from ipybox.limits.seccomp import filter_path
from ipybox.limits.spec import ResourceLimits, format_bytes
from ipybox.limits.usage import Usage, tree_usage, user_tasks
from ipybox.limits.wrapper import SECCOMP_FD, limited_argv

_PREFIX = "ipybox-"
NPROC_PER_USER_NAMESPACE = sys.platform.startswith("linux")
"""Whether a sandbox (bubblewrap's user namespace) has its own RLIMIT_NPROC count; macOS's has not."""


@dataclass(frozen=True)
class Limiter:
    """Limits for the processes started under it.

    Attributes:
        limits: What each process may use (`tmp` is the sandbox's business: see `sandbox_tmp_size`).
        mechanism: How they are enforced.
        parent: The group each process's group is made under (`cgroup*` mechanisms).
    """

    limits: ResourceLimits
    mechanism: Mechanism
    parent: Cgroup | None = None

    @classmethod
    def open(
        cls,
        limits: ResourceLimits,
        *,
        sandboxed: bool,
        private_tmp: bool = True,
        source: str = "limits",
        enforcement: Enforcement | None = None,
        workspace: Path | None = None,
    ) -> Limiter | None:
        """Check `limits` against the machine, set the workspace's disk quota (`disk`) and make the parent
        group. `None` when no limit is set.

        Args:
            workspace: The directory tree `disk` bounds (the kernels' working directory; `None`: none).

        Raises:
            LimitUnavailableError: A limit can't be enforced here (nothing was made), or the filesystem
                refused the disk quota.
            OSError: The parent group could not be made.
        """
        if not limits.any:
            return None
        enforcement = enforcement or detect_enforcement(limits.enforce)
        check_limits(
            limits,
            enforcement,
            sandboxed=sandboxed,
            private_tmp=private_tmp,
            source=source,
            workspace=workspace,
        )
        if limits.disk is not None:
            assert workspace is not None  # check_limits refuses `disk` without one
            try:
                apply_quota(workspace, limits.disk)
            except OSError as e:
                raise LimitUnavailableError(
                    f"{source} asks for disk {format_bytes(limits.disk)}, but setting the workspace's project "
                    f'quota failed: {e}. Lift it (disk = "unlimited" in {source}), or see `ipybox doctor`'
                ) from e
        parent = None
        if enforcement.cgroup is not None and (limits.memory, limits.cpus, limits.processes) != (None,) * 3:
            _remove_abandoned(enforcement.cgroup)
            parent = enforcement.cgroup.child(f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
            parent.create()
        return cls(limits, enforcement.mechanism, parent)

    def close(self) -> None:
        """Kill what is left under the parent group and remove it. Idempotent; never raises."""
        if self.parent is not None:
            self.parent.remove()

    def start(self, name: str) -> Limited:
        """Make the group of one process (`name`: unique under this limiter, e.g. a kernel id).

        Raises:
            OSError: The system refused to make the group or set a limit.
        """
        group = None
        if self.parent is not None:
            group = self.parent.child(name)
            with contextlib.suppress(FileExistsError):  # a restarted kernel keeps its group
                group.create()
            group.apply(memory=self.limits.memory, cpus=self.limits.cpus, processes=self.limits.processes)
        return Limited(self, group)

    def sandbox_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv`, the command a sandbox runs in its own user namespace, under the limits that are best set
        there: `setrlimit`'s process limit.

        RLIMIT_NPROC counts a user's tasks per user namespace (Linux >= 5.14): set inside the sandbox, it
        bounds the sandbox's own processes and threads, exactly, whatever else the user runs; set outside,
        it could only bound the user's total, from a count taken at start that goes stale as the user's
        other processes come and go. Set after bubblewrap made the namespace, but before the command runs:
        nothing the command forks escapes it, and without CAP_SYS_RESOURCE (which a sandbox drops) it
        can't be raised again. Pair with `Limited.argv(..., sandboxed=True)`.
        """
        if self.mechanism == "rlimit" and self.limits.processes is not None and NPROC_PER_USER_NAMESPACE:
            return limited_argv(argv, processes=self.limits.processes)
        return list(argv)

    def as_json(self) -> dict[str, Any]:
        return {
            "limits": self.limits.model_dump(mode="json"),
            "mechanism": self.mechanism,
            "parent": self.parent.as_json() if self.parent is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Limiter:
        parent = Cgroup.from_json(data["parent"]) if data.get("parent") else None
        return cls(ResourceLimits.model_validate(data["limits"]), data["mechanism"], parent)


@dataclass(frozen=True)
class Limited:
    """One limited process (with everything it starts)."""

    limiter: Limiter
    group: Cgroup | None

    def argv(self, argv: Sequence[str], *, sandboxed: bool = False) -> list[str]:
        """The command line that starts `argv` inside its limits (see [wrapper][ipybox.limits.wrapper]).

        `sandboxed`: `argv` starts a sandbox with its own user namespace whose command line came from
        [`sandbox_argv`][ipybox.limits.limiter.Limiter.sandbox_argv]; the process limit is set there.
        Under `setrlimit` with a memory limit, `argv` must be bubblewrap's: it is given the seccomp filter
        of [seccomp][ipybox.limits.seccomp] to install (`--add-seccomp-fd`).

        Raises:
            ValueError: A memory limit under `setrlimit` for a command that is not bubblewrap.
            SeccompUnavailableError: The filter can't be built (`Limiter.open` checked it can).
        """
        limits = self.limiter.limits
        rlimit = self.limiter.mechanism == "rlimit"
        processes = None
        if rlimit and limits.processes is not None and not (sandboxed and NPROC_PER_USER_NAMESPACE):
            # RLIMIT_NPROC counts every process and thread of the user: what the user runs already is not
            # this process's to spend.
            processes = user_tasks() + limits.processes
        seccomp = None
        if rlimit and limits.memory is not None:
            # RLIMIT_AS does not count memory kept unmapped: refuse the calls that could (see seccomp).
            if not sandboxed or os.path.basename(argv[0]) != "bwrap":
                raise ValueError(f"a memory limit under setrlimit needs bubblewrap to start {argv[0]!r}")
            seccomp = filter_path()
            argv = [argv[0], "--add-seccomp-fd", str(SECCOMP_FD), *argv[1:]]
        return limited_argv(
            argv,
            join=self.group.procs_files() if self.group is not None else (),
            open_files=limits.open_files,
            processes=processes,
            address_space=limits.memory if rlimit else None,
            file_size=limits.file_size,
            seccomp=seccomp,
        )

    def usage(self, pid: int | None) -> Usage:
        """What it uses: its group's counters, or its process tree's (`pid`) without a group."""
        if self.group is not None:
            return self.group.usage()
        return tree_usage(pid) if pid is not None else Usage()

    def report(self, pid: int | None) -> dict[str, Any]:
        """`{"mechanism", "limits", "usage"}`: what the gateway tells about a kernel (`ipybox status`, the
        error of a kernel that exceeded its memory)."""
        return {
            "mechanism": self.limiter.mechanism,
            "limits": self.limiter.limits.set_limits(),
            "usage": self.usage(pid).as_json(),
        }

    def release(self) -> None:
        """Kill what is left of it and remove its group. Never raises."""
        if self.group is not None:
            self.group.remove()


def _remove_abandoned(base: Cgroup) -> None:
    """Remove the groups of limiters whose host died without closing them."""
    # Every hierarchy's directory: under cgroup v1 they need not be alike (the memory group of a session,
    # the others at their roots), and a group may be left in some of them only.
    names: set[str] = set()
    for directory in base.directories():
        with contextlib.suppress(OSError):
            names.update(entry for entry in os.listdir(directory) if entry.startswith(_PREFIX))
    for name in sorted(names):
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            base.child(name).remove(timeout=0.5)
