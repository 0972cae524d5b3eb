"""Resource limits of kernels and stdio MCP servers: memory, CPU, processes, open files, file size, `/tmp`,
the workspace's disk.

- [spec][ipybox.limits.spec]: `ResourceLimits` (`[kernel.limits]`, `CodeExecutor(limits=...)`) and the
  workspace's defaults;
- [enforcement][ipybox.limits.enforcement]: which mechanism this machine offers (cgroup v2, cgroup v1,
  setrlimit) and `LimitUnavailableError` for a limit it can't enforce;
- [limiter][ipybox.limits.limiter]: the groups made for a gateway's kernels and for each kernel, and the
  command line that starts a process inside them ([wrapper][ipybox.limits.wrapper]);
- [usage][ipybox.limits.usage]: what a kernel uses, from its group or `/proc`;
- [seccomp][ipybox.limits.seccomp]: the filter that keeps a kernel under `setrlimit` from holding memory
  no rlimit counts (`memfd_create`, `shmget`);
- [disk][ipybox.limits.disk]: the workspace's disk quota (`disk`, a Linux project quota), and why there
  is none where the machine offers none (`ipybox doctor`).

The host decides and checks; the kernel never does: limits are set before its first instruction, by a
process it can't reach, and it can't raise them.
"""

from ipybox.limits.enforcement import (
    Enforcement,
    LimitUnavailableError,
    check_limits,
    detect_enforcement,
    unenforceable_defaults,
)
from ipybox.limits.limiter import Limited, Limiter
from ipybox.limits.spec import ResourceLimits, WorkspaceLimits, describe_limit, format_bytes
from ipybox.limits.usage import Usage

__all__ = [
    "Enforcement",
    "LimitUnavailableError",
    "Limited",
    "Limiter",
    "ResourceLimits",
    "Usage",
    "WorkspaceLimits",
    "check_limits",
    "describe_limit",
    "detect_enforcement",
    "format_bytes",
    "unenforceable_defaults",
]
