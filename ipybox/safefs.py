"""Writing files where something else may have planted links: in the workspace and the host's state.

A kernel (or a sandboxed server, or another local user) may have left a symlink, a hard link or a FIFO
under a name the host writes later. The host therefore works relative to a directory descriptor opened
without following a symlink, creates every file new (`O_EXCL|O_NOFOLLOW`) and replaces files by rename:
whatever was there is replaced, never written through. Stdlib only; the lowest layer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""Open a directory, never through a symlink (`ELOOP`/`ENOTDIR` for one)."""

NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""Create a file that did not exist: never an existing file, link or FIFO."""


def replace_file(dir_fd: int, name: str, data: str | bytes, mode: int = 0o600) -> None:
    """Replace `name` in the directory `dir_fd` with `data`, atomically (a reader sees the old file or
    the new one, never half of one) and without writing through whatever `name` was."""
    temp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, NEW_FILE_FLAGS, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data.encode() if isinstance(data, str) else data)
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


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
