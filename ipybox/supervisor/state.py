"""What a running workspace leaves in its state directory (`.ipybox/` by default) for the CLI and for
applications that attach: where its endpoints are and their tokens (`state.json`, mode 0600), the lock
that makes a second `ipybox up` refuse to start, and its log."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ValidationError

from ipybox import process
from ipybox.workspace import CONFIG_FILE, ConfigError, load_config


class AlreadyRunningError(RuntimeError):
    """Raised when a supervisor already runs for the workspace."""


class NotRunningError(RuntimeError):
    """Raised when no supervisor runs for the workspace."""


class SupervisorState(BaseModel):
    """`state.json`: how to reach a running workspace (readable by its owner only)."""

    pid: int
    workspace: str
    started_at: str
    control_socket: str
    control_token: str
    gateway_socket: str
    gateway_token: str
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
    def audit(self) -> Path:
        return self.dir / "audit.jsonl"

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
        """Raises:
        AlreadyRunningError: Another supervisor holds it."""
        self.paths.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        file = open(self.paths.lock, "a+")  # noqa: SIM115 - held open for the supervisor's lifetime
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
    """Write `state.json` atomically, readable by the owner only."""
    fd, tmp = tempfile.mkstemp(dir=paths.dir, prefix=".state-")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(state.model_dump_json(indent=2))
        os.replace(tmp, paths.state)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_state(workspace: Path) -> SupervisorState:
    """The state of the supervisor running for `workspace`.

    Raises:
        NotRunningError: None runs (no state file, or its process is gone).
    """
    paths = StatePaths.of(workspace)
    try:
        state = SupervisorState.model_validate(json.loads(paths.state.read_text()))
    except (OSError, ValueError, ValidationError):
        raise NotRunningError(f"ipybox is not running in {workspace} (start it with `ipybox up`)") from None
    if not process.is_alive(state.pid):
        raise NotRunningError(
            f"ipybox is not running in {workspace} (its supervisor, pid {state.pid}, is gone; "
            "start it again with `ipybox up`)"
        )
    return state
