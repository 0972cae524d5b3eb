"""Writing files where something else may have planted links: in the workspace and the host's state.

A kernel (or a sandboxed server, or another local user) may have left a symlink, a hard link or a FIFO
under a name the host writes later. The host therefore works relative to a directory descriptor opened
without following a symlink, creates every file new (`O_EXCL|O_NOFOLLOW`) and replaces files by rename:
whatever was there is replaced, never written through. Stdlib only; the lowest layer.
"""

from __future__ import annotations

import contextlib
import os
import secrets

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
