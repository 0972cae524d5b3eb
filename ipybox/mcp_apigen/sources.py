"""`generate_mcp_sources`: connect to an MCP server, list its tools and generate their Python API.

Generation and the host's server registry are kept apart:

- `generate_sources` is the generator: it validates the parameters (the one model of
  `ipybox.mcp_client.params`), connects, lists the tools and writes the package. It knows nothing of the
  registry, so a caller with servers of its own (the workspace reconciler, which writes packages from
  `ipybox.toml`) generates without touching the user's state.
- `generate_mcp_sources`, the published function, is `generate_sources` followed by recording the server
  in the registry (`ServerRegistry.register`: the parameters' dump and the tools' annotations). That
  record is how a `CodeExecutor` started later, in any process, finds the server behind a name that
  generated code uses, as in ipybox 0.9; it is part of the published behaviour, so the published
  function keeps it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipybox.mcp_apigen.package import write_mcp_sources
from ipybox.mcp_client.connection import MCPConnection
from ipybox.mcp_client.params import (
    ServerParams,
    check_server_name,
    parse_server_params,
    validate_server_params,
)
from ipybox.mcp_client.pool import annotations_of
from ipybox.mcp_client.registry import ServerRegistry


@dataclass(frozen=True)
class GeneratedSources:
    """What `generate_sources` generated.

    Attributes:
        params: The server's parameters, validated (`${VAR}` placeholders unresolved).
        modules: The module names (sanitized tool names), in the order the server lists its tools.
        annotations: Each tool's annotations as listed (tool name -> `{"readOnlyHint": True, ...}`).
    """

    params: ServerParams
    modules: list[str]
    annotations: dict[str, dict[str, Any]]


async def generate_sources(
    server_name: str,
    server_params: Mapping[str, Any] | ServerParams,
    root_dir: Path,
    *,
    connect_timeout: float = 30,
    dotenv_path: Path | None = Path(".env"),
    parsers: Collection[str] | None = None,
) -> GeneratedSources:
    """Connect to an MCP server, list its tools and write the package `root_dir/server_name`; nothing
    else (see the module). Arguments and errors as for `generate_mcp_sources`."""
    check_server_name(server_name)
    params = validate_server_params(server_name, server_params)
    # The connection gets the parameters with placeholders filled in; the caller keeps them unfilled.
    resolved = parse_server_params(server_name, params, dotenv_path=dotenv_path)
    connection = MCPConnection(server_name, resolved, connect_timeout=connect_timeout)
    await connection.start()
    try:
        tools = await connection.list_tools()
        modules = write_mcp_sources(server_name, tools, Path(root_dir), parsers)
    except BaseException:
        await connection.stop()
        raise
    _stop_in_background(connection)
    return GeneratedSources(params, modules, {tool.name: annotations_of(tool) for tool in tools})


async def generate_mcp_sources(
    server_name: str,
    server_params: Mapping[str, Any],
    root_dir: Path,
    *,
    connect_timeout: float = 30,
    dotenv_path: Path | None = Path(".env"),
    registry: ServerRegistry | None = None,
    parsers: Collection[str] | None = None,
) -> list[str]:
    """Generate a typed Python tool API for an MCP server.

    Connects to the server, lists its tools and writes the package `root_dir/server_name`: one module
    per tool with a pydantic `Params` class, a `Result` class (tools with an output schema; others
    return `str`), and `run()`/`arun()` functions that call the tool through the ipybox tool server.
    The package's `__init__.py` indexes the tools. An existing package of that name is replaced.

    The server's parameters (with `${VAR}` placeholders unresolved) are recorded in the host's server
    registry under `root_dir`, so a `CodeExecutor` whose `mcptools_dir` or `package_roots` is `root_dir`
    can run the tools later, in this process or another: generated code names the server and the
    directory it was generated into, never parameters, and the host runs what it recorded there. Secrets
    are recorded by name only: a literal value in `env` or `headers` is recorded as a `${VAR}`
    placeholder (`env.API_KEY` as `${API_KEY}`, header `Authorization` of server `github` as
    `${GITHUB_AUTHORIZATION}`; a warning names them), which this process fills in with the value given
    and an executor in another process from its environment or `.env` (see
    `ipybox.mcp_client.registry`). Each tool's
    annotations (`readOnlyHint`, ...) as listed now are recorded with them, so the application sees them
    on a call that is decided before the server starts (while the server's parameters stay the same).

    Args:
        server_name: Package name, and the name generated code uses for the server.
        server_params: `{"command", "args", "env", "cwd", "sandbox"}` for a stdio server, or
            `{"url", "headers", "type"}` for an HTTP server; `${VAR}` placeholders are replaced from the
            environment or `dotenv_path`.
        root_dir: Directory the package is created in (e.g. `Path("mcptools")`).
        connect_timeout: Seconds allowed for starting the server and completing the MCP handshake.
        dotenv_path: `.env` file consulted for placeholders missing from the environment.
        registry: Where the server's parameters and tool annotations are recorded (default: the user's
            registry file).
        parsers: Module names with an output parser, whose modules gain `run_parsed()` (default: the
            files found in `mcpparse/<server_name>/` next to `root_dir`; see `ipybox.mcp_apigen.parsers`).

    Returns:
        The module names (sanitized tool names), in the order the server lists its tools.

    Raises:
        ValueError: `server_name` is not a valid package name.
        MCPServerError: The parameters are not valid (`ServerParamsError`), or the server could not be
            started or reached (see `ipybox.mcp_client`).

    Example:
        ```python
        await generate_mcp_sources("fetch", {"command": "uvx", "args": ["mcp-server-fetch"]}, Path("mcptools"))
        ```
    """
    generated = await generate_sources(
        server_name,
        server_params,
        root_dir,
        connect_timeout=connect_timeout,
        dotenv_path=dotenv_path,
        parsers=parsers,
    )
    (registry or ServerRegistry()).register(
        Path(root_dir), server_name, generated.params, generated.annotations
    )
    return generated.modules


# MCP's stdio shutdown (close stdin, let the server exit, SIGTERM after a grace period) takes some servers
# hundreds of milliseconds, which would more than double a generation. The sources are complete by then,
# so the server is stopped while the caller goes on (typically to start a CodeExecutor). The stop is
# shielded: `asyncio.run()` ending, or a cancellation, still waits for it, so no process is left behind.
# The one task of this module that no task group owns: by design it outlives the published function's
# call, whose caller has no group to give it (the signature is 0.9.2's). `MCPConnection` stopping its own
# runner on request, without being awaited, would make it unnecessary.
_stopping: set[asyncio.Task[None]] = set()


def _stop_in_background(connection: MCPConnection) -> None:
    task = asyncio.get_running_loop().create_task(
        connection.stop(), name=f"mcp-stop-{connection.server_name}"
    )
    _stopping.add(task)
    task.add_done_callback(_stopping.discard)


async def wait_for_stopped_servers() -> None:
    """Wait until the servers `generate_mcp_sources` started have all exited."""
    if _stopping:
        await asyncio.gather(*_stopping, return_exceptions=True)
