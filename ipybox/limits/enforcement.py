"""How this machine enforces limits (`Enforcement`), and the error when it can't enforce one asked for.

Mechanisms, best first (`enforce = "auto"` takes the first available):

| mechanism | memory | cpus | processes | open files |
|---|---|---|---|---|
| `cgroup2`: a delegated cgroup v2 subtree | `memory.max` (+ no swap) | `cpu.max` | `pids.max` | RLIMIT_NOFILE |
| `cgroup1`: v1 memory/pids/cpu hierarchies (root) | `memory.limit_in_bytes` | `cpu.cfs_quota_us` | `pids.max` | RLIMIT_NOFILE |
| `rlimit`: `setrlimit` in the process tree | RLIMIT_AS per process, sandboxed with a sized `/tmp` only, + seccomp | no | RLIMIT_NPROC (sandbox's or user's) | RLIMIT_NOFILE |

A control group counts every page of its processes, files in memory (tmpfs, memfd, shared memory)
included. RLIMIT_AS counts only what is mapped: memory that outlives its mapping must have nowhere to go.
So `setrlimit` takes a memory limit only for a sandboxed process with a sized private `/tmp` (its `/tmp`
and `/dev/shm` are then tmpfs of that size, `/dev` read-only) and with the seccomp filter of
[seccomp][ipybox.limits.seccomp] (no `memfd_create`, `memfd_secret`, `shmget`); an unsandboxed process
shares the host's `/dev/shm`, which nothing bounds.

`file_size` is RLIMIT_FSIZE and `/tmp` bubblewrap's `--size` on a sandboxed kernel's private tmpfs,
whatever the mechanism; `disk` a project quota on the workspace ([disk][ipybox.limits.disk]), where its
filesystem has project quotas and ipybox is root, whatever the mechanism. A limit the mechanism can't enforce is an error (`LimitUnavailableError`) that
names it, what is missing and what to do: a kernel never runs with a limit silently absent.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ipybox.errors import IpyboxError
from ipybox.limits.cgroups import Cgroup, CgroupSupport, cgroup_support
from ipybox.limits.disk import quota_unavailable
from ipybox.limits.seccomp import seccomp_unavailable
from ipybox.limits.spec import LIMIT_NAMES, Enforce, ResourceLimits, WorkspaceLimits, describe_limit

Mechanism = Literal["cgroup2", "cgroup1", "rlimit"]


RLIMIT_MEMORY_FLOOR = 1024**3
"""The least memory limit setrlimit is asked to enforce (measured: an idle kernel's address space is 0.7 GiB,
and a 512 MiB RLIMIT_AS keeps it from starting)."""


RLIMIT_DESCRIPTION = (
    "setrlimit (address space, of sandboxed processes only, with memfd and shmget refused; user's processes; "
    "open files; no CPU cap)"
)


class LimitUnavailableError(IpyboxError, RuntimeError):
    """A limit was asked for that this machine cannot enforce. The message names the limit, what is
    missing, and what to do (give ipybox a control group, or lift the limit)."""


@dataclass(frozen=True)
class Enforcement:
    """How limits are enforced here.

    Attributes:
        mechanism: See the module docstring.
        cgroup: Where groups are made (the `cgroup*` mechanisms).
        problems: Why the better mechanisms are not available (empty with `cgroup2`).
    """

    mechanism: Mechanism
    cgroup: Cgroup | None = None
    problems: tuple[str, ...] = ()

    def unenforceable(
        self,
        limits: ResourceLimits,
        *,
        sandboxed: bool,
        private_tmp: bool = True,
        workspace: Path | None = None,
    ) -> dict[str, str]:
        """The limits of `limits` this enforcement can't enforce, each with why.

        Args:
            limits: The limits asked for.
            sandboxed: Whether the processes run in ipybox's sandbox.
            private_tmp: Whether that sandbox gives them a private `/tmp` (macOS's does not).
            workspace: The directory tree `disk` bounds (`None`: the processes have none).
        """
        missing: dict[str, str] = {}
        if limits.disk is not None:
            why = quota_unavailable(workspace)
            if why is not None:
                missing["disk"] = why
        if limits.tmp is not None:
            if not sandboxed:
                missing["tmp"] = "an unsandboxed kernel has no private /tmp to size (it shares the host's)"
            elif not private_tmp:
                missing["tmp"] = "this platform's sandbox gives kernels no private /tmp to size"
        if self.mechanism != "rlimit":
            return missing
        if limits.cpus is not None:
            missing["cpus"] = "a CPU cap needs a control group"
        if limits.processes is not None and os.geteuid() == 0:
            missing["processes"] = "RLIMIT_NPROC does not apply to root"
        if limits.memory is not None and sys.platform == "darwin":
            missing["memory"] = "macOS does not enforce RLIMIT_AS, and has no control groups"
        elif limits.memory is not None and limits.memory < RLIMIT_MEMORY_FLOOR:
            missing["memory"] = (
                "setrlimit limits address space, and an idle kernel reserves about 0.7 GiB of it (thread "
                "stacks, malloc arenas): below 1 GiB it could not even start"
            )
        elif limits.memory is not None:
            why = _rlimit_memory_hole(limits, sandboxed=sandboxed, private_tmp=private_tmp)
            if why is not None:
                missing["memory"] = why
        return missing

    def describe(self) -> str:
        """One line for `ipybox doctor` and `ipybox status`."""
        if self.mechanism == "rlimit":
            why = f" ({'; '.join(self.problems)})" if self.problems else ""
            return f"{RLIMIT_DESCRIPTION}{why}"
        assert self.cgroup is not None
        where = self.cgroup.dirs.get("") or self.cgroup.dirs.get("memory", "")
        return f"cgroup v{self.cgroup.version} under {where}"


_CGROUP = "give ipybox a control group (root's, or a delegated cgroup v2 subtree)"


def _rlimit_memory_hole(limits: ResourceLimits, *, sandboxed: bool, private_tmp: bool) -> str | None:
    """Why setrlimit can't hold a process to `limits.memory` here (memory it could keep unmapped, which
    RLIMIT_AS does not count), or `None`: see the module docstring."""
    if not sandboxed:
        return (
            "setrlimit counts mapped memory only, and an unsandboxed process can keep files in the host's "
            f"/dev/shm unmapped, past any limit: sandbox it with a tmp limit, or {_CGROUP}"
        )
    if not private_tmp or limits.tmp is None:
        return (
            "setrlimit counts mapped memory only, and without a tmp limit the sandbox's /tmp and /dev/shm "
            f"are unsized in-memory filesystems whose files it does not count: set tmp too, or {_CGROUP}"
        )
    problem = seccomp_unavailable()
    if problem is not None:
        return (
            "setrlimit counts mapped memory only, and a seccomp filter must refuse memfd_create and shmget "
            f"to a process under it, which needs libseccomp: {problem}; or {_CGROUP}"
        )
    return None


def detect_enforcement(enforce: Enforce = "auto", support: CgroupSupport | None = None) -> Enforcement:
    """The best way this machine offers (or the one `enforce` insists on).

    Raises:
        LimitUnavailableError: `enforce = "cgroup"` and no control group can be made.
    """
    if enforce != "rlimit":
        if not sys.platform.startswith("linux"):
            support = CgroupSupport(None, (f"{sys.platform} has no control groups",))
        support = support or cgroup_support()
        if support.base is not None:
            return Enforcement(
                "cgroup2" if support.base.version == 2 else "cgroup1", support.base, support.problems
            )
        if enforce == "cgroup":
            raise LimitUnavailableError(
                'enforce = "cgroup", but no control group can be made here: '
                f"{'; '.join(support.problems)}. Run ipybox as root or in a delegated cgroup v2 subtree, or "
                'set enforce = "auto" to fall back to setrlimit'
            )
        return Enforcement("rlimit", None, support.problems)
    return Enforcement("rlimit", None, ('enforce = "rlimit" was asked for',))


def unenforceable_defaults(*, sandboxed: bool, enforcement: Enforcement | None = None) -> dict[str, str]:
    """The workspace's default limits (`WorkspaceLimits()`) that this machine can't enforce on kernels that
    are `sandboxed` or not, each with why (e.g. memory under `setrlimit` for an unsandboxed kernel).

    A new `ipybox.toml` (`ipybox init`, `ipybox mcp` in a directory without one) lifts exactly these, in
    the file and with the reason beside each: the workspace starts, and its file says what is not limited,
    rather than a default that stops `ipybox up` or one that is silently absent.
    """
    limits = WorkspaceLimits() if sandboxed else WorkspaceLimits().without_tmp()
    enforcement = enforcement if enforcement is not None else detect_enforcement(limits.enforce)
    return enforcement.unenforceable(limits, sandboxed=sandboxed)


def check_limits(
    limits: ResourceLimits,
    enforcement: Enforcement,
    *,
    sandboxed: bool,
    private_tmp: bool = True,
    source: str = "limits",
    workspace: Path | None = None,
) -> None:
    """Raise unless `enforcement` can enforce every limit set in `limits`.

    Args:
        workspace: The directory tree `disk` bounds (see `Enforcement.unenforceable`).
        source: Where the limits were set, for the message (`[kernel.limits]`, `[servers.x.limits]`).

    Raises:
        LimitUnavailableError: Naming each limit that can't be enforced, why, and what to do.
    """
    missing = enforcement.unenforceable(
        limits, sandboxed=sandboxed, private_tmp=private_tmp, workspace=workspace
    )
    if not missing:
        return
    values = limits.set_limits()
    ordered = sorted(missing.items(), key=lambda item: LIMIT_NAMES.index(item[0]))
    reasons = "; ".join(f"{describe_limit(name, values[name])}: {why}" for name, why in ordered)
    names = ", ".join(f'{name} = "unlimited"' for name in missing)
    where = (
        f" ({'; '.join(enforcement.problems)})"
        if enforcement.problems and enforcement.mechanism == "rlimit"
        else ""
    )
    raise LimitUnavailableError(
        f"{source} asks for limits this machine cannot enforce: {reasons}{where}. "
        f"Lift them ({names} in {source}), or run where they can be enforced (see `ipybox doctor`)"
    )
