"""`ServerRegistry`: the host's record of which MCP server stands behind which name.

`generate_mcp_sources` records each server it generates a package for, keyed by the package root, in a
file in the user's state directory (`$XDG_STATE_HOME/ipybox`, default `~/.local/state/ipybox`). A tool
server started later, in another process, finds them there, so generated code keeps working across runs
as in ipybox 0.9 while the kernel still only ever sends a server *name*. The file lives outside every
workspace: a sandboxed kernel can't write it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def default_registry_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "ipybox" / "mcp_servers.json"


class ServerRegistry:
    """MCP server parameters by package root (`mcptools/`) and server name, as given (`${VAR}` unresolved).

    Args:
        path: The registry file (default: [default_registry_path][ipybox.tool_exec.registry.default_registry_path]).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_registry_path()

    def register(self, root_dir: Path, server_name: str, server_params: Mapping[str, Any]) -> None:
        """Record (or replace) the parameters of `server_name` for the packages under `root_dir`."""
        with self._locked() as data:
            data.setdefault(_key(root_dir), {})[server_name] = dict(server_params)
            self._write(data)

    def unregister(self, root_dir: Path, server_name: str) -> None:
        with self._locked() as data:
            if data.get(_key(root_dir), {}).pop(server_name, None) is not None:
                self._write(data)

    def servers(self, root_dir: Path) -> dict[str, dict[str, Any]]:
        """The servers recorded for `root_dir`: name -> parameters."""
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        servers: dict[str, dict[str, Any]] = data.get(_key(root_dir), {})
        return servers

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data = json.loads(self.path.read_text())
            except (FileNotFoundError, ValueError):
                data = {}
            yield data

    def _write(self, data: dict[str, Any]) -> None:
        # Atomic: a reader sees the old file or the new one, never half of one.
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".mcp_servers.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _key(root_dir: Path) -> str:
    return str(Path(root_dir).resolve())
