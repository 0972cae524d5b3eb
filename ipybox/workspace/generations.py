"""The generated packages under `mcptools/` and their generation marker, `mcptools/.ipybox-generation`.

The marker tells running kernels which packages changed since they last looked (see
`ipybox.code_exec.mcptools_refresh`): `generation` counts package changes, and each server maps to the
generation at which its package was last written.

```json
{"generation": 7, "servers": {"github": 3, "time": 7}}
```
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ipybox.code_exec.mcptools_refresh import GENERATION_FILE


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
        """The marker in `mcptools_dir`; empty when there is none or it can't be read."""
        try:
            data = json.loads((mcptools_dir / GENERATION_FILE).read_bytes())
            servers = {str(name): int(number) for name, number in data["servers"].items()}
            return cls(int(data["generation"]), servers)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return cls()

    def bump(self, changed: Iterable[str] = (), removed: Iterable[str] = ()) -> int:
        """Count one change: the `changed` packages get the new generation, `removed` ones leave."""
        self.generation += 1
        for name in changed:
            self.servers[name] = self.generation
        for name in removed:
            self.servers.pop(name, None)
        return self.generation

    def write(self, mcptools_dir: Path) -> None:
        """Replace the marker atomically: a kernel reads the old file or the new one, never a part."""
        mcptools_dir.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"generation": self.generation, "servers": dict(sorted(self.servers.items()))})
        fd, temp = tempfile.mkstemp(prefix=f"{GENERATION_FILE}.", suffix=".tmp", dir=mcptools_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(data)
            os.replace(temp, mcptools_dir / GENERATION_FILE)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise


def retire_package(mcptools_dir: Path, server_name: str) -> Path | None:
    """Move the package `mcptools_dir/server_name` out of the import path in one rename (an importer sees
    it whole or not at all); returns where it went, for `delete_retired`, or `None` if there was none.
    """
    package = mcptools_dir / server_name
    if not package.exists():
        return None
    # A name starting with "." is no importable package name.
    retired = Path(tempfile.mkdtemp(prefix=f".{server_name}.removed-", dir=mcptools_dir))
    try:
        os.rename(package, retired / server_name)
    except FileNotFoundError:
        retired.rmdir()
        return None
    return retired


def delete_retired(retired: Path) -> None:
    """Delete what `retire_package` moved away."""
    shutil.rmtree(retired, ignore_errors=True)
