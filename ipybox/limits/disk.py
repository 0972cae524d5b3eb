"""The workspace's disk quota (`disk` in `[kernel.limits]`): a Linux project quota on the workspace's tree,
and, for `ipybox doctor`, why there is none where the machine offers none.

A project quota bounds what a directory tree holds, whoever writes it (the user's editor and git too:
`disk` bounds the workspace, not only its kernels). It takes an ext4 or xfs filesystem mounted with
project quotas enforced (ext4: `mkfs.ext4 -O quota,project`, mounted `-o prjquota`; xfs: `-o prjquota`)
and root (CAP_SYS_ADMIN). `apply_quota`, when a workspace's kernels start:

- gives the workspace directory the project id `project_id(workspace)` (`2**31` + its inode number modulo
  `2**31 - 1`: the same for the same directory, renamed or not; distinct for two workspaces on one ext4
  filesystem; above the small ids administrators assign in `/etc/projid`) and `FS_XFLAG_PROJINHERIT`, so
  what is created below it inherits the id; entries that existed before get it in one walk of the tree
  (symlinks not followed and, like sockets and fifos, not counted), done when the workspace directory
  does not carry the id yet (it is set last, so an interrupted walk is done again);
- keeps the workspace's `.ipybox` (ipybox's state, the audit log with its reserve) out of the project: it
  and what is in it get project id 0, without the inherit flag, so a full quota never refuses a decision's
  record (a `state_dir` elsewhere in the workspace is counted);
- sets the project's block limit with `quotactl(Q_SETQUOTA, PRJQUOTA)` on the filesystem's block device.

The quota belongs to the directory: it stays when the kernels stop, and the next start sets it again from
`[kernel.limits]` (`disk = "unlimited"` leaves the last one in place: an administrator lifts it with
`setquota -P`). A write past it fails with `EDQUOT` ("Disk quota exceeded") in the writer; nothing is
killed.

Where there is no project quota: `file_size` (RLIMIT_FSIZE) bounds each file, a sandboxed kernel's `/tmp` is
a sized tmpfs, and the audit log keeps a reserve, so a full disk does not refuse other sessions' calls
(`ipybox.rules.audit`). A size-bounded loop or overlay mount of the workspace is not offered: it takes
root too, and hides the kernels' writes from the host until merged.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
import struct
import sys
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
    source: str = ""
    """The mounted device (`/dev/sda1`), as mountinfo names it."""
    device: int | None = None
    """Its device number (`os.makedev(major, minor)`)."""

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
            major, _, minor = parts[2].partition(":")
            device = os.makedev(int(major), int(minor)) if major.isdigit() and minor.isdigit() else None
            found = Filesystem(point, tail[0], options, tail[1].replace("\\040", " "), device)
    return found


def no_quota_reason(filesystem: Filesystem | None) -> str:
    """Why kernels' writes to a workspace on `filesystem` have no disk quota (by default, or because
    ipybox can't set one: see `quota_unavailable`)."""
    if filesystem is None:
        return "ipybox can set none on this platform"
    where = f"{filesystem.mount_point} ({filesystem.fstype})"
    if filesystem.project_quotas:
        return (
            f"project quotas are on for {where}, but setting one takes root (CAP_SYS_ADMIN): run ipybox as "
            "root to use disk in [kernel.limits], or an administrator sets one with setquota -P or xfs_quota"
        )
    return (
        f"{where} has no project quotas (mount option prjquota), and a size-bounded mount of the "
        "workspace would take root"
    )


# struct fsxattr (linux/fs.h): fsx_xflags, fsx_extsize, fsx_nextents, fsx_projid, fsx_cowextsize, pad[8].
FSXATTR = struct.Struct("=5I8x")
FS_IOC_FSGETXATTR = 0x801C581F  # _IOR('X', 31, struct fsxattr)
FS_IOC_FSSETXATTR = 0x401C5820  # _IOW('X', 32, struct fsxattr)
FS_XFLAG_PROJINHERIT = 0x200

# struct if_dqblk (linux/quota.h): bhardlimit, bsoftlimit, curspace, ihardlimit, isoftlimit, curinodes,
# btime, itime (u64 each), valid (u32), padded to 8 bytes.
IF_DQBLK = struct.Struct("=8QI4x")
Q_GETQUOTA = 0x800007
Q_SETQUOTA = 0x800008
PRJQUOTA = 2
QIF_BLIMITS = 1
QIF_DQBLKSIZE = 1024
"""The unit of `dqb_bhardlimit`."""

PROJECT_ID_BASE = 1 << 31
QUOTA_FILESYSTEMS = frozenset({"ext4", "xfs"})
STATE_DIR = ".ipybox"
"""Kept out of the project (ipybox's state, the audit log): see the module docstring."""


def project_id(workspace: Path) -> int:
    """The workspace's project id: `2**31` + its inode number modulo `2**31 - 1` (never `2**32 - 1`, which
    the kernel reserves as invalid)."""
    return PROJECT_ID_BASE + os.stat(workspace).st_ino % (PROJECT_ID_BASE - 1)


def pack_fsxattr(xflags: int, projid: int, extsize: int = 0, nextents: int = 0, cowextsize: int = 0) -> bytes:
    return FSXATTR.pack(xflags, extsize, nextents, projid, cowextsize)


def unpack_fsxattr(data: bytes) -> tuple[int, int]:
    """`(fsx_xflags, fsx_projid)` of a `struct fsxattr`."""
    xflags, _, _, projid, _ = FSXATTR.unpack(data)
    return xflags, projid


