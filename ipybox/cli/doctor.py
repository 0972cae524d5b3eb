"""`ipybox doctor`'s report on resource limits: how this machine enforces them, why the better mechanisms
are not available, and which of a workspace's default limits it could not enforce, for sandboxed and for
unsandboxed kernels.

It lives in the command line, not beside the sandbox checks (`ipybox.sandbox.doctor`): `ipybox.sandbox`
and `ipybox.limits` are one layer, and neither may import the other. The lines are the sandbox checks'
`Check`s, so they print and serialise the same way; none is `required` (limits don't decide whether
`sandbox=True` works, so they don't change the command's exit status).

Also here: the workspace part (`executables_report`), warnings about code the host or a server runs from
the workspace that a kernel could still change (a server's script at the workspace's top level, a
command in an `allowWrite` directory); they don't change the exit status either.

Contract:

- The mechanism line is `Enforcement.describe()`, the line `ipybox status` shows too; it is `ok` for a
  control group and not for `setrlimit`, which enforces less (no CPU cap, memory per process, processes
  per user). Each reason a better mechanism is not available (`Enforcement.problems`) is a line of its
  own, not repeated in the mechanism line.
- The disk line is `ok` where the workspace's filesystem has project quotas and ipybox can set them (the
  `disk` limit can be enforced); otherwise it says that kernels' writes to the workspace have no disk
  quota, why (`ipybox.limits.disk`), and what ipybox does instead.
- The defaults line of each kind of kernel lists the limits that can't be enforced, each with why and
  what to do, because a workspace fails closed on them: its kernels don't start while a limit they ask
  for can't be enforced. An unsandboxed kernel's defaults have no `/tmp` limit (it shares the host's
  `/tmp`), as in a workspace; an explicit `tmp` for one is an error there, not a default.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipybox.config import CONFIG_FILE, ConfigError, load_config
from ipybox.config.executables import workspace_warnings
from ipybox.limits import (
    Enforcement,
    ResourceLimits,
    WorkspaceLimits,
    describe_limit,
    detect_enforcement,
    format_bytes,
)
from ipybox.limits.disk import filesystem_of, no_quota_reason, quota_unavailable
from ipybox.rules.audit import RESERVE_BYTES
from ipybox.sandbox.doctor import Check

_PROBLEM = re.compile(r"(cgroup v[12]): (.+)", re.DOTALL)
_SOURCE = "[kernel.limits]"


@dataclass(frozen=True)
class LimitsReport:
    """What `ipybox doctor` says about limits.

    Attributes:
        enforcement: How limits are enforced here.
        defaults: The limits checked (a workspace's defaults).
        unenforceable: `"sandboxed"` and `"unsandboxed"` -> each limit of `defaults` that kernel can't have,
            with why.
        checks: The report's lines.
    """

    enforcement: Enforcement
    defaults: ResourceLimits
    unenforceable: dict[str, dict[str, str]]
    checks: list[Check] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """For `ipybox doctor --json`."""
        return {
            "mechanism": self.enforcement.mechanism,
            "description": self.enforcement.describe(),
            "problems": list(self.enforcement.problems),
            "defaults": self.defaults.set_limits(),
            "unenforceable": self.unenforceable,
            "checks": [check.as_dict() for check in self.checks],
        }


def executables_report(directory: Path | None) -> tuple[Path | None, list[str]]:
    """The workspace `ipybox doctor` checks (`directory`, else the current one when it has an
    `ipybox.toml`; `None`: none) and its warnings about code the host runs that kernels could still change
    (`ipybox.config.executables.workspace_warnings`); an `ipybox.toml` that doesn't load is one warning."""
    if directory is None:
        if not (Path.cwd() / CONFIG_FILE).is_file():
            return None, []
        directory = Path.cwd()
    directory = directory.resolve()
    try:
        config = load_config(directory / CONFIG_FILE)
    except ConfigError as e:
        return directory, [f"not checked: {e}"]
    return directory, workspace_warnings(config, directory)


def limits_report(
    enforcement: Enforcement | None = None,
    defaults: ResourceLimits | None = None,
    *,
    private_tmp: bool | None = None,
    workspace: Path | None = None,
) -> LimitsReport:
    """The limits part of `ipybox doctor`.

    Args:
        enforcement: How limits are enforced (default: what this machine offers, `enforce = "auto"`).
        defaults: The limits to check (default: a workspace's, `WorkspaceLimits()`).
        private_tmp: Whether a sandboxed kernel has a private `/tmp` (default: on Linux; macOS's sandbox
            gives none).
        workspace: Where kernels write, for the disk line (default: the current directory).
    """
    enforcement = enforcement or detect_enforcement()
    defaults = defaults if defaults is not None else WorkspaceLimits()
    private_tmp = sys.platform.startswith("linux") if private_tmp is None else private_tmp
    kinds = {
        "sandboxed": (defaults, True),
        # A workspace applies its default /tmp limit to sandboxed kernels only.
        "unsandboxed": (defaults.without_tmp(), False),
    }
    unenforceable = {
        kind: enforcement.unenforceable(limits, sandboxed=sandboxed, private_tmp=private_tmp)
        for kind, (limits, sandboxed) in kinds.items()
    }
    checks = [_mechanism(enforcement), *(_problem(problem) for problem in enforcement.problems)]
    for kind, (limits, _) in kinds.items():
        checks.append(_defaults(kind, limits, unenforceable[kind]))
    checks.append(_disk(workspace or Path.cwd(), defaults))
    return LimitsReport(enforcement, defaults, unenforceable, checks)


def _disk(workspace: Path, limits: ResourceLimits) -> Check:
    filesystem = filesystem_of(workspace)
    if filesystem is not None and filesystem.project_quotas and quota_unavailable(workspace) is None:
        detail = f"project quotas on {filesystem.mount_point} ({filesystem.fstype}): disk in {_SOURCE} bounds the workspace"
        return Check("disk", True, detail, False)
    file_size = (
        f"set to {format_bytes(limits.file_size)}" if limits.file_size is not None else "not set by default"
    )
    instead = (
        f"the audit log keeps a {format_bytes(RESERVE_BYTES)} reserve, so decisions are still recorded and "
        f"other sessions' calls run with the disk full; file_size in {_SOURCE} bounds each file a kernel "
        f"writes ({file_size}); a sandboxed kernel's /tmp is a tmpfs of tmp's size"
    )
    detail = f"no disk quota for kernels' writes here: {no_quota_reason(filesystem)}; what ipybox does instead: {instead}"
    return Check("disk", False, detail, False)


def _mechanism(enforcement: Enforcement) -> Check:
    # `describe()` of setrlimit carries the problems in brackets; they get lines of their own here.
    detail = dataclasses.replace(enforcement, problems=()).describe()
    return Check("limits enforced by", enforcement.mechanism != "rlimit", detail, False)


def _problem(problem: str) -> Check:
    match = _PROBLEM.fullmatch(problem)
    if match is None:
        return Check("limits via control groups", False, problem, False)
    return Check(f"limits via {match[1]}", False, match[2], False)


def _defaults(kind: str, limits: ResourceLimits, missing: dict[str, str]) -> Check:
    values = limits.set_limits()
    name = f"default limits, {kind} kernels"
    enforced = ", ".join(
        describe_limit(limit, value) for limit, value in values.items() if limit not in missing
    )
    no_tmp = "; no /tmp limit: an unsandboxed kernel shares the host's /tmp" if kind == "unsandboxed" else ""
    if not missing:
        return Check(name, True, f"enforced: {enforced or 'none set'}{no_tmp}", False)
    reasons = "; ".join(f"{describe_limit(limit, values[limit])} ({why})" for limit, why in missing.items())
    lift = ", ".join(f'{limit} = "unlimited"' for limit in missing)
    detail = (
        f"can't enforce {reasons}, so a workspace won't start with these defaults: set {lift} in {_SOURCE}, "
        f"or run where {'it' if len(missing) == 1 else 'they'} can be enforced"
        + (f"; enforced: {enforced}" if enforced else "")
        + no_tmp
    )
    return Check(name, False, detail, False)


def kernels_report(directory: Path | None) -> dict[str, Any] | None:
    """Where the kernels of the workspace `ipybox doctor` checks run: `None` without a workspace or on
    this machine; for `[kernel.gateway]`, the gateway, whether it answers with the kernel spec (asked now),
    what isolates its kernels and the limits their start requests ask for."""
    if directory is None:
        directory = Path.cwd() if (Path.cwd() / CONFIG_FILE).is_file() else None
    if directory is None:
        return None
    try:
        config = load_config(directory.resolve() / CONFIG_FILE)
    except ConfigError:
        return None  # reported by `executables_report`
    if config.kernel.gateway is None:
        return None
    import asyncio

    from ipybox.executor.remote_kernels import remote_gateway_of, remote_limits_env

    try:
        remote = remote_gateway_of(config)
        problem = asyncio.run(remote.check())
    except ValueError as e:  # a token placeholder that is not set
        problem = str(e)
    return {
        "gateway": config.kernel.gateway.url,
        "kernelspec": config.kernel.gateway.kernelspec,
        "answers": problem is None,
        "problem": problem,
        "isolation": "the gateway's cluster: ipybox's sandbox applies to kernels on this machine only",
        "requested_limits": remote_limits_env(config.kernel.limits),
    }
