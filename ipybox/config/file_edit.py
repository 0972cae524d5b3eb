"""`edit_config_file()`: the one way ipybox changes a workspace's `ipybox.toml` (a server added or removed
by `ipybox server` or `register_mcp_server`, a rule written for an "always" answer).

Contract: the edit is made to the file's text as read, and nothing is written unless all of these hold;
then the file is replaced atomically (a temporary file in the same directory, fsync, rename, the directory
fsync-ed; mode kept, owner kept where allowed):

1. the file is a regular file, opened without following a symlink (something in the workspace may have
   planted one) or blocking on a FIFO, and it loads now;
2. the new file loads with the real loader (`load_config`: `.env` and `IPYBOX_*` variables included), its
   problems reported at the file's own path, and the caller's `took_effect` finds its change in it;
3. the file did not change while this happened (else it is read again and the edit made anew, once).

Otherwise the caller's `refuse` error says why and the file is left as it was; no temporary file stays
behind. A change that lands between the last comparison and the rename (microseconds) is not detected:
editors replace the file whole too, so one of the two versions wins intact. Edits in one process take
turns (a registration and a console answer must not each write the file without the other's change).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from ipybox.config.errors import ConfigError, ConfigProblem
from ipybox.config.loading import CONFIG_FILE, MAX_CONFIG_CHARS, load_config
from ipybox.config.workspace_config import WorkspaceConfig

_WRITE_LOCK: Final = threading.Lock()
_T = TypeVar("_T")


class _FileChanged(Exception):
    """The file changed between reading it and replacing it."""


@dataclass(frozen=True)
class EditRules:
    """How one kind of edit explains a refusal.

    Attributes:
        refuse: Makes the error raised for a refusal from the reason (`"it is a symlink, ..."`).
        fix_first: Said after "it does not load as it is; " (what to do then).
        missing: Why, when there is no such file.
        by_hand: Said after the symlink refusal (what to do instead).
        again: Said when the file changed twice while being edited (what to do then).
        change: What would be in the new file, for "it would not load with <change>".
    """

    refuse: Callable[[str], Exception]
    fix_first: str
    missing: str
    by_hand: str
    again: str
    change: str = "this change"


def edit_config_file(
    path: Path,
    edit: Callable[[str, WorkspaceConfig], tuple[str, _T]],
    took_effect: Callable[[WorkspaceConfig, _T], str | None],
    rules: EditRules,
) -> _T:
    """Change `path` (an `ipybox.toml`) as `edit` says, under the contract of this module.

    Args:
        path: The file.
        edit: Given the file's text and its configuration as loaded now, the new text and what the caller
            keeps of the edit; it raises the caller's own errors to refuse.
        took_effect: Given the new file's configuration and `edit`'s result, why the change would not take
            effect (e.g. the environment overrides it), or `None` when it does.
        rules: How refusals are worded.

    Raises:
        Exception: `rules.refuse(...)`, or what `edit` raised; the file is unchanged.
    """
    with _WRITE_LOCK:
        for _ in range(2):
            try:
                return _attempt(path, edit, took_effect, rules)
            except _FileChanged:
                continue
            except OSError as e:  # the directory is gone or not writable, the disk is full...
                raise rules.refuse(f"it could not be written ({e.strerror or e})") from None
    raise rules.refuse(f"it changed while it was being written, twice (is it being edited?); {rules.again}")


def _attempt(
    path: Path,
    edit: Callable[[str, WorkspaceConfig], tuple[str, _T]],
    took_effect: Callable[[WorkspaceConfig, _T], str | None],
    rules: EditRules,
) -> _T:
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        original, info = _read(dir_fd, path, rules)
        try:
            current = load_config(path)
        except ConfigError as e:
            raise rules.refuse(f"it does not load as it is; {rules.fix_first}:\n{e}") from None
        if _read(dir_fd, path, rules)[0] != original:
            raise _FileChanged
        new_text, result = edit(original.decode("utf-8"), current)  # the loader read it as UTF-8

        def check(temp: Path) -> None:
            why = took_effect(_load_as(path, temp, rules), result)
            if why is not None:
                raise rules.refuse(why)

        _replace(dir_fd, path, info, original, new_text.encode("utf-8"), check, rules)
        return result
    finally:
        os.close(dir_fd)


def _read(dir_fd: int, path: Path, rules: EditRules) -> tuple[bytes, os.stat_result]:
    """The file's bytes, read without following a symlink or blocking on a FIFO."""
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise rules.refuse(rules.missing) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise rules.refuse(
                "it is a symlink, and ipybox does not write through one (something in the workspace may "
                f"have planted it); replace it with the file itself, or {rules.by_hand}"
            ) from None
        raise rules.refuse(f"it cannot be read ({e.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise rules.refuse(f"it is not a regular file ({CONFIG_FILE} must be a text file)")
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(4 * MAX_CONFIG_CHARS + 1)  # the loader refuses longer files anyway
    finally:
        os.close(fd)
    return data, info


def _load_as(path: Path, temp: Path, rules: EditRules) -> WorkspaceConfig:
    """The new file (`temp`) loaded as the workspace will load it, its problems shown at `path`."""
    try:
        return load_config(temp)
    except ConfigError as e:
        problems = [
            ConfigProblem(str(path) if p.source == str(temp) else p.source, p.line, p.column, p.reason)
            for p in e.problems
        ]
        reason = "\n".join(map(str, problems))
        raise rules.refuse(f"it would not load with {rules.change}:\n{reason}") from None


def _replace(
    dir_fd: int,
    path: Path,
    info: os.stat_result,
    original: bytes,
    data: bytes,
    check: Callable[[Path], None],
    rules: EditRules,
) -> None:
    """Replace the file with `data` if it passes `check` and the file is still `original`."""
    temp = f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(
        temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
    )
    try:
        try:
            os.fchmod(fd, stat.S_IMODE(info.st_mode))
            if (info.st_uid, info.st_gid) != (os.geteuid(), os.getegid()):
                # Only root may give a file away; otherwise it is ours from now on.
                with contextlib.suppress(PermissionError):
                    os.fchown(fd, info.st_uid, info.st_gid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        check(path.parent / temp)
        if _read(dir_fd, path, rules)[0] != original:
            raise _FileChanged
        os.replace(temp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    # The change is in place; a failure here leaves only whether the rename survives a crash in doubt.
    with contextlib.suppress(OSError):
        os.fsync(dir_fd)
