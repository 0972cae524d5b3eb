"""`write_server()` and `remove_server()`: one `[servers.<name>]` table of `ipybox.toml` written or removed,
everything else in the file kept byte for byte (comments, layout, line endings).

`write_servers()` writes several at once, in one edit (`ipybox server import`: all or nothing).

Used by `ipybox server add/remove/import` and by `register_mcp_server` (`ipybox.mcp_server.registration`).

The file is edited as text, not re-rendered: a parser that keeps comments (tomlkit) attaches the comments
between two tables to the first one's body, so deleting or appending a table through it moves or drops
the comment that introduces what follows. Instead the table's lines are found from the file's table
headers (`positions.table_headers`, which steps over strings and arrays as TOML reads them):

- A server is its `[servers.<name>]` table and its sub-tables (`[servers.<name>.sandbox]`, ...), each
  from its header to its last value, plus the comment lines that touch it: directly above its header
  (the comment that introduces it) and directly below its last value (commented-out options). Comments
  separated from it by a blank line, comments that run straight into the next header, and the comments
  that open the file stay.
- A new server is written as one `[servers.<name>]` table (mappings as inline tables, `env = { K = "V" }`,
  as `ipybox.toml.example` writes them) after the last `[servers...]` table, or at the end of the file
  when there is none; a replaced server's table is written where the old one was (the comment above it
  stays), and its sub-tables are removed.
- A server written inline (`[servers]` `name = { ... }`, or dotted keys) is removed through tomlkit.

Contract: the file is changed by `ipybox.config.file_edit.edit_config_file` (a regular file, not written
through a symlink, that loads now; replaced atomically, mode and owner kept, only if it loads afterwards
and did not change meanwhile), and only if also:

1. what `tomllib` reads from the new text is what it read from the old one with exactly this server's
   table set (or removed), so no other value can have changed, whatever the layout;
2. in the new file as the workspace loads it (`.env` and `IPYBOX_*` variables included), the server is
   what was written (or absent).

Otherwise `ServerWriteError` says why and the file is left as it was; no temporary file stays behind.

Example:
    ```python
    edit = write_server(workspace / "ipybox.toml", "time", {"command": "uvx", "args": ["mcp-server-time"]})
    assert edit.action == "added" and edit.text.startswith("[servers.time]")
    remove_server(workspace / "ipybox.toml", "time")
    ```
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import tomlkit

from ipybox.config.file_edit import EditRules, edit_config_file
from ipybox.config.loading import CONFIG_FILE
from ipybox.config.positions import KeyPath, key_positions, table_headers
from ipybox.config.servers import RESERVED_SERVER_NAMES, check_server_name, parse_server_section
from ipybox.config.toml_items import toml_item
from ipybox.config.workspace_config import WorkspaceConfig
from ipybox.errors import IpyboxError
from ipybox.mcp_client.params import dump_server_params

__all__ = [
    "ServerEdit",
    "ServerWriteError",
    "remove_server",
    "render_server",
    "write_server",
    "write_servers",
]

_LINE: Final = re.compile(r"[^\n]*\n|[^\n]+\Z")


@dataclass(frozen=True)
class ServerEdit:
    """What `write_server` or `remove_server` changed in `ipybox.toml`.

    Attributes:
        name: The server.
        action: `added`, `replaced` or `removed`.
        line: The 1-based line of its `[servers.<name>]` header: in the new file (added, replaced), or in
            the old one (removed; `None` when it was written inline and its place is not known).
        text: The table as written (added, replaced); empty for a removal.
    """

    name: str
    action: Literal["added", "replaced", "removed"]
    line: int | None
    text: str


class ServerWriteError(IpyboxError, ValueError):
    """`ipybox.toml` was not changed: `str(error)` says why and what to do instead."""


def render_server(name: str, table: Mapping[str, Any]) -> str:
    """`[servers.<name>]` with `table`'s keys in order, as `write_server` writes it (`\\n` line ends)."""
    rendered = tomlkit.table()
    for key, value in table.items():
        rendered.add(key, toml_item(value))
    servers = tomlkit.table(is_super_table=True)
    servers.add(name, rendered)
    document = tomlkit.document()
    document.add("servers", servers)
    return document.as_string().rstrip("\n") + "\n"


def write_server(
    config_path: Path, name: str, table: Mapping[str, Any], *, replace: bool = False
) -> ServerEdit:
    """Write `[servers.<name>]` as `table` (a server's parameters plus `enabled`, as `dump_server_params`
    gives them) into `ipybox.toml`.

    Args:
        config_path: The workspace's `ipybox.toml` (or the workspace directory).
        name: The server's name.
        table: Its table; it is written exactly (and refused if the file would not then hold exactly it).
        replace: Replace a server of that name; without it, one that exists is refused.

    Raises:
        ServerWriteError: Nothing was written; the message says why.
    """
    path = _config_path(config_path)
    _check_name(path, name)
    wanted = dict(table)
    expected = dump_server_params(parse_server_section(wanted)) if _valid(wanted) else None

    def edit(text: str, data: dict[str, Any]) -> tuple[str, ServerEdit]:
        servers = data.get("servers")
        exists = isinstance(servers, dict) and name in servers
        if exists and not replace:
            raise _refuse(path, f"it has a server {name!r} already; replace it or choose another name")
        if servers is not None and not isinstance(servers, dict):
            raise _refuse(path, "its `servers` is not a table")
        return _put(path, text, name, wanted, exists)

    def want(data: dict[str, Any]) -> dict[str, Any]:
        changed = copy.deepcopy(data)
        changed.setdefault("servers", {})[name] = copy.deepcopy(wanted)
        return changed

    def took_effect(config: WorkspaceConfig) -> bool:
        server = config.servers.get(name)
        return server is not None and dump_server_params(server) == expected

    return _edit_file(path, edit, want, took_effect)


def write_servers(
    config_path: Path, tables: Mapping[str, Mapping[str, Any]], *, replace: bool = False
) -> list[ServerEdit]:
    """Write several `[servers.<name>]` tables into `ipybox.toml` in one edit: all of them or none (what
    `ipybox server import` writes). Each is written as `write_server` writes it, in the order given.

    Args:
        config_path: The workspace's `ipybox.toml` (or the workspace directory).
        tables: The servers' tables by name.
        replace: Replace servers of those names; without it, one that exists is refused.

    Returns:
        What was done to each, in the order given, with its line in the new file.

    Raises:
        ServerWriteError: Nothing was written; the message says why (naming the server).
    """
    path = _config_path(config_path)
    wanted = {name: dict(table) for name, table in tables.items()}
    for name in wanted:
        _check_name(path, name)
    expected = {
        name: dump_server_params(parse_server_section(table)) if _valid(table) else None
        for name, table in wanted.items()
    }

    def changed(text: str, current: WorkspaceConfig) -> tuple[str, list[ServerEdit]]:
        data = tomllib.loads(text)
        servers = data.get("servers")
        if servers is not None and not isinstance(servers, dict):
            raise _refuse(path, "its `servers` is not a table")
        edits: list[ServerEdit] = []
        for name, table in wanted.items():
            exists = isinstance(servers, dict) and name in servers
            if exists and not replace:
                raise _refuse(path, f"it has a server {name!r} already; replace it or choose another name")
            text, edit = _put(path, text, name, table, exists)
            edits.append(edit)
        want = copy.deepcopy(data)
        want.setdefault("servers", {}).update(copy.deepcopy(wanted))
        try:
            same = _without_empty_servers(tomllib.loads(text)) == _without_empty_servers(want)
        except tomllib.TOMLDecodeError:
            same = False
        if not same:
            first = edits[0] if edits else None
            raise _layout(path, first.name if first else "", first.text if first else None)
        positions = key_positions(text)
        return text, [
            ServerEdit(e.name, e.action, positions.get(("servers", e.name), (e.line,))[0], e.text)
            for e in edits
        ]

    def in_effect(config: WorkspaceConfig, edits: list[ServerEdit]) -> str | None:
        for name, dumped in expected.items():
            server = config.servers.get(name)
            if server is None or dump_server_params(server) != dumped:
                return (
                    f"[servers.{name}] would not take effect: the servers in effect come from the "
                    "environment (an IPYBOX_SERVERS variable, or the workspace's .env); change them there"
                )
        return None

    return edit_config_file(path, changed, in_effect, _edit_rules(path, change="these servers"))


def remove_server(config_path: Path, name: str) -> ServerEdit:
    """Remove `[servers.<name>]` (and its sub-tables) from `ipybox.toml`.

    Raises:
        ServerWriteError: Nothing was written: there is no such server (the message lists those there
            are), or one of the reasons of `write_server`.
    """
    path = _config_path(config_path)

    def edit(text: str, data: dict[str, Any]) -> tuple[str, ServerEdit]:
        servers = data.get("servers")
        if not isinstance(servers, dict) or name not in servers:
            names = sorted(servers) if isinstance(servers, dict) else []
            there = f"its servers are {', '.join(names)}" if names else "it has no servers"
            raise _refuse(path, f"it has no server {name!r} ({there})")
        return _take_out(path, text, name)

    def want(data: dict[str, Any]) -> dict[str, Any]:
        changed = copy.deepcopy(data)
        del changed["servers"][name]
        return changed

    return _edit_file(path, edit, want, lambda config: name not in config.servers)


def _config_path(config_path: Path) -> Path:
    path = Path(config_path)
    return path / CONFIG_FILE if path.is_dir() else path


def _check_name(path: Path, name: str) -> None:
    try:
        check_server_name(name)
    except ValueError as e:
        raise _refuse(path, str(e)) from None
    if name in RESERVED_SERVER_NAMES:
        raise _refuse(path, f"the server name {name!r} is reserved for approval rules; choose another")


def _valid(table: Mapping[str, Any]) -> bool:
    try:
        parse_server_section(table)
    except ValueError:  # pydantic's ValidationError: the loader reports it with its place
        return False
    return True


def _refuse(path: Path, why: str) -> ServerWriteError:
    return ServerWriteError(f"{path} was not changed: {why}")


# The edit, as text


def _lines(text: str) -> list[str]:
    """`text` as lines, each with its `\\n` (a `\\r` stays part of the line; TOML strings may hold
    characters `str.splitlines` would split at)."""
    return _LINE.findall(text)


def _blank(line: str) -> bool:
    return not line.strip()


def _comment(line: str) -> bool:
    return line.lstrip().startswith("#")


def _newline(text: str) -> str:
    return "\r\n" if text.count("\r\n") * 2 > text.count("\n") else "\n"


@dataclass(frozen=True)
class _Block:
    """A table header and the lines up to the next header: `[header, end)`, 0-based."""

    path: KeyPath
    header: int
    end: int


def _blocks(text: str, lines: list[str]) -> list[_Block]:
    headers = table_headers(text)
    ends = [line - 1 for line, _ in headers[1:]] + ([len(lines)] if headers else [])
    return [_Block(path, line - 1, end) for (line, path), end in zip(headers, ends, strict=True)]


def _own_end(lines: list[str], block: _Block) -> int:
    """Where the lines of `block` end (exclusive): after its last value and the comment lines that follow
    it directly, unless those run straight into the next header (then they introduce that one)."""
    last = block.header
    for index in range(block.header + 1, block.end):
        if not _blank(lines[index]) and not _comment(lines[index]):
            last = index
    end = last + 1
    while end < block.end and _comment(lines[end]):
        end += 1
    if end == block.end and block.end < len(lines) and end > last + 1:
        return last + 1
    return end


def _lead_start(lines: list[str], block: _Block) -> int:
    """Where the comment lines directly above `block`'s header start; the comments opening the file and
    `#:` directives (`#:schema`) stay where they are."""
    start = block.header
    while start > 0 and _comment(lines[start - 1]):
        start -= 1
    if start == 0:
        return block.header
    directives = [i for i in range(start, block.header) if lines[i].lstrip().startswith("#:")]
    return directives[-1] + 1 if directives else start


def _remove_lines(lines: list[str], ranges: list[tuple[int, int]]) -> None:
    """Delete `ranges` of `lines` (last first), and the blank lines that would then be doubled or left at
    the end of the file."""
    for start, end in sorted(ranges, reverse=True):
        del lines[start:end]
        if start == 0 or _blank(lines[start - 1]):
            while start < len(lines) and _blank(lines[start]):
                del lines[start]
            if start == len(lines):
                while start > 0 and _blank(lines[start - 1]):
                    start -= 1
                    del lines[start]


def _server_blocks(blocks: list[_Block], name: str) -> list[_Block]:
    return [block for block in blocks if block.path[:2] == ("servers", name)]


def _put(path: Path, text: str, name: str, table: Mapping[str, Any], exists: bool) -> tuple[str, ServerEdit]:
    newline = _newline(text)
    rendered = render_server(name, table)
    new = _lines(rendered.replace("\n", newline))
    lines = _lines(text)
    own = _server_blocks(_blocks(text, lines), name) if exists else []
    if exists and not own:  # written inline: taken out through tomlkit, then added as a table
        text = _without_inline(path, text, name, rendered)
        lines = _lines(text)
    if own:
        # The sub-tables' lines all come after the first table's own lines: those stay where they are.
        first, rest = own[0], own[1:]
        end = _own_end(lines, first)
        _remove_lines(lines, [(_lead_start(lines, b), _own_end(lines, b)) for b in rest])
        lines[first.header : end] = new
        at = first.header
    else:
        region = [block for block in _blocks(text, lines) if block.path[:1] == ("servers",)]
        at = _own_end(lines, region[-1]) if region else len(lines)
        if at and not lines[at - 1].endswith("\n"):
            lines[at - 1] += newline
        before = [newline] if at and not _blank(lines[at - 1]) else []
        after = [newline] if at < len(lines) and not _blank(lines[at]) else []
        lines[at:at] = [*before, *new, *after]
        at += len(before)
    action: Literal["added", "replaced"] = "replaced" if exists else "added"
    return "".join(lines), ServerEdit(name, action, at + 1, "".join(new))


def _take_out(path: Path, text: str, name: str) -> tuple[str, ServerEdit]:
    lines = _lines(text)
    own = _server_blocks(_blocks(text, lines), name)
    if not own:
        where = key_positions(text).get(("servers", name))
        return _without_inline(path, text, name, None), ServerEdit(
            name, "removed", where[0] if where else None, ""
        )
    _remove_lines(lines, [(_lead_start(lines, block), _own_end(lines, block)) for block in own])
    return "".join(lines), ServerEdit(name, "removed", own[0].header + 1, "")


def _without_inline(path: Path, text: str, name: str, rendered: str | None) -> str:
    """`text` without the server `name` written inline (`name = { ... }` or dotted keys)."""
    try:
        document = tomlkit.parse(text)
        servers: Any = document["servers"]
        del servers[name]
        return document.as_string()
    except Exception:  # tomlkit could not take it out: a layout it does not handle
        raise _layout(path, name, rendered) from None


def _layout(path: Path, name: str, rendered: str | None) -> ServerWriteError:
    by_hand = f"add it by hand:\n{rendered.rstrip()}" if rendered is not None else "remove it by hand"
    return _refuse(
        path,
        f"ipybox could not edit [servers.{name}] without changing other parts of it (are its servers "
        f"written inline or as dotted keys? ipybox writes each as a [servers.<name>] table); {by_hand}",
    )


# The file


def _edit_file(
    path: Path,
    edit: Callable[[str, dict[str, Any]], tuple[str, ServerEdit]],
    want: Callable[[dict[str, Any]], dict[str, Any]],
    took_effect: Callable[[WorkspaceConfig], bool],
) -> ServerEdit:
    def changed(text: str, current: WorkspaceConfig) -> tuple[str, ServerEdit]:
        data = tomllib.loads(text)
        new_text, change = edit(text, data)
        try:
            same = _without_empty_servers(tomllib.loads(new_text)) == _without_empty_servers(want(data))
        except tomllib.TOMLDecodeError:
            same = False
        if not same:
            raise _layout(path, change.name, change.text or None)
        return new_text, change

    def in_effect(config: WorkspaceConfig, change: ServerEdit) -> str | None:
        if took_effect(config):
            return None
        return (
            "the change would not take effect: the servers in effect come from the environment (an "
            "IPYBOX_SERVERS variable, or the workspace's .env); change them there"
        )

    return edit_config_file(path, changed, in_effect, _edit_rules(path))


def _edit_rules(path: Path, change: str = "this change") -> EditRules:
    """How an edit of the servers in `path` explains a refusal."""
    return EditRules(
        refuse=lambda why: _refuse(path, why),
        fix_first="fix it first (`ipybox validate`)",
        missing="there is no such file (`ipybox init` writes one)",
        by_hand="edit it by hand",
        again="try again",
        change=change,
    )


def _without_empty_servers(data: dict[str, Any]) -> dict[str, Any]:
    # Removing the last server leaves no `servers` at all, or an empty one where `[servers]` is written.
    return {key: value for key, value in data.items() if not (key == "servers" and value == {})}
