"""What a running workspace leaves in its state directory (`.ipybox/` by default) for the CLI and for
applications that attach: where its endpoints are and their tokens (`state.json`, mode 0600), the lock
that makes a second `ipybox up` refuse to start, its log, and the private directories it made elsewhere
(`run.json`).

A supervisor killed with SIGKILL stops nothing and removes nothing: its run directory of sockets and its
gateway's runtime directory stay in `$TMPDIR`, and `state.json` names a dead process. It records those
directories in `run.json` as it makes them, so the next `ipybox up`, once it holds the lock (which proves
that no supervisor of this workspace is alive: the OS released the killed one's), removes them with
`remove_leftovers`. Only what `run.json` names is removed, and only directories named `ipybox-*` of the
current user: a `run.json` that is not ipybox's can't make `up` delete anything else.

A kernel of an earlier `CodeExecutor(sandbox=True)` session may have created the state directory, with
symlinks or hard links in it, before any `ipybox up` (often run as root) made it. So the host never
follows a symlink there and writes only its own files:

- the state directory must be a real directory owned by the current user (else `StateDirError`, saying
  what is wrong and what to do); it is created, and narrowed to, mode 0700, and so are `logs/` and
  `outputs/` in it; `ipybox up` refuses a state directory with a symlink, a hard-linked file or anything
  but files and directories among its entries, or in `logs/`;
- every file in it is opened through directory descriptors with `O_NOFOLLOW` (and `O_NONBLOCK`, so a
  planted FIFO can't hang the supervisor); a file written must be a regular file of ours with a single
  link, and gets mode 0600; logs are appended to (`O_APPEND`), `state.json` is replaced atomically by a
  new file renamed over it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ValidationError

from ipybox import process
from ipybox.config import CONFIG_FILE, ConfigError, load_config
from ipybox.config.schema import WORKSPACE_SCHEMA, schema_path
from ipybox.errors import IpyboxError, UnsafePathError, WorkspaceError
from ipybox.safefs import DIR_FLAGS, replace_file

logger = logging.getLogger(__name__)


class AlreadyRunningError(WorkspaceError, RuntimeError):
    """Raised when a supervisor already runs for the workspace."""


class NotRunningError(WorkspaceError, RuntimeError):
    """Raised when no supervisor runs for the workspace."""


class StateDirError(UnsafePathError, ValueError):
    """The state directory, or an entry in it, is not what ipybox makes there: a symlink, a hard link,
    not a directory or regular file, or owned by another user."""


class SupervisorState(BaseModel):
    """`state.json`: how to reach a running workspace (readable by its owner only)."""

    pid: int
    workspace: str
    started_at: str
    control_socket: str
    control_token: str
    gateway_socket: str  # "" for a remote gateway
    gateway_token: str
    gateway_url: str | None = None  # a remote gateway's ([kernel.gateway]): applications attach there
    gateway_ca_file: str | None = None
    log_file: str
    mcp_url: str | None = None
    mcp_token: str | None = None
    ready: bool = False  # false while still starting (servers being generated)


@dataclass(frozen=True)
class StatePaths:
    """The files of a workspace's state directory."""

    dir: Path

    @property
    def state(self) -> Path:
        return self.dir / "state.json"

    @property
    def lock(self) -> Path:
        return self.dir / "supervisor.lock"

    @property
    def log(self) -> Path:
        return self.dir / "logs" / "supervisor.log"

    @property
    def run_record(self) -> Path:
        return self.dir / "run.json"

    @property
    def audit(self) -> Path:
        return self.dir / "audit.jsonl"

    @property
    def outputs(self) -> Path:
        """Where the MCP endpoint saves complete outputs too long to return."""
        return self.dir / "outputs"

    @classmethod
    def of(cls, workspace: Path) -> StatePaths:
        """The state directory a workspace's `ipybox.toml` names (`.ipybox` when it can't be read)."""
        state_dir = ".ipybox"
        with contextlib.suppress(ConfigError):
            state_dir = load_config(workspace / CONFIG_FILE).workspace.state_dir
        return cls(workspace / state_dir)


