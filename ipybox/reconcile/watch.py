"""Watching a workspace's `ipybox.toml` and `.env` for edits, one notice per burst of saves; and its
output parsers (`mcpparse/<server>/<module>.py`), one notice per burst naming the servers concerned.

Editors save by writing a new file and renaming it over the old one, so the directory is watched, not the
file. A save is often several events (write, rename, chmod), and tools write in bursts: a notice comes
only once both files have stopped changing for a quiet period.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from watchfiles import Change, awatch

from ipybox.config.loading import CONFIG_FILE

logger = logging.getLogger(__name__)

DOTENV_FILE = ".env"
WATCHED_FILES = frozenset({CONFIG_FILE, DOTENV_FILE})

# watchfiles groups events until none came for a step (ms); `debounce` (ms) caps a group's length.
_STEP_MS = 30
_DEBOUNCE_MS = 1000
# A file that changes for longer than this is read anyway: a slow writer must not hold back reloads.
_MAX_SETTLE = 5.0


@dataclass(frozen=True)
class Snapshot:
    """The contents of `ipybox.toml` and `.env` (`None`: missing or unreadable), and their file stamps
    (inode, modification time, size), which tell a new save of the same contents from an old event."""

    config: bytes | None
    dotenv: bytes | None
    stamps: tuple[tuple[int, int, int] | None, ...] = ()

    @classmethod
    def read(cls, workspace_dir: Path) -> Snapshot:
        """Read both files of `workspace_dir` now."""
        paths = (workspace_dir / CONFIG_FILE, workspace_dir / DOTENV_FILE)
        stamps = tuple(_stamp(path) for path in paths)
        return cls(_read(paths[0]), _read(paths[1]), stamps)

    def same_contents(self, other: Snapshot | None) -> bool:
        """Whether `other` holds the same contents (saved at another time or not)."""
        return other is not None and (self.config, self.dotenv) == (other.config, other.dotenv)


async def settled_edits(
    workspace_dir: Path, *, quiet: float = 0.15, stop_event: asyncio.Event | None = None
) -> AsyncIterator[Snapshot]:
    """Yield the contents of `ipybox.toml` and `.env` after each burst of edits, once they were unchanged
    for `quiet` seconds. Ends when `stop_event` is set.

    Example:
        ```python
        async for snapshot in settled_edits(Path("my-workspace")):
            print("edited:", snapshot.config is not None)
        ```
    """
    async for _ in awatch(
        workspace_dir,
        watch_filter=_is_watched,
        recursive=False,  # generated packages live below: their writes are no edits
        step=_STEP_MS,
        debounce=_DEBOUNCE_MS,
        stop_event=stop_event,
    ):
        yield await wait_until_quiet(workspace_dir, quiet)


async def wait_until_quiet(workspace_dir: Path, quiet: float) -> Snapshot:
    """The contents of both files once they have not changed for `quiet` seconds (at most a few seconds
    of waiting).

    Contents are compared as well as file stamps: a modification time can stay the same for saves
    within one timestamp tick.
    """
    poll = max(quiet / 5, 0.01)
    snapshot = Snapshot.read(workspace_dir)
    stable_since = started = time.monotonic()
    while time.monotonic() - stable_since < quiet and time.monotonic() - started < _MAX_SETTLE:
        await asyncio.sleep(poll)
        current = Snapshot.read(workspace_dir)
        if current != snapshot:
            snapshot, stable_since = current, time.monotonic()
    return snapshot


async def parser_edits(
    directory: Path, *, quiet: float = 0.15, stop_event: asyncio.Event | None = None
) -> AsyncIterator[set[str]]:
    """Yield the servers whose parsers in `directory` (`<server>/<module>.py` files, or a whole `<server>`
    directory) were added, changed or removed, after each burst of changes, once none came for `quiet`
    seconds. Anything else there (`__pycache__`, editors' temporary files) is no edit. Ends when
    `stop_event` is set.

    `directory` is made if it is missing. If it is a symlink (or can't be made) nothing is watched, with
    a warning: parsers are looked for without following one (`ipybox.mcp_apigen.parsers`).

    Example:
        ```python
        async for servers in parser_edits(Path("my-workspace/mcpparse")):
            print("parsers changed:", servers)
        ```
    """
    if not await asyncio.to_thread(_watchable, directory):
        await (stop_event or asyncio.Event()).wait()
        return
    async for changes in awatch(
        directory,
        watch_filter=lambda change, path: _parser_server(directory, path) is not None,
        recursive=True,
        step=max(int(quiet * 1000), _STEP_MS),  # a burst of saves is one notice
        debounce=int(_MAX_SETTLE * 1000),
        stop_event=stop_event,
    ):
        servers = {server for _, path in changes if (server := _parser_server(directory, path)) is not None}
        if servers:
            yield servers


def _watchable(directory: Path) -> bool:
    """Make `directory` if missing; whether it is a directory that is no symlink (else say why)."""
    try:
        directory.mkdir(exist_ok=True)
        if directory.is_symlink():
            raise NotADirectoryError(f"{directory} is a symlink")
    except OSError as e:
        logger.warning("not following edits of output parsers in %s: %s", directory, e)
        return False
    return True


def _parser_server(directory: Path, path: str) -> str | None:
    """The server a changed `path` under `directory` is a parser (or the parser directory) of."""
    try:
        parts = Path(path).relative_to(directory).parts
    except ValueError:
        return None
    if not parts or not parts[0].isidentifier() or parts[0] == "__pycache__":
        return None
    if len(parts) == 1 or (len(parts) == 2 and parts[1].endswith(".py")):
        return parts[0]
    return None


def _is_watched(change: Change, path: str) -> bool:
    return Path(path).name in WATCHED_FILES


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
