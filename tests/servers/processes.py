"""Finding the MCP server processes a test started, among the many the session runs.

A test tags the servers it starts (`tagged`) and finds them by that tag in their environment (`pids`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ipybox import process

TAG_ENV = "IPYBOX_TEST_TAG"


def tagged(server_params: dict[str, Any], tag: str) -> dict[str, Any]:
    """`server_params` with `tag` in the server's environment."""
    return {**server_params, "env": {**server_params.get("env", {}), TAG_ENV: tag}}


def pids(tag: str) -> list[int]:
    """Processes below this one started with `tag` (see `tagged`)."""
    marker = f"{TAG_ENV}={tag}".encode()
    found = []
    for pid in process.descendants(os.getpid()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            found.append(pid)
    return found


def pids_anywhere(tag: str) -> list[int]:
    """Every process on the machine started with `tag`, also those of a detached `ipybox up`."""
    marker = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            found.append(int(entry.name))
    return found