class SupervisorLock:
    """An exclusive lock on the state directory, held while the supervisor runs (released by the OS if
    it dies, so a crashed supervisor never blocks the next `up`)."""

    def __init__(self, paths: StatePaths) -> None:
        self.paths = paths
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Prepare the state directory (`prepare_state_dir`) and take the lock.

        Raises:
            AlreadyRunningError: Another supervisor holds it.
            StateDirError: The state directory is not one ipybox can trust.
        """
        prepare_state_dir(self.paths)
        fd = open_state_file(self.paths, "supervisor.lock", os.O_RDWR | os.O_CREAT)
        file = os.fdopen(fd, "r+")  # held open for the supervisor's lifetime
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            pid = file.read().strip() or "?"
            file.close()
            raise AlreadyRunningError(
                f"ipybox is already running in {self.paths.dir.parent} (pid {pid}): "
                "`ipybox status` shows it, `ipybox down` stops it"
            ) from None
        file.seek(0)
        file.truncate()
        file.write(str(os.getpid()))
        file.flush()
        self._file = file

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def write_state(paths: StatePaths, state: SupervisorState) -> None:
    """Write `state.json` atomically, readable by the owner only: a new file, renamed over the old one (or
    over whatever a kernel left there, never through it)."""
    _replace_state_file(paths, paths.state.name, state)


def _replace_state_file(paths: StatePaths, name: str, model: BaseModel) -> None:
    dir_fd = open_state_dir(paths)
    try:
        replace_file(dir_fd, name, model.model_dump_json(indent=2))
    finally:
        os.close(dir_fd)


def open_state_dir(paths: StatePaths) -> int:
    """A descriptor of the state directory for writing in it (never through a symlink; it must be ours,
    and is narrowed to 0700); the caller closes it. `prepare_state_dir` makes it first.

    Raises:
        StateDirError: It is a symlink, not a directory, or another user's.
    """
    return _open_dir(paths.dir, paths.dir, write=True)


def read_state(workspace: Path) -> SupervisorState:
    """The state of the supervisor running for `workspace`.

    Raises:
        NotRunningError: None runs (no state file, or its process is gone).
    """
    paths = StatePaths.of(workspace)
    try:
        fd = open_state_file(paths, paths.state.name, os.O_RDONLY)
        with os.fdopen(fd, "rb") as file:
            text = file.read(_MAX_STATE_BYTES)
        state = SupervisorState.model_validate(json.loads(text))
    except (OSError, ValueError, ValidationError):
        raise NotRunningError(f"ipybox is not running in {workspace} (start it with `ipybox up`)") from None
    if not process.is_alive(state.pid):
        raise NotRunningError(
            f"ipybox is not running in {workspace} (its supervisor, pid {state.pid}, is gone; "
            "start it again with `ipybox up`)"
        )
    return state


class RunRecord(BaseModel):
    """`run.json`: the private directories a running supervisor made outside the state directory."""

    pid: int
    dirs: list[str]


# What a supervisor names its private directories (the run directory `ipybox-ws-*`, the gateway's
# `ipybox-gateway-*`): nothing else is removed as a leftover.
_PRIVATE_DIR_PREFIX = "ipybox-"


def record_run_dirs(paths: StatePaths, dirs: Iterable[Path]) -> None:
    """Record (replacing the record) the private directories the running supervisor made outside the state
    directory, for `remove_leftovers` to remove should it be killed before it removes them itself."""
    record = RunRecord(pid=os.getpid(), dirs=[str(path) for path in dirs])
    _replace_state_file(paths, paths.run_record.name, record)


def forget_run_dirs(paths: StatePaths) -> None:
    """Remove `run.json` (the supervisor removed its directories itself)."""
    with contextlib.suppress(OSError):
        paths.run_record.unlink(missing_ok=True)


def remove_leftovers(paths: StatePaths) -> list[str]:
    """Remove what a killed supervisor of this workspace left: the directories `run.json` names, and
    `run.json` and `state.json` themselves. Call it holding the `SupervisorLock`, which proves that the
    supervisor that wrote them is gone.

    Returns:
        What was removed (paths), for the log.
    """
    removed: list[str] = []
    record: RunRecord | None = None
    try:
        fd = open_state_file(paths, paths.run_record.name, os.O_RDONLY)
        with os.fdopen(fd, "rb") as file:
            record = RunRecord.model_validate_json(file.read(_MAX_STATE_BYTES))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, ValidationError) as e:
        logger.warning("ignoring %s, which is not a record ipybox wrote: %s", paths.run_record, e)
    for name in record.dirs if record is not None else []:
        if _remove_private_dir(Path(name)):
            removed.append(name)
    for path in (paths.run_record, paths.state):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(str(path))
    return removed


def _remove_private_dir(path: Path) -> bool:
    """Remove `path` if it is a directory a supervisor makes: absolute, named `ipybox-*`, a real directory
    (not a symlink) of the current user."""
    if not path.is_absolute() or not path.name.startswith(_PRIVATE_DIR_PREFIX):
        logger.warning("not removing %s: ipybox makes no directory of that name", path)
        return False
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        logger.warning("not removing %s: %s", path, e)
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        logger.warning("not removing %s: not a directory of this user's", path)
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


# state.json is a few hundred bytes: more is not one ipybox wrote.
_MAX_STATE_BYTES = 1 << 20
_SUBDIRS = ("logs", "outputs")
# The state directory's own `.gitignore`: git ignores the whole directory, wherever it is.
_GITIGNORE = b"# ipybox's state (tokens, logs, outputs): never committed. Written by ipybox.\n*\n"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


def prepare_state_dir(paths: StatePaths) -> None:
    """Create the state directory, its `.gitignore` (`*`: git never adds it), its copy of the installed
    JSON Schema of `ipybox.toml` (which `#:schema ./.ipybox/ipybox.schema.json` names; rewritten when the
    installed one differs) and its `logs/` and `outputs/` (mode 0700), or check and narrow them:
    real directories of ours, holding no symlinks, hard-linked files, FIFOs, sockets or devices (`outputs/`:
    no symlinks).

    Raises:
        StateDirError: Something in it is not what ipybox makes there; the message says what to do.
    """
    paths.dir.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(paths.dir, 0o700)
    dir_fd = _open_dir(paths.dir, paths.dir, write=True)
    try:
        _check_entries(paths, dir_fd, paths.dir, files=True)
        # Never committed, whatever the project's own .gitignore says (and without editing it).
        with contextlib.suppress(FileExistsError):
            fd = os.open(
                ".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                dir_fd=dir_fd,
            )  # fmt: skip
            try:
                os.write(fd, _GITIGNORE)
            finally:
                os.close(fd)
        _refresh_schema(dir_fd)
        for name in _SUBDIRS:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=dir_fd)
            sub_fd = _open_dir(name, paths.dir / name, write=True, dir_fd=dir_fd, state_dir=paths.dir)
            try:
                _check_entries(paths, sub_fd, paths.dir / name, files=name == "logs")
            finally:
                os.close(sub_fd)
    finally:
        os.close(dir_fd)


def _refresh_schema(dir_fd: int) -> None:
    """Make the state directory's `ipybox.schema.json` the installed schema (for editors: never fatal)."""
    name = Path(WORKSPACE_SCHEMA).name
    try:
        installed = schema_path().read_bytes()
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            current = None
        else:
            with os.fdopen(fd, "rb") as file:
                current = file.read(len(installed) + 1)
        if current != installed:
            replace_file(dir_fd, name, installed, 0o644)
    except (OSError, IpyboxError) as e:  # an editor's help; the workspace runs without it
        logger.warning("the workspace's copy of the ipybox.toml schema could not be written: %s", e)