def pack_block_limit(limit: int) -> bytes:
    """A `struct if_dqblk` that sets the hard block limit to `limit` bytes (rounded up to KiB), no soft limit."""
    blocks = -(-limit // QIF_DQBLKSIZE)
    return IF_DQBLK.pack(blocks, 0, 0, 0, 0, 0, 0, 0, QIF_BLIMITS)


def qcmd(command: int, kind: int) -> int:
    """`QCMD(cmd, type)` of linux/quota.h."""
    return (command << 8) | (kind & 0xFF)


def block_device(filesystem: Filesystem) -> str:
    """The block device `quotactl` names the filesystem by: mountinfo's source where it is that device,
    else `/dev/block/MAJOR:MINOR` (the source may be a name like `/dev/root` with no node)."""
    try:
        st = os.stat(filesystem.source)
        if stat.S_ISBLK(st.st_mode) and (filesystem.device is None or st.st_rdev == filesystem.device):
            return filesystem.source
    except OSError:
        pass
    if filesystem.device is None:
        return filesystem.source
    return f"/dev/block/{os.major(filesystem.device)}:{os.minor(filesystem.device)}"


def _quotactl(command: int, device: str, id_: int, buffer: ctypes.Array[ctypes.c_char]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    function = libc.quotactl
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p)
    function.restype = ctypes.c_int
    if function(qcmd(command, PRJQUOTA), os.fsencode(device), id_, buffer) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), device)


def _can_admin() -> bool:
    if os.geteuid() == 0:
        return True
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 21))  # CAP_SYS_ADMIN
    except (OSError, ValueError, IndexError):
        pass
    return False


def quota_unavailable(workspace: Path | None, mountinfo: str | None = None) -> str | None:
    """Why ipybox can't set a project quota on `workspace` here (and what to do), or `None` where it can.
    `None` workspace: limits of something that has none (a stdio MCP server's)."""
    if workspace is None:
        return (
            "disk bounds a workspace's tree, and these processes have no workspace: set it in [kernel.limits]"
        )
    if not sys.platform.startswith("linux"):
        return f"ipybox sets disk quotas with Linux project quotas, and this is {sys.platform}"
    filesystem = filesystem_of(workspace, mountinfo)
    if filesystem is None:
        return "the workspace's filesystem could not be found in /proc/self/mountinfo"
    where = f"the workspace is on {filesystem.mount_point} ({filesystem.fstype})"
    if filesystem.fstype not in QUOTA_FILESYSTEMS:
        return f"{where}, and project quotas need ext4 or xfs: move the workspace to one"
    if not filesystem.project_quotas:
        return (
            f"{where}, mounted without project quotas: mount it with -o prjquota (ext4 also needs "
            "mkfs.ext4 -O quota,project, or tune2fs -O quota,project)"
        )
    if not _can_admin():
        return f"{where}, and setting a project quota takes root (CAP_SYS_ADMIN): run ipybox as root"
    device = block_device(filesystem)
    try:
        _quotactl(Q_GETQUOTA, device, project_id(workspace), ctypes.create_string_buffer(IF_DQBLK.size))
    except OSError as e:
        if e.errno == errno.ESRCH:
            return f"{where}, whose project quotas are not turned on: quotaon -P {filesystem.mount_point}"
        return f"{where}, and reading its project quota on {device} failed: {e.strerror}"
    return None


def apply_quota(workspace: Path, limit: int, mountinfo: str | None = None) -> int:
    """Bound what `workspace`'s tree holds to `limit` bytes (see the module docstring); its project id.

    Raises:
        OSError: The filesystem refused (checked beforehand by `quota_unavailable`).
    """
    workspace = Path(os.path.realpath(workspace))
    filesystem = filesystem_of(workspace, mountinfo)
    assert filesystem is not None
    projid = project_id(workspace)
    if _project(workspace) != (projid, True):
        for directory, dirs, files in os.walk(workspace, topdown=True):
            if directory == str(workspace):
                dirs[:] = [name for name in dirs if name != STATE_DIR]
            for name in (*dirs, *files):
                _set_project(Path(directory, name), projid)
        _set_project(workspace, projid)
    state = workspace / STATE_DIR
    if state.is_dir() and not state.is_symlink():
        for directory, _, files in os.walk(state):
            for name in (directory, *(os.path.join(directory, file) for file in files)):
                _set_project(Path(name), 0, inherit=False)
    buffer = ctypes.create_string_buffer(pack_block_limit(limit), IF_DQBLK.size)
    _quotactl(Q_SETQUOTA, block_device(filesystem), projid, buffer)
    return projid


def _project(path: Path) -> tuple[int, bool]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        xflags, projid = unpack_fsxattr(fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(FSXATTR.size)))
    finally:
        os.close(fd)
    return projid, bool(xflags & FS_XFLAG_PROJINHERIT)


def _set_project(path: Path, projid: int, *, inherit: bool = True) -> None:
    """Give a directory or regular file (not followed if a symlink; others are skipped) project `projid`,
    and a directory the inherit flag (or not)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOENT, errno.ENXIO):  # a symlink, gone, a socket
            return
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            return
        xflags, _ = unpack_fsxattr(fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(FSXATTR.size)))
        if stat.S_ISDIR(mode):
            xflags = xflags | FS_XFLAG_PROJINHERIT if inherit else xflags & ~FS_XFLAG_PROJINHERIT
        fcntl.ioctl(fd, FS_IOC_FSSETXATTR, pack_fsxattr(xflags, projid))
    finally:
        os.close(fd)
