"""Adding an MCP server to a workspace's `ipybox.toml` (comments and formatting kept, with tomlkit)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import Table

from ipybox.mcp_apigen.package import check_server_name
from ipybox.mcp_client import MCPServerError
from ipybox.mcp_client.params import parse_server_params
from ipybox.workspace import CONFIG_FILE

_STDIO_KEYS = ("command", "args", "env", "cwd")
_HTTP_KEYS = ("url", "headers", "type")


def add_server(workspace: Path, server_name: str, server_params: Mapping[str, Any]) -> None:
    """Write `[servers.<server_name>]` into the workspace's `ipybox.toml` (created when missing), replacing
    a server of that name; everything else in the file stays as it was.

    Raises:
        ValueError: The name is not a valid package name or the parameters are invalid (named in the
            message); the file is left unchanged.
    """
    check_server_name(server_name)
    try:  # fails before anything is written
        parse_server_params(server_name, server_params, dotenv_path=workspace / ".env")
    except MCPServerError as e:
        raise ValueError(str(e)) from None
    keys = _STDIO_KEYS if "command" in server_params else _HTTP_KEYS
    table = tomlkit.table()
    for key in keys:
        if server_params.get(key) is not None:
            table.add(key, server_params[key])
    path = workspace / CONFIG_FILE
    document = tomlkit.parse(path.read_text()) if path.exists() else tomlkit.document()
    servers = document.get("servers")
    if not isinstance(servers, Table):
        servers = tomlkit.table(is_super_table=True)
        document["servers"] = servers
    servers[server_name] = table
    _write_atomically(path, tomlkit.dumps(document))


def _write_atomically(path: Path, text: str) -> None:
    # The reconciler watches this file: it must never see half of it.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