def open_state_file(paths: StatePaths, name: str, flags: int) -> int:
    """Open the file `name` (relative, e.g. `logs/supervisor.log`) in the state directory without following
    a symlink anywhere below the state directory; returns its descriptor.

    With `O_CREAT`, missing directories on the way are created (0700) and a new file gets mode 0600. A file
    opened for writing must be a regular file of ours with a single link (narrowed to mode 0600). `O_TRUNC`
    is not accepted: truncate after this checked the file (`os.ftruncate`).

    Raises:
        StateDirError: A symlink, hard link or other file ipybox does not make is in the way.
        FileNotFoundError: It does not exist (without `O_CREAT`).
    """
    if flags & os.O_TRUNC:
        raise ValueError("O_TRUNC would truncate before the file is checked: use os.ftruncate")
    write = bool(flags & _WRITE_FLAGS)
    create = bool(flags & os.O_CREAT)
    *dirs, filename = name.split("/")
    dir_fd = _open_dir(paths.dir, paths.dir, write=write)
    try:
        where = paths.dir
        for part in dirs:
            where = where / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=dir_fd)
            sub_fd = _open_dir(part, where, write=write, dir_fd=dir_fd, state_dir=paths.dir)
            os.close(dir_fd)
            dir_fd = sub_fd
        path = where / filename
        try:
            fd = os.open(filename, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EMLINK, errno.ENOTDIR, errno.EISDIR):
                raise _untrusted(paths, path, _entry_problem(filename, dir_fd)) from None
            raise
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _untrusted(paths, path, "is not a regular file")
        if write:
            if info.st_nlink != 1:
                raise _untrusted(paths, path, f"has {info.st_nlink} hard links (ipybox's files have one)")
            if info.st_uid != os.geteuid():
                raise _untrusted(paths, path, _owner_problem(info.st_uid), foreign=True)
            if stat.S_IMODE(info.st_mode) & 0o077:
                os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


