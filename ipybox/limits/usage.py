"""`Usage`: what a limited process tree uses now, and has used at most; read from its control group or,
without one, from `/proc`.

Stdlib only (and ipybox's base helpers): the kernel gateway's process reads it for every kernel it is asked
about.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ipybox.process import descendants

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Usage:
    """What a kernel (with everything it started) uses. `None`: not known on this machine.

    Attributes:
        memory: Bytes of memory in use now (cgroup: charged to the group, `/tmp` files included;
            otherwise: the resident memory of the process tree).
        memory_peak: The most it has used (cgroup: since the group was made; otherwise: the largest
            process's high-water mark).
        cpu_seconds: CPU time used (cgroup: by every process ever in the group; otherwise: by the live
            processes of the tree).
        processes: Processes and threads now.
        oom_kills: Processes the kernel's OOM killer ended for exceeding the memory limit.
    """

    memory: int | None = None
    memory_peak: int | None = None
    cpu_seconds: float | None = None
    processes: int | None = None
    oom_kills: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Usage:
        return cls(
            **{key: data.get(key) for key in ("memory", "memory_peak", "cpu_seconds", "processes")},
            oom_kills=int(data.get("oom_kills") or 0),
        )


def tree_usage(pid: int) -> Usage:
    """The usage of `pid` and its live descendants, from `/proc` (an empty `Usage` where there is none)."""
    memory = cpu = threads = peak = 0
    found = False
    for member in [pid, *descendants(pid)]:
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        found = True
        # The fields after the command name's last ')', from the state (field 3): utime 14, stime 15,
        # num_threads 20, rss 24.
        fields = stat[stat.rfind(")") + 2 :].split()
        cpu += int(fields[11]) + int(fields[12])
        threads += int(fields[17])
        memory += int(fields[21]) * _PAGE
        peak = max(peak, _high_water_mark(member))
    if not found:
        return Usage()
    return Usage(memory=memory, memory_peak=peak or None, cpu_seconds=cpu / _TICKS, processes=threads)


def _high_water_mark(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def user_tasks(uid: int | None = None) -> int:
    """Processes and threads of the user `uid` (default: this process's real user) now: what the kernel
    counts against `RLIMIT_NPROC`. 0 where `/proc` is not available."""
    uid = os.getuid() if uid is None else uid
    proc = Path("/proc")
    if not proc.is_dir():
        return 0
    count = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Threads:"):
                    count += int(line.split()[1])
                    break
        except (OSError, ValueError, IndexError):
            continue
    return count
