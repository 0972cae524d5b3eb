"""`ResourceLimits`: what one kernel (or one stdio MCP server) may use, as `ipybox.toml`'s `[kernel.limits]`
and `CodeExecutor(limits=...)` spell it.

```toml
[kernel.limits]
memory = "4GiB"        # resident memory of the kernel and everything it starts (and its /tmp)
cpus = 1.5             # CPU time, in CPUs' worth (a hard cap, not a share)
processes = 256        # processes and threads it may have at once
open_files = 4096      # open file descriptors per process
file_size = "10GiB"    # size of each file a process writes (not a disk quota: see `ipybox doctor`)
tmp = "1GiB"           # size of a sandboxed kernel's private /tmp
disk = "20GiB"         # what the workspace directory tree may hold (a project quota; not set by default)
```

A value of `"unlimited"` (TOML has no null) lifts a limit that a default would set. Byte sizes are numbers
of bytes or strings with a unit (`"512MiB"`, `"4GiB"`, `"2 GB"`).

The workspace's defaults (`WorkspaceLimits`) are on: a runaway cell must not take the host's memory, which
the kernel OOM killer would then take back from any process, the supervisor included. The SDK's
`CodeExecutor` sets none unless asked (`ResourceLimits()`), as ipybox 0.9 did.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, WithJsonSchema, field_validator

Enforce = Literal["auto", "cgroup", "rlimit"]
"""How limits are enforced: `auto` picks the best the machine offers (cgroup v2, then cgroup v1, then
`setrlimit`); `cgroup` and `rlimit` insist on one (an error where it is not available)."""

UNLIMITED = "unlimited"
LIMIT_NAMES = ("memory", "cpus", "processes", "open_files", "file_size", "tmp", "disk")
"""The limits, in the order they are reported."""

GiB = 1024**3
_SIZE = re.compile(r"\s*\d+(\.\d+)?\s*[A-Za-z]{0,3}\s*")


# What editors check `ipybox.toml` against: a number, a size string, or "unlimited" (TOML has no null).
_UNLIMITED_SCHEMA: dict[str, Any] = {"const": UNLIMITED, "description": "no limit"}
_SIZE_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {"type": "integer", "minimum": 1, "description": "bytes"},
            {
                "type": "string",
                "pattern": r"^\s*\d+(\.\d+)?\s*[A-Za-z]{0,3}\s*$",
                "description": 'e.g. "4GiB"',
            },
            _UNLIMITED_SCHEMA,
        ]
    }
)


def _number_schema(kind: str, minimum: float) -> WithJsonSchema:
    bound = {"exclusiveMinimum": minimum} if kind == "number" else {"minimum": minimum}
    return WithJsonSchema({"anyOf": [{"type": kind, **bound}, _UNLIMITED_SCHEMA]})


class ResourceLimits(BaseModel):
    """Limits of one kernel and every process it starts (or of one stdio MCP server). `None`: no limit.

    Attributes:
        memory: Bytes of memory (cgroup: resident memory and swap of the whole process tree, files in
            its private `/tmp` included; `setrlimit`: the address space of each process, with
            `memfd_create` and `shmget` refused, for a sandboxed process with a `tmp` limit only).
        cpus: CPUs' worth of CPU time, e.g. `0.5` or `2` (a hard cap; cgroups only).
        processes: Processes and threads at once (cgroup: of the tree; `setrlimit`: of a sandboxed
            kernel's own user namespace, or, unsandboxed, of the user, counted from how many the user had
            when the kernel started).
        open_files: Open file descriptors, per process.
        file_size: Bytes of each file a process writes (RLIMIT_FSIZE, whatever the mechanism; a write
            past it fails with `EFBIG`). Not a disk quota: many files can still fill a disk.
        tmp: Bytes the private `/tmp` of a sandboxed kernel may hold (an unsandboxed kernel has none).
        disk: Bytes the workspace directory tree may hold, whoever writes them (a project quota on it:
            see [disk][ipybox.limits.disk]; a write past it fails with `EDQUOT`). Where the workspace's
            filesystem offers no project quotas, or ipybox is not root, setting it is an error.
        enforce: How (see `Enforce`).

    Example:
        ```python
        limits = ResourceLimits(memory="2GiB", processes=64)
        assert limits.memory == 2 * 1024**3 and limits.cpus is None
        ```
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory: Annotated[ByteSize | None, _SIZE_SCHEMA] = Field(default=None, gt=0)
    cpus: Annotated[float | None, _number_schema("number", 0)] = Field(default=None, gt=0)
    processes: Annotated[int | None, _number_schema("integer", 1)] = Field(default=None, ge=1)
    open_files: Annotated[int | None, _number_schema("integer", 16)] = Field(default=None, ge=16)
    file_size: Annotated[ByteSize | None, _SIZE_SCHEMA] = Field(default=None, gt=0)
    tmp: Annotated[ByteSize | None, _SIZE_SCHEMA] = Field(default=None, gt=0)
    disk: Annotated[ByteSize | None, _SIZE_SCHEMA] = Field(default=None, gt=0)
    enforce: Enforce = "auto"

    @field_validator("memory", "cpus", "processes", "open_files", "file_size", "tmp", "disk", mode="before")
    @classmethod
    def _unlimited(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == UNLIMITED:
            return None
        if isinstance(value, bool):  # TOML's `false` would pass as 0 otherwise
            raise ValueError(f'use "{UNLIMITED}" to lift a limit, not {str(value).lower()}')
        return value

    @field_validator("memory", "file_size", "tmp", "disk", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        # (Runs before `_unlimited`: pydantic runs a field's "before" validators last-defined first.)
        if isinstance(value, str) and value.strip().lower() != UNLIMITED and not _SIZE.fullmatch(value):
            raise ValueError(
                f'not a size: {value!r}; write bytes, or a number with a unit like "4GiB" or "512MiB", or '
                f'"{UNLIMITED}"'
            )
        return value

    def set_limits(self) -> dict[str, float | int]:
        """The limits that are set, by name (in `LIMIT_NAMES` order)."""
        values = {name: getattr(self, name) for name in LIMIT_NAMES}
        return {name: value for name, value in values.items() if value is not None}

    @property
    def any(self) -> bool:
        """Whether any limit is set."""
        return bool(self.set_limits())

    def without_tmp(self) -> ResourceLimits:
        """These limits for a process without a private `/tmp` (unsandboxed)."""
        return self.model_copy(update={"tmp": None})


class WorkspaceLimits(ResourceLimits):
    """`[kernel.limits]`: `ResourceLimits` with a workspace's defaults (memory 4 GiB, 256 processes, 4096
    open files, `/tmp` 1 GiB when sandboxed)."""

    memory: Annotated[ByteSize | None, _SIZE_SCHEMA] = Field(default=ByteSize(4 * GiB), gt=0)
    processes: Annotated[int | None, _number_schema("integer", 1)] = Field(default=256, ge=1)
    open_files: Annotated[int | None, _number_schema("integer", 16)] = Field(default=4096, ge=16)
    tmp: Annotated[ByteSize | None, _SIZE_SCHEMA] = Field(default=ByteSize(1 * GiB), gt=0)


def format_bytes(value: float) -> str:
    """`4 GiB`, `512 MiB`, `1.5 GiB`, `100 KiB`, `12 B`: how limits and peaks are shown."""
    for unit, size in (("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size:
            number = value / size
            return (
                f"{number:.0f} {unit}" if number >= 100 or number == int(number) else f"{number:.1f} {unit}"
            )
    return f"{int(value)} B"


def describe_limit(name: str, value: float) -> str:
    """A limit as a person reads it: `memory 4 GiB`, `cpus 1.5`, `processes 256`."""
    if name in ("memory", "file_size", "tmp", "disk"):
        return f"{'/tmp' if name == 'tmp' else name.replace('_', ' ')} {format_bytes(value)}"
    return f"{name.replace('_', ' ')} {value:g}"
