"""What each MCP client needs to reach a workspace: its entry for ipybox, rendered, and merged into the
client's own configuration file. Pure functions (no files, no processes): `ipybox.cli.connect` reads and
writes the files.

The formats, as each client documents them (checked December 2026):

- `claude` (Claude Code): `.mcp.json` in the project (what `claude mcp add --scope project` writes),
  `{"mcpServers": {"ipybox": {"type": "stdio", "command", "args"}}}`, or `{"type": "http", "url",
  "headers"}`; the command line `claude mcp add [--transport http] [--header H] ipybox ...`.
- `codex` (OpenAI Codex): `~/.codex/config.toml` (`$CODEX_HOME/config.toml`), a table
  `[mcp_servers.ipybox]` with `command`/`args`, or `url` with literal headers in `http_headers` (Codex
  refuses an inline `bearer_token`). Codex gives a server 10 s to start and a tool call 60 s by default:
  the entry raises both (`startup_timeout_sec`, `tool_timeout_sec`), since `ipybox mcp` starts a workspace
  and a cell runs up to 120 s by default.
- `cursor`: `.cursor/mcp.json` in the project, `{"mcpServers": {"ipybox": {"command", "args"}}}` or
  `{"url", "headers"}` (Cursor tells streamable HTTP from SSE itself).
- `vscode` (VS Code): `.vscode/mcp.json` in the project, `{"servers": {"ipybox": {"type": "stdio",
  "command", "args"}}}` or `{"type": "http", "url", "headers"}`.
- `desktop` (Claude Desktop): `claude_desktop_config.json` (Linux `~/.config/Claude/`, macOS
  `~/Library/Application Support/Claude/`, Windows `%APPDATA%\\Claude\\`), `{"mcpServers": {"ipybox":
  {"command", "args"}}}`; its file takes local (stdio) servers only (remote ones are added as connectors in
  its settings), so there is no HTTP entry for it.
- `json`: the common `{"mcpServers": {...}}` form (Claude Code's), to paste wherever a client takes it.

Merging (`merge`) changes the one `ipybox` entry and leaves every other entry as it was: a file that
already has the same entry is left alone (`Merged.unchanged`); one with a different `ipybox` entry is
refused unless forced (`ConflictError`); a file that is not a JSON object (or TOML document) is refused
with where it is wrong (`BadFileError`), never replaced.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tomlkit
import tomlkit.exceptions
from tomlkit.items import InlineTable, Table

from ipybox.errors import IpyboxError

Client = Literal["claude", "codex", "cursor", "vscode", "desktop", "json"]
CLIENTS: tuple[Client, ...] = ("claude", "codex", "cursor", "vscode", "desktop", "json")
SERVER_NAME = "ipybox"
"""The name of the entry in every client's file (Claude Code shows tools as `mcp__ipybox__...`)."""

DESKTOP_STDIO_ONLY = (
    "Claude Desktop's claude_desktop_config.json takes local (stdio) servers only (remote ones are "
    "connectors in its settings and must be reachable from the internet): connect it over stdio "
    "(`ipybox connect desktop`, without --http)"
)
CODEX_STARTUP_TIMEOUT = 30
CODEX_TOOL_TIMEOUT = 600


@dataclass(frozen=True)
class Stdio:
    """The client starts `command args...` (`ipybox mcp --workspace DIR`) and speaks MCP on its stdio."""

    command: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Http:
    """The client connects to the running workspace's streamable HTTP endpoint with a bearer token."""

    url: str
    token: str

    @property
    def authorization(self) -> str:
        return f"Bearer {self.token}"


Transport = Stdio | Http


class ConnectError(IpyboxError, ValueError):
    """What was asked can't be done for this client, or its file can't take the entry; the message says
    what to do instead."""


class ConflictError(ConnectError):
    """The client's file has an `ipybox` entry that differs from the one to write."""


class BadFileError(ConnectError):
    """The client's file is not one ipybox can merge into (not JSON, not an object, ...)."""


