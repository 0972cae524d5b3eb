"""Why there is no disk quota for what kernels write to the workspace, for `ipybox doctor`.

ipybox sets none, on purpose: the workspace is the user's own directory tree, which the host (an editor,
git) writes too, so a quota on it would bound the user, not the kernels; and what the machine offers for
one takes root to set up: project quotas (`prjquota` on ext4/xfs: a project id on the tree, a limit set by
`setquota -P` or `xfs_quota`), or a size-bounded loop or overlay mount, which would also hide the kernels'
writes from the host until merged. What bounds a kernel instead: `file_size` (RLIMIT_FSIZE) per file, a
sized tmpfs for a sandboxed kernel's `/tmp`; and the audit log keeps a reserve, so a full disk does not
refuse other sessions' calls (`ipybox.rules.audit`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_PROJECT_QUOTA_OPTIONS = frozenset({"prjquota", "pquota"})
"""Mount options under which project quotas are enforced (`pqnoenforce` only accounts)."""


@dataclass(frozen=True)
class Filesystem:
    """The filesystem a path is on, from `/proc/self/mountinfo`."""

    mount_point: str
    fstype: str
    options: frozenset[str]

    @property
    def project_quotas(self) -> bool:
        return bool(self.options & _PROJECT_QUOTA_OPTIONS)


def filesystem_of(path: Path, mountinfo: str | None = None) -> Filesystem | None:
    """The filesystem `path` is on (its deepest mount), or `None` where `/proc/self/mountinfo` can't
    be read (not Linux)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    target = os.path.realpath(path)
    found: Filesystem | None = None
    for line in mountinfo.splitlines():
        # id parent major:minor root mount-point mount-options [optional...] - fstype source super-options
        fields, _, rest = line.partition(" - ")
        parts, tail = fields.split(), rest.split()
        if len(parts) < 6 or len(tail) < 3:
            continue
        point = parts[4].replace("\\040", " ")
        if not (target == point or target.startswith(point.rstrip("/") + "/")):
            continue
        if found is None or len(point) >= len(found.mount_point):  # later mounts cover earlier ones
            options = frozenset(parts[5].split(",")) | frozenset(tail[2].split(","))
            found = Filesystem(point, tail[0], options)
    return found


def no_quota_reason(filesystem: Filesystem | None) -> str:
    """Why kernels' writes to a workspace on `filesystem` have no disk quota."""
    if filesystem is None:
        return "ipybox can set none on this platform"
    where = f"{filesystem.mount_point} ({filesystem.fstype})"
    if filesystem.project_quotas:
        return (
            f"project quotas are on for {where}, but ipybox sets none: one would bound the whole workspace, "
            "your own writes too, and setting it takes root (an administrator can, with setquota -P or "
            "xfs_quota)"
        )
    return (
        f"{where} has no project quotas (mount option prjquota), and a size-bounded mount of the "
        "workspace would take root"
    )
