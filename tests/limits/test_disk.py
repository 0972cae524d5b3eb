"""The workspace's disk quota (`disk`, a Linux project quota): the kernel structures it is set with, the
filesystem it is set on, the error where it can't be, and, where the kernel mounts ext4 with project
quotas, a kernel writing past it.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipybox import CodeExecutionError, CodeExecutor, ResourceLimits
from ipybox.limits import LimitUnavailableError, check_limits
from ipybox.limits.disk import (
    FS_IOC_FSGETXATTR,
    FS_IOC_FSSETXATTR,
    FS_XFLAG_PROJINHERIT,
    IF_DQBLK,
    PRJQUOTA,
    Q_SETQUOTA,
    QIF_BLIMITS,
    STATE_DIR,
    _project,
    _set_project,
    block_device,
    filesystem_of,
    pack_block_limit,
    pack_fsxattr,
    project_id,
    qcmd,
    quota_unavailable,
    unpack_fsxattr,
)
from ipybox.limits.enforcement import Enforcement

MIB = 1024**2
MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 8:2 / /srv rw,relatime shared:2 - xfs /dev/sdb1 rw,attr2,inode64,prjquota
31 30 7:3 / /srv/with\\040space rw shared:3 - ext4 /dev/loop3 rw,prjquota
32 22 0:40 / /run rw - tmpfs tmpfs rw
"""


def _ioc(direction: int, number: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (ord("X") << 8) | number


def test_the_ioctl_and_quotactl_structures_have_the_kernels_layout() -> None:
    # linux/fs.h: struct fsxattr is 28 bytes; _IOR('X', 31, ...) and _IOW('X', 32, ...).
    assert (_ioc(2, 31, 28), _ioc(1, 32, 28)) == (FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR)
    packed = pack_fsxattr(FS_XFLAG_PROJINHERIT | 0x8, 2**31 + 12)
    assert len(packed) == 28 and packed[12:16] == (2**31 + 12).to_bytes(4, "little")
    assert unpack_fsxattr(packed) == (FS_XFLAG_PROJINHERIT | 0x8, 2**31 + 12)
    # linux/quota.h: struct if_dqblk is 8 u64 and a u32, padded to 72; limits in 1 KiB blocks, rounded up.
    limit = pack_block_limit(8 * MIB + 1)
    assert IF_DQBLK.size == len(limit) == 72
    assert IF_DQBLK.unpack(limit) == (8 * 1024 + 1, 0, 0, 0, 0, 0, 0, 0, QIF_BLIMITS)
    assert qcmd(Q_SETQUOTA, PRJQUOTA) == 0x80000802


def test_the_project_id_is_the_workspaces_own_and_above_administrators_ids(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    before = project_id(tmp_path / "a")
    (tmp_path / "a").rename(tmp_path / "c")
    assert project_id(tmp_path / "c") == before != project_id(tmp_path / "b")
    assert 2**31 <= before < 2**32 - 1


def test_mountinfo_gives_the_filesystem_its_options_and_block_device() -> None:
    srv = filesystem_of(Path("/srv/project"), MOUNTINFO)
    assert srv is not None and (srv.mount_point, srv.fstype, srv.source) == ("/srv", "xfs", "/dev/sdb1")
    assert srv.project_quotas and srv.device == os.makedev(8, 2)
    spaced = filesystem_of(Path("/srv/with space/ws"), MOUNTINFO)
    assert spaced is not None and spaced.mount_point == "/srv/with space" and spaced.project_quotas
    root = filesystem_of(Path("/home/me"), MOUNTINFO)
    assert root is not None and root.mount_point == "/" and not root.project_quotas
    # A source with no device node of that number: the kernel's own name for the device.
    assert block_device(srv) in ("/dev/sdb1", "/dev/block/8:2")


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        (
            "/home/me",
            "the workspace is on / (ext4), mounted without project quotas: mount it with -o prjquota",
        ),
        ("/run/ws", "the workspace is on /run (tmpfs), and project quotas need ext4 or xfs"),
    ],
)
def test_disk_on_a_filesystem_without_project_quotas_is_unavailable_and_says_why(
    path: str, reason: str
) -> None:
    why = quota_unavailable(Path(path), MOUNTINFO)
    assert why is not None and why.startswith(reason)