class StateLogHandler(logging.FileHandler):
    """A `FileHandler` appending to `logs/supervisor.log` in the state directory, opened (and reopened
    after a `close()`, as by `logging.config.dictConfig`) by `open_state_file`: `O_APPEND`, never through a
    symlink, mode 0600.

    Raises:
        StateDirError: The log can't be opened safely.
    """

    def __init__(self, paths: StatePaths) -> None:
        self._paths = paths
        super().__init__(paths.log, encoding="utf-8", delay=True)
        self.stream = self._open()

    def _open(self) -> io.TextIOWrapper:
        fd = open_state_file(self._paths, "logs/supervisor.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        return io.TextIOWrapper(io.FileIO(fd, "a"), encoding="utf-8", errors=self.errors)


def _open_dir(
    path: Path | str, shown: Path, *, write: bool, dir_fd: int | None = None, state_dir: Path | None = None
) -> int:
    """A descriptor of the directory `path` (relative to `dir_fd` if given), never through a symlink; for
    writing, it must be ours, and is narrowed to 0700."""
    state_dir = state_dir or shown
    try:
        fd = os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise _untrusted_dir(state_dir, shown, _entry_problem(path, dir_fd)) from None
        raise
    try:
        if write:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid():
                raise _untrusted_dir(state_dir, shown, _owner_problem(info.st_uid), foreign=True)
            if stat.S_IMODE(info.st_mode) & 0o077:
                os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_entries(paths: StatePaths, dir_fd: int, where: Path, *, files: bool) -> None:
    """Refuse symlinks among the entries of the directory `dir_fd` (with `files`, also hard-linked files
    and anything but files and directories)."""
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            path = where / entry.name
            if entry.is_symlink():
                raise _untrusted(paths, path, _entry_problem(entry.name, dir_fd))
            if not files:
                continue
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise _untrusted(paths, path, "is neither a regular file nor a directory")
            if info.st_nlink != 1:
                raise _untrusted(paths, path, f"has {info.st_nlink} hard links (ipybox's files have one)")


def _entry_problem(name: Path | str, dir_fd: int | None) -> str:
    """What is wrong with the entry `name` that could not be opened as what ipybox makes there."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "could not be opened as what ipybox makes there"
    if stat.S_ISLNK(info.st_mode):
        target = ""
        with contextlib.suppress(OSError):
            target = f" (to {os.readlink(name, dir_fd=dir_fd)})"
        return f"is a symlink{target}, which ipybox never makes there"
    if stat.S_ISDIR(info.st_mode):
        return "is a directory where ipybox keeps a file"
    if stat.S_ISREG(info.st_mode):
        return "is a file where ipybox keeps a directory"
    return "is neither a regular file nor a directory"


def _owner_problem(uid: int) -> str:
    return f"is owned by uid {uid}, not by you (uid {os.geteuid()})"


def _untrusted(paths: StatePaths, path: Path, problem: str, *, foreign: bool = False) -> StateDirError:
    return _untrusted_dir(paths.dir, path, problem, foreign=foreign)


def _untrusted_dir(state_dir: Path, path: Path, problem: str, *, foreign: bool = False) -> StateDirError:
    """The error for `path`, in or being the state directory: what is wrong (`problem`, "is ...") and what
    to do (`foreign`: it belongs to another user)."""
    todo = f"check what it is, then remove {state_dir} (`rm -r {state_dir}`; ipybox makes it anew) and retry"
    if foreign:
        return StateDirError(f"ipybox will not use {path}: it {problem}; run ipybox as that user, or {todo}")
    return StateDirError(
        f"ipybox will not use {path}: it {problem} (a kernel that could write in the workspace may have "
        f"made it); {todo}"
    )
