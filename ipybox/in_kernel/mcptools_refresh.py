"""Fresh tool packages in a running kernel: packages under `mcptools/` that were generated, regenerated or
removed after the kernel imported them are imported anew by the next cell, without a kernel restart.

Whoever generates packages (the workspace reconciler) writes a generation marker,
`<mcptools_dir>/.ipybox-generation`, replaced atomically after every package change:

```json
{"generation": 7, "servers": {"github": 3, "time": 7}}
```

Before each cell the kernel stats the marker (one `os.stat`; the file is read only when it changed) and,
for every server whose generation differs from the one it saw last (new, regenerated or removed), drops
`mcptools.<server>` and its submodules from `sys.modules`, and the server's output parsers
(`mcpparse.<server>...`, which generated modules import; see `ipybox.mcp_apigen.parsers`), and clears the
import system's directory caches, so the next `import mcptools.<server>...` loads the files on disk,
an edited parser included. Names a cell bound earlier (`from
mcptools.time import get_current_time`) keep the old code until imported again.

This module runs inside kernels: standard library only, cheap to import. `kernel_main` loads it as an
IPython extension when `IPYBOX_MCPTOOLS_DIR` is set; by hand:

```python
%load_ext ipybox.in_kernel.mcptools_refresh  # reads IPYBOX_MCPTOOLS_DIR
```
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

MCPTOOLS_DIR_ENV = "IPYBOX_MCPTOOLS_DIR"
"""Environment variable naming a kernel's `mcptools` directory (absolute); unset: no refresh."""

GENERATION_FILE = ".ipybox-generation"
"""Name of the generation marker inside the `mcptools` directory."""

PARSERS_PACKAGE = "mcpparse"
"""The package of output parsers, a directory next to the `mcptools` directory: `mcpparse/<server>/<tool
module>.py` (the one name `ipybox.mcp_apigen.parsers` and `ipybox.codeact.layout` use too)."""

EXTENSION = __name__
"""This module as an IPython extension name (`%load_ext`, `--IPKernelApp.extra_extensions`)."""

# (inode, mtime_ns, size): the marker is replaced by rename, so a new version is a new inode even when
# written within one timestamp tick with the same size.
_Signature = tuple[int, int, int]


class _Events(Protocol):
    def register(self, event: str, function: Callable[..., Any]) -> None: ...


class Shell(Protocol):
    """What `install` needs of an IPython `InteractiveShell`."""

    @property
    def events(self) -> _Events: ...


class MCPToolsRefresher:
    """Drops the modules of tool packages that changed on disk from `sys.modules`; called before each cell.

    Args:
        mcptools_dir: The directory holding the packages and the generation marker. Its name is the
            top-level package name (`mcptools`); its parent must be importable (the kernel's working
            directory usually is).

    Example:
        ```python
        refresher = MCPToolsRefresher("/work/ws/mcptools")
        refresher.refresh()  # ["time"] after `mcptools/time` was regenerated
        ```
    """

    def __init__(self, mcptools_dir: str | Path) -> None:
        self.mcptools_dir = Path(mcptools_dir)
        self.package = self.mcptools_dir.name
        self.marker = self.mcptools_dir / GENERATION_FILE
        self._signature: _Signature | None = None
        self._generations: dict[str, int] = {}
        self.refresh()

    def __call__(self, info: object = None) -> None:
        """The `pre_run_cell` callback (IPython passes the cell's `ExecutionInfo`)."""
        try:
            self.refresh()
        except Exception:
            # The cell must run whatever state the marker is in; the next cell tries again.
            self._signature = None

    @property
    def generations(self) -> dict[str, int]:
        """The generation of each server package, as the marker said when last read."""
        return dict(self._generations)

    def refresh(self) -> list[str]:
        """Forget the modules of packages whose generation changed since the last call.

        Returns:
            The servers whose packages were new, regenerated or removed (sorted); empty when the marker
            did not change.
        """
        signature = _stat(self.marker)
        if signature == self._signature:
            return []
        self._signature = signature
        generations = _read_generations(self.marker) if signature is not None else {}
        known = self._generations
        stale = sorted(
            name for name in known.keys() | generations.keys() if known.get(name) != generations.get(name)
        )
        self._generations = generations
        # Directory listings are cached by the path finders; a package swapped in within one mtime tick
        # of the directory would otherwise stay invisible.
        importlib.invalidate_caches()
        for name in stale:
            self._forget(name)
        return stale

    def _forget(self, server_name: str) -> None:
        # A regenerated package imports its parsers again: an edited parser is read from disk too.
        forget_modules([f"{package}.{server_name}" for package in (self.package, PARSERS_PACKAGE)])


def forget_modules(names: Iterable[str]) -> list[str]:
    """Drop the modules `names` and their submodules from `sys.modules`, and each name from its parent
    package's attributes, so the next import of any of them loads it anew.

    Returns:
        The module names dropped from `sys.modules` (sorted).
    """
    dropped: list[str] = []
    for name in names:
        prefix = name + "."
        for module_name in [m for m in sys.modules if m == name or m.startswith(prefix)]:
            del sys.modules[module_name]
            dropped.append(module_name)
        # `from mcptools import time` takes the parent's attribute when there is one, without importing.
        parent_name, _, child = name.rpartition(".")
        parent = sys.modules.get(parent_name) if parent_name else None
        if parent is not None and child in vars(parent):
            delattr(parent, child)
    return sorted(dropped)


def install(ip: Shell, mcptools_dir: str | Path) -> MCPToolsRefresher:
    """Refresh the tool packages under `mcptools_dir` before each cell the shell `ip` runs.

    Example:
        ```python
        install(get_ipython(), "/work/ws/mcptools")
        ```
    """
    refresher = MCPToolsRefresher(mcptools_dir)
    ip.events.register("pre_run_cell", refresher)
    return refresher


def load_ipython_extension(ip: Shell) -> None:
    """The IPython extension entry point: `install` for the directory in `IPYBOX_MCPTOOLS_DIR`, if set."""
    mcptools_dir = os.environ.get(MCPTOOLS_DIR_ENV)
    if mcptools_dir:
        install(ip, mcptools_dir)


def _stat(path: Path) -> _Signature | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _read_generations(marker: Path) -> dict[str, int]:
    try:
        data = json.loads(marker.read_bytes())
        servers = data["servers"]
        return {str(name): int(generation) for name, generation in servers.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        # Unreadable (it is replaced atomically, so this is not a half-written file): every package counts
        # as changed, which costs only re-imports.
        return {}
