"""The generated packages under `mcptools/` and their generation marker, `mcptools/.ipybox-generation`.

The marker tells running kernels which packages changed since they last looked (see
`ipybox.in_kernel.mcptools_refresh`): `generation` counts package changes, and each server maps to the
generation at which its package was last written.

```json
{"generation": 7, "servers": {"github": 3, "time": 7}}
```

Kernels may write in `mcptools/`, so the host trusts nothing it reads back from there: a server name in
the marker is used only if it is a package name the generator makes (anything else is ignored with a
warning, never used as a path), the marker is read and replaced without following a symlink, and packages
are moved and deleted through a descriptor of `mcptools/` opened without following one. Nothing outside
`mcptools/` is ever moved or deleted; a symlink where a directory should be stops the operation with a
`SymlinkRefusedError` that names it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ipybox.in_kernel.mcptools_refresh import GENERATION_FILE
from ipybox.mcp_apigen.package import (
    SymlinkRefusedError,
    is_package_name,
    make_temp_dir,
    open_directory,
    symlink_refused,
)
from ipybox.safefs import DIR_FLAGS, replace_file

logger = logging.getLogger(__name__)

# A marker is a few bytes per server: a bigger file is not one ipybox wrote.
_MAX_MARKER_BYTES = 1 << 20
_RETIRED = re.compile(r"\.[A-Za-z_][A-Za-z0-9_]*\.removed-[A-Za-z0-9_]+")


@dataclass
class Generations:
    """The generation counter and each server package's generation, as in the marker.

    Example:
        ```python
        generations = Generations.read(mcptools_dir)
        generations.bump(changed=["time"], removed=["old"])
        generations.write(mcptools_dir)
        ```
    """

    generation: int = 0
    servers: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, mcptools_dir: Path) -> Generations:
        """The marker in `mcptools_dir`; empty when there is none or it can't be read (also when it, or
        `mcptools_dir`, is a symlink). Server names that are no package names are left out, with a
        warning."""
        try:
            data = json.loads(_read_marker(mcptools_dir))
            generation = int(data["generation"])
            entries = data["servers"].items()
        except SymlinkRefusedError as e:
            logger.warning("not reading the generation marker: %s", e)
            return cls()
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return cls()
        servers: dict[str, int] = {}
        for name, number in entries:
            if not (isinstance(name, str) and is_package_name(name)):
                logger.warning(
                    "ignored %r in %s: not a package name ipybox generates (a kernel may have written it)",
                    name,
                    mcptools_dir / GENERATION_FILE,
                )
                continue
            with contextlib.suppress(ValueError, TypeError):
                servers[name] = int(number)
        return cls(generation, servers)

    def bump(self, changed: Iterable[str] = (), removed: Iterable[str] = ()) -> int:
        """Count one change: the `changed` packages get the new generation, `removed` ones leave."""
        self.generation += 1
        for name in changed:
            self.servers[name] = self.generation
        for name in removed:
            self.servers.pop(name, None)
        return self.generation

    def write(self, mcptools_dir: Path) -> None:
        """Replace the marker atomically: a kernel reads the old file or the new one, never a part.

        Raises:
            SymlinkRefusedError: `mcptools_dir` is a symlink.
        """
        data = json.dumps({"generation": self.generation, "servers": dict(sorted(self.servers.items()))})
        dir_fd = open_directory(mcptools_dir, create=True)
        try:
            replace_file(dir_fd, GENERATION_FILE, data)
        finally:
            os.close(dir_fd)


def _read_marker(mcptools_dir: Path) -> bytes:
    dir_fd = open_directory(mcptools_dir)
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block
        fd = os.open(GENERATION_FILE, flags, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ValueError(f"{mcptools_dir / GENERATION_FILE} is not a regular file")
        return file.read(_MAX_MARKER_BYTES)


def retire_package(mcptools_dir: Path, server_name: str) -> Path | None:
    """Move the package `mcptools_dir/server_name` out of the import path in one rename (an importer sees
    it whole or not at all); returns where it went, for `delete_retired`, or `None` if there was none.

    A `server_name` that is no package name the generator makes is refused with a warning (`None`):
    nothing outside `mcptools_dir` is ever moved.

    Raises:
        SymlinkRefusedError: `mcptools_dir` or the package is a symlink (nothing is moved).
    """
    if not is_package_name(server_name):
        logger.warning(
            "not removing %r from %s: it is no package name ipybox generates", server_name, mcptools_dir
        )
        return None
    try:
        dir_fd = open_directory(mcptools_dir)
    except FileNotFoundError:
        return None
    try:
        try:
            info = os.stat(server_name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(info.st_mode):
            target = None
            with contextlib.suppress(OSError):
                target = os.readlink(server_name, dir_fd=dir_fd)
            raise symlink_refused(mcptools_dir / server_name, "remove", target)
        # A name starting with "." is no importable package name.
        retired = make_temp_dir(dir_fd, f".{server_name}.removed-")
        retired_fd = os.open(retired, DIR_FLAGS, dir_fd=dir_fd)
        try:
            os.rename(server_name, server_name, src_dir_fd=dir_fd, dst_dir_fd=retired_fd)
        except FileNotFoundError:
            os.rmdir(retired, dir_fd=dir_fd)
            return None
        finally:
            os.close(retired_fd)
        return mcptools_dir / retired
    finally:
        os.close(dir_fd)


def delete_retired(retired: Path) -> None:
    """Delete what `retire_package` moved away, inside the directory it was moved in.

    Raises:
        ValueError: `retired` is not named as `retire_package` names what it moves away.
        SymlinkRefusedError: Its directory was replaced by a symlink since.
    """
    if not _RETIRED.fullmatch(retired.name):
        raise ValueError(
            f"not deleting {retired}: retire_package did not make it (retired packages are named "
            "`.<name>.removed-<random>`)"
        )
    dir_fd = open_directory(retired.parent)
    try:
        shutil.rmtree(retired.name, dir_fd=dir_fd, ignore_errors=True)
    finally:
        os.close(dir_fd)