def stdio_args(workspace: Path, prefix: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The arguments of `ipybox mcp` for `workspace` (absolute), after `prefix` (`-m ipybox.cli` when the
    command is a Python interpreter)."""
    return (*prefix, "mcp", "--workspace", str(workspace))


def entry(client: Client, transport: Transport) -> dict[str, Any]:
    """The server's entry in `client`'s format (the value under `ipybox`).

    Raises:
        ConnectError: The client can't reach an HTTP endpoint from its file (Claude Desktop).
    """
    if isinstance(transport, Stdio):
        command: dict[str, Any] = {"command": transport.command, "args": list(transport.args)}
        if client in ("claude", "vscode", "json"):
            return {"type": "stdio", **command}
        if client == "codex":
            return {
                **command,
                "startup_timeout_sec": CODEX_STARTUP_TIMEOUT,
                "tool_timeout_sec": CODEX_TOOL_TIMEOUT,
            }
        return command
    headers = {"Authorization": transport.authorization}
    if client == "desktop":
        raise ConnectError(DESKTOP_STDIO_ONLY)
    if client == "codex":
        return {"url": transport.url, "http_headers": headers, "tool_timeout_sec": CODEX_TOOL_TIMEOUT}
    if client == "cursor":
        return {"url": transport.url, "headers": headers}
    return {"type": "http", "url": transport.url, "headers": headers}


def servers_key(client: Client) -> str:
    """Where a client's file keeps its servers."""
    return {"vscode": "servers", "codex": "mcp_servers"}.get(client, "mcpServers")


def snippet(client: Client, transport: Transport) -> str:
    """What to paste into the client's file: the entry inside its servers table, as the file's format
    writes it."""
    text = merge(client, None, entry(client, transport)).text
    return text if text.endswith("\n") else text + "\n"


def claude_add_command(transport: Transport, *, scope: str | None = None) -> str:
    """The `claude mcp add` command line that adds the entry (a shell command, quoted as needed). Options
    come before the name, but `--header`, which takes every word up to the next option, comes last."""
    options = ["--scope", scope] if scope is not None else []
    if isinstance(transport, Stdio):
        words = ["claude", "mcp", "add", *options, SERVER_NAME, "--", transport.command, *transport.args]
    else:
        header = f"Authorization: {transport.authorization}"
        words = ["claude", "mcp", "add", *options, "--transport", "http", SERVER_NAME, transport.url]
        words += ["--header", header]
    return shlex.join(words)


@dataclass(frozen=True)
class Merged:
    """The file's new text, and whether it changed at all (`unchanged`: it had this very entry already);
    `replaced`: a different `ipybox` entry was replaced (with `force`)."""

    text: str
    unchanged: bool = False
    replaced: bool = False


def merge(client: Client, existing: str | None, new: dict[str, Any], *, force: bool = False) -> Merged:
    """`existing` (the client's file, `None` when there is none) with the `ipybox` entry set to `new`.

    Raises:
        BadFileError: `existing` is not a document the entry can be merged into.
        ConflictError: It has a different `ipybox` entry, and not `force`.
    """
    if client == "codex":
        return _merge_toml(existing, new, force=force)
    return _merge_json(servers_key(client), existing, new, force=force)


def _merge_json(key: str, existing: str | None, new: dict[str, Any], *, force: bool) -> Merged:
    document: Any = {}
    if existing is not None and existing.strip():
        try:
            document = json.loads(existing)
        except json.JSONDecodeError as e:
            raise BadFileError(
                f"is not plain JSON (line {e.lineno}, column {e.colno}: {e.msg}; comments and trailing commas "
                "are not JSON): add the entry by hand"
            ) from None
        if not isinstance(document, dict):
            raise BadFileError("is not a JSON object: add the entry by hand")
    servers = document.setdefault(key, {})
    if not isinstance(servers, dict):
        raise BadFileError(f'has "{key}" that is not an object: add the entry by hand')
    old = servers.get(SERVER_NAME)
    if old == new:
        return Merged(existing or "", unchanged=True)
    if old is not None and not force:
        raise ConflictError(_conflict(old))
    servers[SERVER_NAME] = new
    return Merged(json.dumps(document, indent=2, ensure_ascii=False) + "\n", replaced=old is not None)


def _merge_toml(existing: str | None, new: dict[str, Any], *, force: bool) -> Merged:
    try:
        document = tomlkit.parse(existing or "")
    except tomlkit.exceptions.ParseError as e:
        raise BadFileError(f"is not valid TOML ({e}): add the entry by hand") from None
    servers = document.get("mcp_servers")
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        document.add("mcp_servers", servers)
    if not isinstance(servers, Table | InlineTable):
        raise BadFileError("has mcp_servers that is not a table: add the entry by hand")
    old = servers.get(SERVER_NAME)
    old_value = old.unwrap() if isinstance(old, Table | InlineTable) else old
    if old_value == new:
        return Merged(existing or "", unchanged=True)
    if old is not None and not force:
        raise ConflictError(_conflict(old_value))
    table = tomlkit.inline_table() if isinstance(servers, InlineTable) else tomlkit.table()
    for name, value in new.items():
        if isinstance(value, dict):
            inline = tomlkit.inline_table()
            inline.update(value)
            table[name] = inline
        else:
            table[name] = value
    if old is not None:
        del servers[SERVER_NAME]
    servers[SERVER_NAME] = table
    return Merged(tomlkit.dumps(document), replaced=old is not None)


def _conflict(old: object) -> str:
    # What the old entry runs or reaches, never its headers (a token).
    what = ""
    if isinstance(old, dict):
        if isinstance(old.get("url"), str):
            what = f" (url {old['url']})"
        elif isinstance(old.get("command"), str):
            given = old.get("args")
            args = given if isinstance(given, list) else []
            what = f" (command {shlex.join([old['command'], *map(str, args)])})"
    return (
        f"already has a different {SERVER_NAME!r} entry{what}: --force replaces it (the file is backed up "
        "first)"
    )
