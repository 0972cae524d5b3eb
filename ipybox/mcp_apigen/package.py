"""Writing a server's generated package: every module rendered first, then the package directory
written next to its target and swapped in, so a kernel never imports a half-written package. Modules
whose tool has an output parser (`mcpparse/<server>/<module>.py`, found by `parsers.discover_parsers`
unless the caller names them) gain `run_parsed()`.

The root directory (`mcptools/`) is one a kernel may have written in. Everything is done through a
descriptor of it, opened without following a symlink, and entries are created new (`O_EXCL`,
`O_NOFOLLOW`): if a kernel replaced the root or a package directory by a symlink, generation stops with
a `SymlinkRefusedError` naming it rather than writing into, or deleting, what it points to. Symlinks above
the root directory (a workspace reached through one) are followed as usual.

The directories made on the way (`.<server>.tmp-<pid>_<random>` being written, `.<server>.old-...` being
replaced, `.<server>.removed-...` by the reconciler) carry the pid of the process that made them: a
process killed half-way leaves them behind, and `remove_stale_work_dirs` (run by `ipybox up`) removes those
whose process is gone, never one another process is still writing.
"""

from __future__ import annotations

import contextlib
import errno
import keyword
import os
import re
import secrets
import shutil
import stat
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import mcp_types as types

from ipybox import process
from ipybox.errors import UnsafePathError
from ipybox.mcp_apigen.names import module_names
from ipybox.mcp_apigen.parsers import discover_parsers
from ipybox.mcp_apigen.render import ToolSchema, render_package_init, render_tool_module
from ipybox.mcp_client.params import check_server_name
from ipybox.safefs import DIR_FLAGS, NEW_FILE_FLAGS


def tool_schema(tool: types.Tool | ToolSchema | Mapping[str, Any]) -> ToolSchema:
    """A [ToolSchema][ipybox.mcp_apigen.render.ToolSchema] from an `mcp` `Tool`, or from a dict with
    `name`, `description`, `input_schema` (or `inputSchema`) and `output_schema` (or `outputSchema`)."""
    if isinstance(tool, ToolSchema):
        return tool
    if isinstance(tool, types.Tool):
        return ToolSchema(tool.name, tool.description, tool.input_schema, tool.output_schema)
    input_schema = tool.get("input_schema", tool.get("inputSchema")) or {}
    return ToolSchema(
        name=str(tool["name"]),
        description=tool.get("description"),
        input_schema=input_schema,
        output_schema=tool.get("output_schema", tool.get("outputSchema")),
    )


class SymlinkRefusedError(UnsafePathError, OSError):
    """A directory ipybox generates in, or an entry it would replace or remove there, is a symlink that
    ipybox did not make (a kernel that could write in the workspace may have planted it)."""


def is_package_name(name: str) -> bool:
    """Whether `name` is a package name the generator makes (an ASCII identifier, not a keyword): the
    only names that are ever used as paths under the root directory."""
    return name.isidentifier() and name.isascii() and not keyword.iskeyword(name)


def render_sources(
    server_name: str,
    tools: Iterable[types.Tool | ToolSchema | Mapping[str, Any]],
    root_name: str = "mcptools",
    parsers: Collection[str] = (),
) -> dict[str, str]:
    """The files of a server package (file name -> source), without writing anything.

    Args:
        server_name: Package name, and the name the generated code calls the server by.
        tools: The server's tools (as for `write_mcp_sources`).
        root_name: The name of the directory the package goes in (for the index's usage line).
        parsers: Module names that have an output parser (`mcpparse/<server>/<module>.py`, see
            `ipybox.mcp_apigen.parsers`): their modules gain `ParseResult`, `run_parsed()` and
            `arun_parsed()`. Names of no module are ignored.

    Raises:
        ValueError: `server_name` is not a valid package name.
    """
    check_server_name(server_name)
    schemas: dict[str, ToolSchema] = {}
    for tool in tools:
        schema = tool_schema(tool)
        schemas.setdefault(schema.name, schema)
    names = module_names(list(schemas))
    parsed = set(parsers) & set(names.values())
    files = {
        f"{names[name]}.py": render_tool_module(
            server_name, schema, names[name] if names[name] in parsed else None
        )
        for name, schema in schemas.items()
    }
    entries = [(names[name], schema) for name, schema in schemas.items()]
    files["__init__.py"] = render_package_init(server_name, root_name, entries, parsed)
    return files


