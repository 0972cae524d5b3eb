"""`ToolPins`: a running workspace's MCP tools checked against their pins in `ipybox.lock`.

Every time a server of the workspace starts and lists its tools (at start-up, after an edit, after it
died and a call started it again: `MCPServers.on_listed`), its tools are compared with the lock
(`ipybox.config.tool_lock`):

- A server the lock does not know is pinned as it is served (trust on first use: the person who added
  it to `ipybox.toml` chose it), and the lock is written.
- Otherwise the differences are kept: `pending(server, tool)` says which tools are `changed` or `new`,
  and the approver decides their calls by `[approval] changed_tools` (ask, or deny) until the change is
  accepted (`accept`: `ipybox lock accept`, or the console), which writes the lock. Removed tools and a
  changed version string are reported, and asked about nothing (there is nothing to call).
- `lines()` gives the differences readably, for `ipybox status` and the console.

The lock is written atomically by the host only; kernels cannot write it (`ipybox.lock` is in the
sandbox's `DEFAULT_DENY_WRITE`). A lock that cannot be read (hand-edited into invalid TOML, a symlink)
fails closed: every tool counts as changed until it is fixed or accepted again, and `error` says why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ipybox.config.tool_lock import (
    LOCK_FILE,
    LockDiff,
    LockFileError,
    ServerPins,
    ToolLock,
    accept,
    compare,
    pending_tools,
    pin_server,
    read_lock,
    write_lock,
)

if TYPE_CHECKING:
    import mcp_types as types

__all__ = ["ToolPins"]

logger = logging.getLogger(__name__)


class ToolPins:
    """The pins of a workspace's servers, and how what they serve now differs (see the module).

    Args:
        workspace: The workspace directory (where `ipybox.lock` is).
        servers: The workspace's servers now (read at each listing: an edit adds and removes them); others,
            such as package roots' own, are not pinned. `None`: every server listed is.
    """

    def __init__(self, workspace: Path, servers: Callable[[], Iterable[str]] | None = None) -> None:
        self.path = Path(workspace) / LOCK_FILE
        self._servers = servers
        self._lock_guard = threading.Lock()  # `on_listed` runs on the loop; `accept` may run in a thread
        self.error: str | None = None
        self._lock = self._read()
        self._current: dict[str, ServerPins] = {}
        self._diffs: dict[str, LockDiff] = {}
        self._pending: dict[tuple[str, str], str] = {}

    def _read(self) -> ToolLock:
        try:
            lock = read_lock(self.path)
        except LockFileError as e:
            self.error = f"{e}; until it is fixed (or accepted again), every tool counts as changed"
            logger.error("%s", self.error)
            return ToolLock()
        self.error = None
        return lock

    def on_listed(self, server: str, version: str | None, tools: list[types.Tool]) -> None:
        """A server listed its tools: pin it (first sight) or compare it with its pins."""
        if self._servers is not None and server not in self._servers():
            return
        current = pin_server(version, tools)
        with self._lock_guard:
            self._current[server] = current
            pinned = self._lock.servers.get(server)
            if pinned is None and self.error is None:
                self._write(accept(self._lock, server, current))
                logger.info("pinned %d tools of %r in %s (first seen)", len(current.tools), server, self.path)
                self._settle(server, LockDiff())
                return
            # An unreadable lock: nothing is trusted on first sight either.
            diff = LockDiff(new=sorted(current.tools)) if pinned is None else compare(pinned, current)
            self._settle(server, diff)
        if not diff.clean:
            logger.warning(
                "MCP server %r differs from %s: %s; its changed and new tools are asked about until the "
                "change is accepted (`ipybox lock accept`)",
                server,
                LOCK_FILE,
                "; ".join(line for line in diff.lines() if not line.startswith(" ")),
            )

    def _settle(self, server: str, diff: LockDiff) -> None:
        self._diffs[server] = diff
        for key in [key for key in self._pending if key[0] == server]:
            del self._pending[key]
        for tool, state in pending_tools(diff).items():
            self._pending[(server, tool)] = state

    def _write(self, lock: ToolLock) -> None:
        write_lock(self.path, lock)
        self._lock = lock

    def pending(self, server: str, tool: str) -> str | None:
        """`"changed"` or `"new"` for a tool whose calls wait for its change to be accepted, else `None`."""
        return self._pending.get((server, tool))

    def gate(self, server: str, tool: str) -> str | None:
        """For `MCPServers.tool_gate`: why a call approved before its server restarted is not made."""
        state = self.pending(server, tool)
        if state is None:
            return None
        return (
            f"tool {tool!r} is {state} since it was pinned in {LOCK_FILE} (the server restarted after the "
            "call was approved); the call was not made: call it again to have it decided knowing the change"
        )

    def accept(self, server: str | None = None) -> list[str]:
        """Pin what `server` (or every server that differs) serves now, writing the lock; the servers
        accepted. A server not started in this process can't be accepted (nothing is known of it).

        Raises:
            KeyError: `server` is not one whose tools are known.
            OSError: The lock could not be written (nothing changed).
        """
        with self._lock_guard:
            if server is not None and server not in self._current:
                raise KeyError(server)
            names = [server] if server is not None else sorted(self._current)
            lock = self._lock
            accepted = []
            for name in names:
                if self.error is None and self._diffs.get(name, LockDiff()).clean:
                    continue
                lock = accept(lock, name, self._current[name])
                accepted.append(name)
            if accepted or self.error is not None:
                self._write(lock)
                self.error = None
            for name in accepted:
                self._settle(name, LockDiff())
            return accepted

    def differences(self) -> dict[str, LockDiff]:
        """Each server whose tools differ from its pins, by name (sorted)."""
        return {name: diff for name, diff in sorted(self._diffs.items()) if not diff.clean}

    def lines(self) -> dict[str, list[str]]:
        """`differences()` as readable lines, by server."""
        return {name: diff.lines() for name, diff in self.differences().items()}