def test_disk_on_a_filesystem_without_project_quotas_is_one_clear_limit_unavailable_error(
    tmp_path: Path,
) -> None:
    filesystem = filesystem_of(tmp_path)
    if filesystem is None or filesystem.project_quotas:
        pytest.skip("the temporary directory's filesystem has project quotas")
    with pytest.raises(LimitUnavailableError) as caught:
        check_limits(
            ResourceLimits(disk="8MiB", file_size="1GiB"),
            Enforcement("rlimit"),
            sandboxed=True,
            source="[kernel.limits]",
            workspace=tmp_path,
        )
    message = str(caught.value)
    assert message.startswith("[kernel.limits] asks for limits this machine cannot enforce: disk 8 MiB: ")
    assert "the workspace is on " in message and "file size" not in message
    assert 'disk = "unlimited" in [kernel.limits]' in message
    # Limits without a workspace (a stdio MCP server's) have nothing for `disk` to bound.
    with pytest.raises(LimitUnavailableError, match=r"no workspace: set it in \[kernel.limits\]"):
        check_limits(ResourceLimits(disk="8MiB"), Enforcement("rlimit"), sandboxed=False)


@pytest.mark.user_dependent  # the unprivileged pass runs it again: see tests/sandbox/test_unprivileged.py
def test_the_fsxattr_ioctls_read_and_set_a_real_inodes_project(tmp_path: Path) -> None:
    filesystem = filesystem_of(tmp_path)
    if filesystem is None or filesystem.fstype not in ("ext4", "xfs"):
        pytest.skip("the temporary directory is not on ext4 or xfs")
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    os.mkfifo(tmp_path / "fifo")
    for name in (
        "file",
        "link",
        "fifo",
    ):  # project 0 is what every filesystem takes; symlinks and fifos skipped
        _set_project(tmp_path / name, 0)
    _set_project(tmp_path, 0, inherit=False)
    assert _project(tmp_path) == (0, False)
    assert stat.S_ISLNK(os.lstat(tmp_path / "link").st_mode)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def quota_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 64 MiB ext4 image with project quotas, loop-mounted with `prjquota`."""
    base = tmp_path_factory.mktemp("quota")
    image, mount = base / "img", base / "mnt"
    mount.mkdir()
    try:
        _run("truncate", "-s", "64M", str(image))
        _run("mkfs.ext4", "-q", "-O", "quota,project", str(image))
        _run("mount", "-o", "loop,prjquota", str(image), str(mount))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        pytest.skip(f"can't mount ext4 with project quotas here (a kernel without CONFIG_QFMT_V2?): {detail}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.integration
@pytest.mark.root_only
async def test_a_kernel_writing_past_the_disk_quota_gets_edquot_and_stays_alive(quota_mount: Path) -> None:
    workspace = quota_mount / "ws"
    (workspace / "out").mkdir(parents=True)  # a sandboxed kernel adds no name at the top level
    (workspace / "out" / "before").write_bytes(b"1" * MIB)
    (workspace / STATE_DIR).mkdir()
    (workspace / STATE_DIR / "audit.log").write_text("")
    async with CodeExecutor(
        working_dir=workspace, sandbox=True, limits=ResourceLimits(disk="8MiB")
    ) as executor:
        projid = project_id(workspace)
        assert _project(workspace) == (projid, True) and _project(workspace / "out") == (projid, True)
        assert _project(workspace / STATE_DIR) == (0, False)
        code = "with open('out/big', 'wb') as f:\n    for _ in range(16):\n        f.write(b'0' * 2**20)\n"
        with pytest.raises(CodeExecutionError, match=r"\[Errno 122\] Disk quota exceeded"):
            await executor.execute(code)
        assert (await executor.execute("print(6 * 7)")).text == "42"
        # Outside the project, ipybox's state still takes writes.
        (workspace / STATE_DIR / "audit.log").write_bytes(b"2" * 4 * MIB)
        async with CodeExecutor(working_dir=workspace, sandbox=True) as other:
            assert (await other.execute("print('other')")).text == "other"


@pytest.mark.integration
async def test_an_executor_asking_for_disk_without_project_quotas_does_not_start(tmp_path: Path) -> None:
    filesystem = filesystem_of(tmp_path)
    if filesystem is None or filesystem.project_quotas:
        pytest.skip("the temporary directory's filesystem has project quotas")
    executor = CodeExecutor(working_dir=tmp_path, limits=ResourceLimits(disk="8MiB"))
    with pytest.raises(LimitUnavailableError, match=r"disk 8 MiB: the workspace is on .* mounted without"):
        await executor.start()