def write_mcp_sources(
    server_name: str,
    tools: Iterable[types.Tool | ToolSchema | Mapping[str, Any]],
    root_dir: Path,
    parsers: Collection[str] | None = None,
) -> list[str]:
    """Generate the package `root_dir/server_name` from tool schemas, without connecting to a server.

    An existing package of that name is replaced. The package is written to a temporary directory
    in `root_dir` and renamed into place.

    Args:
        server_name: Package name, and the name the generated code calls the server by.
        tools: The server's tools: `mcp` `Tool` objects, [ToolSchema][ipybox.mcp_apigen.render.ToolSchema]s,
            or dicts with `name`, `description`, `input_schema` and `output_schema`.
        root_dir: Directory the package is created in (e.g. `Path("mcptools")`).
        parsers: Module names with an output parser (see `render_sources`); `None`: the parsers found
            in `mcpparse/<server_name>/` next to `root_dir` (`discover_parsers`: file existence only,
            nothing there is read or imported).

    Returns:
        The module names (sanitized tool names), in the order the tools were given.

    Raises:
        ValueError: `server_name` is not a valid package name.
        SymlinkRefusedError: `root_dir` or the package is a symlink (nothing is written or deleted).

    Example:
        ```python
        tool = {"name": "add", "description": "Add.", "input_schema": {"type": "object"}}
        assert write_mcp_sources("calc", [tool], Path("mcptools")) == ["add"]
        ```
    """
    schemas = [tool_schema(tool) for tool in tools]
    if parsers is None:
        parsers = discover_parsers(root_dir, server_name)
    files = render_sources(server_name, schemas, root_dir.name or "mcptools", parsers)
    root_fd = open_directory(root_dir, create=True)
    try:
        staging = make_temp_dir(root_fd, f".{server_name}.tmp-")
        try:
            staging_fd = os.open(staging, DIR_FLAGS, dir_fd=root_fd)
            try:
                for filename, source in sorted(files.items()):
                    fd = os.open(filename, NEW_FILE_FLAGS, 0o666, dir_fd=staging_fd)
                    with os.fdopen(fd, "w", encoding="utf-8") as file:
                        file.write(source)
            finally:
                os.close(staging_fd)
            swap_in(root_fd, root_dir, staging, server_name)
        except BaseException:
            shutil.rmtree(staging, dir_fd=root_fd, ignore_errors=True)
            raise
    finally:
        os.close(root_fd)
    names = module_names([schema.name for schema in schemas])
    return list(dict.fromkeys(names[schema.name] for schema in schemas))


def swap_in(root_fd: int, root_dir: Path, staging: str, target: str) -> None:
    """Put the directory `staging` (made by `make_temp_dir` in the directory `root_fd`, i.e. `root_dir`) in
    place as `target`, replacing what is there: `target` is never half-written, and missing only for the
    instant between two renames.

    Raises:
        SymlinkRefusedError: `target` is a symlink (nothing is replaced).
    """
    try:
        info = os.stat(target, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(staging, target, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        return
    if stat.S_ISLNK(info.st_mode):
        raise symlink_refused(root_dir / target, "replace", _readlink(target, root_fd))
    # Directories cannot be renamed over non-empty ones: move the old one aside first, so `target`
    # is only ever missing for the instant between two renames, never half-written.
    retired = make_temp_dir(root_fd, f".{target}.old-")
    retired_fd = os.open(retired, DIR_FLAGS, dir_fd=root_fd)
    try:
        os.rename(target, target, src_dir_fd=root_fd, dst_dir_fd=retired_fd)
    finally:
        os.close(retired_fd)
    os.rename(staging, target, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    shutil.rmtree(retired, dir_fd=root_fd, ignore_errors=True)


def open_directory(path: Path, *, create: bool = False) -> int:
    """A descriptor of the directory `path` (created, with its parents, if missing and `create`), opened
    without following a symlink in its last component.

    Raises:
        SymlinkRefusedError: `path` is a symlink.
        OSError: It is missing (without `create`), not a directory, or can't be opened.
    """
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
    try:
        return os.open(path, DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and os.path.islink(path):
            raise symlink_refused(path, "write in", _readlink(path)) from None
        raise


def make_temp_dir(dir_fd: int, prefix: str) -> str:
    """Create a new directory (mode 0700) in the directory `dir_fd`, named `prefix`, this process's pid and
    an unpredictable part (`.edge.tmp-4831_9f3a0c1b2d4e`); returns its name. The pid tells
    `remove_stale_work_dirs` whether the directory is still being worked on."""
    for _ in range(100):
        name = f"{prefix}{os.getpid()}_{secrets.token_hex(6)}"
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            continue
        return name
    raise FileExistsError(errno.EEXIST, f"no free name for a directory starting with {prefix!r}")


# The names `make_temp_dir` gives under a root directory (with a pid), and the ones older versions gave.
_WORK_DIR = re.compile(r"\.[A-Za-z_][A-Za-z0-9_]*\.(?:tmp|old|removed)-(?:(?P<pid>[0-9]+)_)?[0-9a-f]{12}")


def remove_stale_work_dirs(root_dir: Path) -> list[str]:
    """Remove the directories that generating, replacing or removing a package under `root_dir` left
    behind when the process doing it was killed: those whose pid is not alive (and those of older
    versions, which carry no pid). Only real directories of the current user are removed.

    Returns:
        The names removed.

    Raises:
        SymlinkRefusedError: `root_dir` is a symlink.
    """
    try:
        root_fd = open_directory(root_dir)
    except FileNotFoundError:
        return []
    removed: list[str] = []
    try:
        with os.scandir(root_fd) as entries:
            names = [entry.name for entry in entries]
        for name in sorted(names):
            match = _WORK_DIR.fullmatch(name)
            if match is None or (match["pid"] is not None and process.is_alive(int(match["pid"]))):
                continue
            try:
                info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            shutil.rmtree(name, dir_fd=root_fd, ignore_errors=True)
            removed.append(name)
    finally:
        os.close(root_fd)
    return removed


def symlink_refused(path: Path, doing: str, target: str | None) -> SymlinkRefusedError:
    """The error for finding a symlink at `path` where ipybox would `doing` a directory it made."""
    to = f" (to {target})" if target is not None else ""
    return SymlinkRefusedError(
        f"refusing to {doing} {path}: it is a symlink{to}, which ipybox never makes there (a kernel that "
        f"could write in the workspace may have planted it). Check what it points to, then remove the "
        f"symlink (`rm {path}`) and run again"
    )


def _readlink(path: str | Path, dir_fd: int | None = None) -> str | None:
    try:
        return os.readlink(path, dir_fd=dir_fd)
    except OSError:
        return None
