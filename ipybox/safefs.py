"""Writing files where something else may have planted links: in the workspace and the host's state.

A kernel (or a sandboxed server, or another local user) may have left a symlink, a hard link or a FIFO
under a name the host writes later. The host therefore works relative to a directory descriptor opened
without following a symlink, creates every file new (`O_EXCL|O_NOFOLLOW`) and replaces files by rename:
whatever was there is replaced, never written through. Stdlib only (and `ipybox.errors`); the lowest layer.

A directory a kernel may write in (images, complete outputs in the working dir) is reached with
`open_dir`: component by component from a trusted root (`/` for an absolute path, the current directory
for a relative one), each opened with `O_NOFOLLOW|O_DIRECTORY` and made with `mkdirat` when missing, so a
symlink anywhere on the way, not only at its end, is refused (`LinkInPathError`) rather than followed.
Host paths are absolute and resolved where ipybox makes them (the workspace), so a symlink on the way is
one that appeared later; a directory the user put behind a symlink of their own is refused too.

What a kernel makes the host write is bounded too (`DEFAULT_MAX_OUTPUT_FILE_BYTES`,
`DEFAULT_MAX_IMAGE_BYTES`): a kernel that prints forever or displays huge images must not fill the disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from ipybox.errors import UnsafePathError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""Open a directory, never through a symlink (`ELOOP`/`ENOTDIR` for one)."""

NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""Create a file that did not exist: never an existing file, link or FIFO."""

MiB = 1024 * 1024

DEFAULT_MAX_OUTPUT_FILE_BYTES = 256 * MiB
"""What the host writes of one cell's complete output (`output_file`), and of its images together."""

DEFAULT_MAX_IMAGE_BYTES = 32 * MiB
"""The largest image (a displayed one, or one a tool returned) the host saves as a file."""


class LinkInPathError(UnsafePathError, OSError):
    """A directory ipybox would write in is reached through a symlink, or a name on its way is not a
    directory: ipybox writes nothing there (a kernel may have planted it)."""

    def __str__(self) -> str:
        return str(self.strerror)


def open_dir(directory: Path, *, create_mode: int | None = None) -> int:
    """A descriptor of `directory`, reached without following a symlink on the way (see the module's
    docstring); the caller closes it.

    Args:
        directory: Absolute (walked from `/`) or relative (walked from the current directory); `..` is
            taken lexically first.
        create_mode: Create missing directories on the way, with this mode (`mkdirat`, less the umask);
            `None`: a missing one is `FileNotFoundError`.

    Raises:
        LinkInPathError: A component is a symlink or not a directory (the message names it).
        OSError: Another failure (permissions, a missing directory without `create_mode`).
    """
    path = os.path.normpath(directory)
    walked = os.sep if os.path.isabs(path) else ""
    fd = os.open(walked or ".", DIR_FLAGS)
    try:
        for name in (part for part in path.split(os.sep) if part and part != "."):
            walked = os.path.join(walked, name)
            try:
                next_fd = _open_step(name, fd, create_mode)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                what = "a symlink" if _is_link(name, fd) else "not a directory"
                raise LinkInPathError(
                    errno.ELOOP, f"{walked} is {what}, so ipybox does not write in {directory}"
                ) from None
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_step(name: str, dir_fd: int, create_mode: int | None) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if create_mode is None:
            raise
    with contextlib.suppress(FileExistsError):  # made meanwhile: opened (and checked) below
        os.mkdir(name, create_mode, dir_fd=dir_fd)
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def read_file(path: Path, *, max_bytes: int | None = None) -> bytes:
    """The content of the regular file `path`, reached as `open_dir` reaches a directory and opened without
    following a symlink: a file the host wrote where a kernel can write (an image) may have been replaced
    by a link to something the kernel can't read, or by a FIFO, meanwhile.

    With `max_bytes`, at most `max_bytes + 1` bytes are read: a caller with a bound sees a file over it
    (one that grew since it was checked) without reading all of it.

    Raises:
        LinkInPathError: A component of its path, or the file itself, is a symlink, or it is not a regular
            file.
        OSError: Another failure (a missing file, permissions).
    """
    dir_fd = open_dir(path.parent)
    try:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise LinkInPathError(errno.ELOOP, f"{path} is a symlink, so ipybox does not read it") from None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise LinkInPathError(errno.EINVAL, f"{path} is not a regular file, so ipybox does not read it")
        return file.read() if max_bytes is None else file.read(max_bytes + 1)


def replace_file(
    dir_fd: int, name: str, data: str | bytes, mode: int = 0o600, *, durable: bool = False
) -> None:
    """Replace `name` in the directory `dir_fd` with `data`, atomically (a reader sees the old file or
    the new one, never half of one) and without writing through whatever `name` was. The new file has
    exactly `mode`, whatever the umask (a file meant for sandboxed readers, 0644, stays readable). `durable`:
    the new content is on disk before the rename makes it the file, and the rename is synced after (for
    files a crash must not leave empty, such as `ipybox.lock`)."""
    temp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)
            file.write(data.encode() if isinstance(data, str) else data)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    if durable:
        # The new file is in place; a failure here leaves only whether the rename survives a crash in doubt.
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)


def open_own_dir(
    directory: Path,
    *,
    create: bool,
    unsafe: Callable[[str], Exception],
    name: str,
    forbidden_mode: int = 0o022,
) -> int:
    """A descriptor of `directory`, opened without following a symlink and checked to be this user's.

    Host-only state (the server registry, gateway tokens) lives in such directories: one that is a symlink,
    not a directory or another user's is refused with `unsafe(message)` (the message names it as `name`,
    e.g. "the registry directory"). Mode bits in `forbidden_mode` are tightened to 0700 when `create` (the
    caller is about to write), refused otherwise.

    Args:
        directory: The directory; created (0700, with its parents) when `create`.
        create: Create it if missing, and tighten its mode.
        unsafe: Makes the exception to raise for an unsafe directory.
        name: How messages name the directory.
        forbidden_mode: Permission bits others must not have (default: write).
    """
    if create:
        # A symlink there (dangling or not) is refused below, when it is opened.
        with contextlib.suppress(FileExistsError):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(directory, DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            what = "a symlink" if directory.is_symlink() else "not a directory"
            raise unsafe(f"{name} {directory} is {what}") from None
        raise
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise unsafe(f"{name} {directory} is owned by uid {info.st_uid}, not by this user")
        if stat.S_IMODE(info.st_mode) & forbidden_mode:
            if not create:
                kind = "writable" if forbidden_mode & 0o022 & info.st_mode else "readable"
                raise unsafe(f"{name} {directory} is {kind} by other users")
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd
