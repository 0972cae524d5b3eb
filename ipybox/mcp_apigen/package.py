"""Writing a server's generated package: every module rendered first, then the package directory
written next to its target and swapped in, so a kernel never imports a half-written package."""

from __future__ import annotations

import keyword
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import mcp_types as types

from ipybox.mcp_apigen.names import module_names
from ipybox.mcp_apigen.render import ToolSchema, render_package_init, render_tool_module


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


def check_server_name(server_name: str) -> None:
    """Raise `ValueError` unless `server_name` can be a Python package name."""
    if not (server_name.isidentifier() and server_name.isascii()) or keyword.iskeyword(server_name):
        raise ValueError(
            f"server name {server_name!r} cannot be a Python package name: use ASCII letters, digits and "
            "underscores, not starting with a digit (e.g. 'brave_search')"
        )


def render_sources(
    server_name: str,
    tools: Iterable[types.Tool | ToolSchema | Mapping[str, Any]],
    root_name: str = "mcptools",
) -> dict[str, str]:
    """The files of a server package (file name -> source), without writing anything.

    Raises:
        ValueError: `server_name` is not a valid package name.
    """
    check_server_name(server_name)
    schemas: dict[str, ToolSchema] = {}
    for tool in tools:
        schema = tool_schema(tool)
        schemas.setdefault(schema.name, schema)
    names = module_names(list(schemas))
    files = {f"{names[name]}.py": render_tool_module(server_name, schema) for name, schema in schemas.items()}
    entries = [(names[name], schema) for name, schema in schemas.items()]
    files["__init__.py"] = render_package_init(server_name, root_name, entries)
    return files


def write_mcp_sources(
    server_name: str, tools: Iterable[types.Tool | ToolSchema | Mapping[str, Any]], root_dir: Path
) -> list[str]:
    """Generate the package `root_dir/server_name` from tool schemas, without connecting to a server.

    An existing package of that name is replaced. The package is written to a temporary directory
    in `root_dir` and renamed into place.

    Args:
        server_name: Package name, and the name the generated code calls the server by.
        tools: The server's tools: `mcp` `Tool` objects, [ToolSchema][ipybox.mcp_apigen.render.ToolSchema]s,
            or dicts with `name`, `description`, `input_schema` and `output_schema`.
        root_dir: Directory the package is created in (e.g. `Path("mcptools")`).

    Returns:
        The module names (sanitized tool names), in the order the tools were given.

    Raises:
        ValueError: `server_name` is not a valid package name.

    Example:
        ```python
        tool = {"name": "add", "description": "Add.", "input_schema": {"type": "object"}}
        assert write_mcp_sources("calc", [tool], Path("mcptools")) == ["add"]
        ```
    """
    schemas = [tool_schema(tool) for tool in tools]
    files = render_sources(server_name, schemas, root_dir.name or "mcptools")
    root_dir.mkdir(parents=True, exist_ok=True)
    target = root_dir / server_name
    staging = Path(tempfile.mkdtemp(prefix=f".{server_name}.tmp-", dir=root_dir))
    try:
        for filename, source in sorted(files.items()):
            (staging / filename).write_text(source, encoding="utf-8")
        _swap_in(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    names = module_names([schema.name for schema in schemas])
    return list(dict.fromkeys(names[schema.name] for schema in schemas))


def _swap_in(staging: Path, target: Path) -> None:
    if not target.exists() and not target.is_symlink():
        os.rename(staging, target)
        return
    # Directories cannot be renamed over non-empty ones: move the old one aside first, so `target`
    # is only ever missing for the instant between two renames, never half-written.
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rename(target, retired / target.name)
    os.rename(staging, target)
    shutil.rmtree(retired, ignore_errors=True)
