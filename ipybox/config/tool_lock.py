"""Tool pinning: `ipybox.lock`, the MCP tools a workspace's servers were seen serving, so that a tool that
changes between two starts is noticed instead of inheriting what was decided about the old one.

An MCP server can change a tool between two starts (a "rug pull": a read-only tool turns into a write tool,
a description starts instructing the agent) while the approval rules and "always" answers written for the
old tool keep applying. `ipybox.lock`, next to `ipybox.toml` and meant to be committed with it, pins each
server's tools; this module is the pure part: pinning, reading and writing the file, comparing. Starting
servers, deciding when to pin and asking about changed tools are the callers' (it starts no process).

Contract:

- What is pinned, per server: its version (`serverInfo.version` of the MCP initialize result, `None` when
  the server sends none) and per tool:
  - `digest`: `"sha256:" + hex` of the SHA-256 of the canonical JSON of the object
    `{"name", "description", "inputSchema", "outputSchema", "annotations"}`: `json.dumps(obj,
    sort_keys=True, separators=(",", ":"), ensure_ascii=True)` (so key order and whitespace never matter,
    and every string, a lone surrogate included, has one spelling). A missing description or output
    schema is `null`; `annotations` is `ToolAnnotations.model_dump(by_alias=True, exclude_none=True)`:
    the spec's names (`readOnlyHint`), `title` included, `{}` when the tool declares none. These are what
    an agent reads (description, schemas) and what approval rules decide on (annotations). Not hashed:
    the tool's top-level `title`, `icons`, `execution` and `_meta`, which neither the agent's generated
    API nor a rule reads.
  - `input_digest`, `output_digest`: the same hash of each schema alone (`output_digest` is `None` without
    an output schema), so a change can say which schema changed without the file holding the schemas.
  - readable copies of what a person reviews: the description text and the annotations. They explain a
    change; the digest decides it: a tool is changed when its digest differs, whatever the copies say, so
    a hand-edited copy cannot hide a change. Strings are kept with a lone surrogate (which can't be
    written as UTF-8) replaced by U+FFFD; the digest is taken over the original.
  A name a faulty server lists twice is pinned as one tool whose digest covers every listing (the copies
  show the first in canonical order), so the pin does not depend on the order tools are listed in.
- Trust on first use: `compare(None, current)`, for a server the lock has never seen, is its own case
  (`LockDiff.unpinned`): the caller pins the server as first seen (`accept`) and asks about nothing.
  Only a server pinned before can have changed (`changed`) or new tools (`new`); `pending_tools` names the
  tools whose calls must be asked about until the change is accepted.
- `read_lock`: a missing file is an empty lock; anything that is not a lock ipybox wrote (bad TOML, a
  missing or mistyped key, a malformed digest, a newer format) is a `LockFileError`, one line
  `path:line:column: what is wrong; what to do` (the place when it is known), never a traceback. The lock
  is host-only state, read where a kernel or a sandboxed server may have planted something: the file is
  opened without following a symlink at its name (`O_NOFOLLOW`; the directories on the way are the
  user's) or blocking on a FIFO, and must be a regular file.
- `write_lock`: atomic (a temporary file created new in the same directory with `O_EXCL|O_NOFOLLOW`,
  fsync, `os.replace`, the directory fsync-ed), so a reader sees the old lock or the new one and nothing
  is written through a planted link. The output is deterministic (servers and tools sorted, one spelling
  per value): the same pins give the same bytes, so the file changes in git only when a tool did. A
  header comment says what the file is, that it is meant to be committed, and how to accept changes.
  Strings are written with every character a terminal or a diff would not show as itself (control and
  format characters, bidi overrides) escaped, so a reviewer reads what the server sent.
- Read-modify-write is the caller's: two writers racing each replace the file whole, the last one wins.

Example:
    ```python
    lock = read_lock(workspace / LOCK_FILE)
    current = pin_server(init.server_info.version, tools)
    diff = compare(lock.servers.get("edge"), current)
    if diff.unpinned:  # first sight: trusted and pinned
        write_lock(workspace / LOCK_FILE, accept(lock, "edge", current))
    for line in diff.lines():
        print(line)  # tool 'weather' changed: readOnlyHint: true -> false; description changed
    ask_about = pending_tools(diff)  # {"weather": "changed"}
    ```
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import json
import os
import re
import stat
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import mcp_types as types

from ipybox.config.positions import KeyPath, key_positions, too_deep
from ipybox.display_text import printable
from ipybox.errors import IpyboxError
from ipybox.safefs import replace_file

__all__ = [
    "LOCK_FILE",
    "AnnotationChange",
    "LockDiff",
    "LockFileError",
    "ServerPins",
    "ToolChange",
    "ToolLock",
    "ToolPin",
    "accept",
    "compare",
    "forget",
    "format_lock",
    "parse_lock",
    "pending_tools",
    "pin_server",
    "read_lock",
    "write_lock",
]

LOCK_FILE: Final = "ipybox.lock"

LOCK_FORMAT: Final = 1
"""The file's `format`: what its keys mean and how digests are taken. A reader refuses another one."""

MAX_LOCK_BYTES: Final = 16 * 1024 * 1024
"""The largest lock read: a few hundred tools with long descriptions are well under a megabyte."""

MAX_DIFF_INPUT_CHARS: Final = 20_000
"""Of each description, what is diffed (difflib's time grows faster than the text)."""

MAX_DIFF_LINES: Final = 40
MAX_DIFF_LINE_CHARS: Final = 200

_MAX_NESTING: Final = 16  # the lock nests 6 levels (`[servers.S.tools.T]`, its `annotations`)
_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")
_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
_SURROGATE: Final = re.compile(r"[\ud800-\udfff]")
_TOML_ERROR_PLACE: Final = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_TOML_SHORT_ESCAPES: Final = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
# Said after every refusal to read the lock: it is ipybox's, so the way out is the committed copy or a
# fresh start (servers are then trusted on first use again, which a person should choose knowingly).
_WHAT_TO_DO: Final = (
    "restore it from version control, or delete it to pin every server anew as first seen when it next starts"
)

HEADER: Final = f"""\
# {LOCK_FILE}: the MCP tools this workspace's servers serve, pinned when ipybox first saw them.
#
# Each tool's name, description, input and output schemas and annotations are hashed (`digest`). When a
# server serves a tool that differs from its pin, or a new tool, calls to that tool are asked about until
# the change is accepted; the description and annotations below are copies for reviewing such a change.
#
# Commit this file next to ipybox.toml: a change to it in review is a change to what the tools say.
# Accept a server's tools as it serves them now with `ipybox lock accept [SERVER] [-w DIR]`.
# Written by ipybox (sorted, so it changes only when a tool does); not meant to be edited by hand.
"""


# ---------------------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ToolPin:
    """One tool as pinned.

    Attributes:
        name: The tool's name, as the server lists it.
        digest: `"sha256:<hex>"` over name, description, schemas and annotations (the module's docstring).
        description: A copy of its description (`None`: it has none), for review.
        annotations: A copy of its annotations (`{"readOnlyHint": True, "title": "..."}`), for review.
        input_digest: The digest of its input schema alone.
        output_digest: The digest of its output schema alone, `None` when it has none.
    """

    name: str
    digest: str
    description: str | None
    annotations: dict[str, bool | str]
    input_digest: str
    output_digest: str | None


@dataclass(frozen=True)
class ServerPins:
    """One server's pins: its version (`None`: it sent none) and its tools by name."""

    version: str | None
    tools: dict[str, ToolPin]


@dataclass(frozen=True)
class ToolLock:
    """The pins of every server in a workspace, by server name (what `ipybox.lock` holds)."""

    servers: dict[str, ServerPins] = field(default_factory=dict)


@dataclass(frozen=True)
class AnnotationChange:
    """One annotation that differs: `old` as pinned, `new` as served (`None`: not declared)."""

    key: str
    old: bool | str | None
    new: bool | str | None

    def __str__(self) -> str:
        return f"{printable(self.key)}: {_shown(self.old)} -> {_shown(self.new)}"


@dataclass(frozen=True)
class ToolChange:
    """What differs between a tool's pin and the tool as served now.

    Attributes:
        name: The tool.
        description_changed: Its description differs.
        description_diff: A unified diff of the pinned and the served description, lines made printable
            and clipped (`MAX_DIFF_LINES` lines of `MAX_DIFF_LINE_CHARS` characters); empty when the
            description did not change.
        annotations: Each annotation that differs, sorted by key.
        input_schema_changed: Its input schema differs.
        output_schema_changed: Its output schema differs (added and removed included).
    """

    name: str
    description_changed: bool
    description_diff: tuple[str, ...]
    annotations: tuple[AnnotationChange, ...]
    input_schema_changed: bool
    output_schema_changed: bool

    def summary(self) -> str:
        """What changed, on one line: `readOnlyHint: true -> false; description changed`."""
        parts = []
        if self.annotations:
            parts.append(", ".join(map(str, self.annotations)))
        if self.description_changed:
            parts.append("description changed")
        if self.input_schema_changed:
            parts.append("input schema changed")
        if self.output_schema_changed:
            parts.append("output schema changed")
        # The digest differs, yet no copy does: the lock was edited, or the change is in what only the
        # digest covers exactly (a lone surrogate in a description).
        return "; ".join(parts) or f"its digest differs from the pin in {LOCK_FILE} (was it edited?)"


@dataclass(frozen=True)
class LockDiff:
    """How a server's tools as served now differ from its pins (`compare`).

    Attributes:
        changed: Tools whose digest differs, by name.
        new: Tools served now and not pinned, sorted.
        removed: Tools pinned and no longer served, sorted.
        version: `(pinned, served)` when the server's version string changed, else `None`.
        unpinned: The server was never pinned: trusted on first use (nothing else is set).
    """

    changed: dict[str, ToolChange] = field(default_factory=dict)
    new: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    version: tuple[str | None, str | None] | None = None
    unpinned: bool = False

    @property
    def clean(self) -> bool:
        """The pins are the server as served: there is nothing to ask about or to write."""
        return not (self.changed or self.new or self.removed or self.version or self.unpinned)

    def lines(self) -> list[str]:
        """Readable lines for `ipybox status` and a console, printable (no control characters): one per
        difference, each changed tool's description diff indented under it."""
        if self.unpinned:
            return ["not pinned yet: its tools are trusted as first seen and pinned"]
        lines: list[str] = []
        if self.version is not None:
            old, new = (printable(v) if v is not None else "none" for v in self.version)
            lines.append(f"version changed: {old} -> {new}")
        for name in sorted(self.changed):
            change = self.changed[name]
            lines.append(f"tool '{printable(name)}' changed: {change.summary()}")
            lines.extend(f"    {line}" for line in change.description_diff)
        lines.extend(f"tool '{printable(name)}' is new" for name in self.new)
        lines.extend(f"tool '{printable(name)}' was removed" for name in self.removed)
        return lines


class LockFileError(IpyboxError, ValueError):
    """An `ipybox.lock` that can't be used: not valid TOML, not what ipybox writes, a symlink, not a
    regular file, unreadable.

    `str(error)` is one line, `path:line:column: what is wrong; what to do` (without line and column when
    the place is not known).

    Attributes:
        path: The lock file, as given.
        line: 1-based line of the problem, `None` when unknown.
        column: 1-based column in that line.
        reason: What is wrong and what to do, without the place.
    """

    def __init__(self, path: str, reason: str, line: int | None = None, column: int | None = None) -> None:
        self.path = path
        self.line = line
        self.column = column
        self.reason = reason
        place = path if line is None else f"{path}:{line}:{column or 1}"
        super().__init__(f"{place}: {reason}")


# ---------------------------------------------------------------------------------------------- pinning


def pin_server(version: str | None, tools: Sequence[types.Tool]) -> ServerPins:
    """Pin a server's tools as served now (what is hashed: the module's docstring).

    Args:
        version: The server's `serverInfo.version` from its initialize result, `None` when it has none.
        tools: Its tools, as `tools/list` gave them (any order).
    """
    listed: dict[str, list[types.Tool]] = {}
    for tool in tools:
        listed.setdefault(_kept(tool.name), []).append(tool)
    pins = {name: _pin(name, same) for name, same in sorted(listed.items())}
    return ServerPins(_kept(version) if version is not None else None, pins)


def _pin(name: str, listings: list[types.Tool]) -> ToolPin:
    hashed = sorted(((_canonical(_hashed(tool)), tool) for tool in listings), key=lambda pair: pair[0])
    first = hashed[0][1]
    # Listed more than once: one digest over every listing, in canonical order.
    texts = [text for text, _ in hashed]
    digest = _sha256(texts[0] if len(texts) == 1 else _canonical(texts))
    return ToolPin(
        name=name,
        digest=digest,
        description=_kept(first.description) if first.description is not None else None,
        annotations={key: _kept(v) if isinstance(v, str) else v for key, v in _annotations(first).items()},
        input_digest=_sha256(_canonical(first.input_schema)),
        output_digest=_sha256(_canonical(first.output_schema)) if first.output_schema is not None else None,
    )


def _annotations(tool: types.Tool) -> dict[str, Any]:
    # As `ipybox.mcp_client.pool.annotations_of` gives them to rules: the spec's names, undeclared left out.
    if tool.annotations is None:
        return {}
    return tool.annotations.model_dump(by_alias=True, exclude_none=True)


def _hashed(tool: types.Tool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "outputSchema": tool.output_schema,
        "annotations": _annotations(tool),
    }


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def _kept(text: str) -> str:
    """`text` as the lock keeps it: a lone surrogate can't be written as UTF-8, so it becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


# ---------------------------------------------------------------------------------------------- comparing


def compare(pinned: ServerPins | None, current: ServerPins) -> LockDiff:
    """How `current` (`pin_server` of the server as served now) differs from its pins.

    Args:
        pinned: The server's pins from the lock; `None` when it was never pinned (`LockDiff.unpinned`:
            trust on first use, see the module's docstring).
        current: The server as served now.
    """
    if pinned is None:
        return LockDiff(unpinned=True)
    changed = {
        name: _tool_change(pinned.tools[name], tool)
        for name, tool in sorted(current.tools.items())
        if name in pinned.tools and pinned.tools[name].digest != tool.digest
    }
    return LockDiff(
        changed=changed,
        new=sorted(set(current.tools) - set(pinned.tools)),
        removed=sorted(set(pinned.tools) - set(current.tools)),
        version=(pinned.version, current.version) if pinned.version != current.version else None,
    )


def _tool_change(old: ToolPin, new: ToolPin) -> ToolChange:
    keys = sorted(set(old.annotations) | set(new.annotations))
    described = old.description != new.description
    return ToolChange(
        name=new.name,
        description_changed=described,
        description_diff=_description_diff(old.description, new.description) if described else (),
        annotations=tuple(
            AnnotationChange(key, old.annotations.get(key), new.annotations.get(key))
            for key in keys
            if old.annotations.get(key) != new.annotations.get(key)
        ),
        input_schema_changed=old.input_digest != new.input_digest,
        output_schema_changed=old.output_digest != new.output_digest,
    )


def _description_diff(old: str | None, new: str | None) -> tuple[str, ...]:
    before, after = (old or "")[:MAX_DIFF_INPUT_CHARS], (new or "")[:MAX_DIFF_INPUT_CHARS]
    lines = list(
        difflib.unified_diff(
            before.splitlines(), after.splitlines(), "pinned", "served now", lineterm="", n=2
        )
    )
    if not lines:
        if old is None or new is None:
            lines = ["(no description before)" if old is None else "(no description now)"]
        elif before == after:
            lines = [f"(they differ after the first {MAX_DIFF_INPUT_CHARS} characters)"]
        else:
            lines = ["(they differ in line breaks only)"]
    shown = [_clipped(printable(line)) for line in lines[:MAX_DIFF_LINES]]
    if len(lines) > MAX_DIFF_LINES:
        shown.append(f"... {len(lines) - MAX_DIFF_LINES} more lines of diff")
    return tuple(shown)


def _clipped(line: str) -> str:
    return line if len(line) <= MAX_DIFF_LINE_CHARS else line[:MAX_DIFF_LINE_CHARS] + "..."


def _shown(value: bool | str | None) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return printable(json.dumps(value, ensure_ascii=False))


def pending_tools(diff: LockDiff) -> dict[str, Literal["changed", "new"]]:
    """The tools whose calls must be asked about until the change is accepted: tool name -> `"changed"`
    or `"new"`. Nothing for a server never pinned (trusted on first use) or for removed tools."""
    pending: dict[str, Literal["changed", "new"]] = dict.fromkeys(diff.changed, "changed")
    pending.update(dict.fromkeys(diff.new, "new"))
    return pending


def accept(lock: ToolLock, server: str, current: ServerPins) -> ToolLock:
    """A new lock with `server`'s pins replaced by `current` (first sight, or a change accepted)."""
    return ToolLock({**lock.servers, server: current})


def forget(lock: ToolLock, server: str) -> ToolLock:
    """A new lock without `server` (removed from the workspace); the same pins when it has none."""
    return ToolLock({name: pins for name, pins in lock.servers.items() if name != server})


# ---------------------------------------------------------------------------------------------- writing


def format_lock(lock: ToolLock) -> str:
    """The text of `lock` as `write_lock` writes it: the header, then servers and tools sorted by name."""
    out = [HEADER, f"format = {LOCK_FORMAT}", ""]
    for server in sorted(lock.servers):
        pins = lock.servers[server]
        out.append(f"[servers.{_toml_key(server)}]")
        if pins.version is not None:
            out.append(f"version = {_toml_string(pins.version)}")
        out.append("")
        for name in sorted(pins.tools):
            tool = pins.tools[name]
            out.append(f"[servers.{_toml_key(server)}.tools.{_toml_key(name)}]")
            out.append(f"digest = {_toml_string(tool.digest)}")
            out.append(f"input_digest = {_toml_string(tool.input_digest)}")
            if tool.output_digest is not None:
                out.append(f"output_digest = {_toml_string(tool.output_digest)}")
            if tool.annotations:
                items = ", ".join(
                    f"{_toml_key(key)} = {_toml_value(tool.annotations[key])}"
                    for key in sorted(tool.annotations)
                )
                out.append(f"annotations = {{ {items} }}")
            if tool.description is not None:
                out.append(f"description = {_toml_text(tool.description)}")
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def write_lock(path: Path | str, lock: ToolLock) -> None:
    """Replace the lock file `path` with `lock`, atomically (the module's docstring). The file keeps its
    mode; a new one is created `0o644` less the umask (it is meant to be committed, not secret).

    Raises:
        OSError: The directory can't be written (the file is then as it was; no temporary file stays).
    """
    path = Path(path)
    data = format_lock(lock).encode()
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            existing = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
            mode = stat.S_IMODE(existing.st_mode) if stat.S_ISREG(existing.st_mode) else 0o644
        except FileNotFoundError:
            mode = 0o644
        replace_file(dir_fd, path.name, data, mode, durable=True)
    finally:
        os.close(dir_fd)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_value(value: bool | str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    raise TypeError(f"an annotation is a bool or a string, not {type(value).__name__}")


def _toml_string(text: str) -> str:
    """`text` as a one-line TOML basic string."""
    return '"' + _escaped(text, keep_newlines=False) + '"'


def _toml_text(text: str) -> str:
    """`text` as a TOML basic string, multi-line when it has line breaks (each line of a description is a
    line of the file, so a change to one shows as that line in `git diff`)."""
    if "\n" not in text:
        return _toml_string(text)
    # The newline right after the opening delimiter is not part of the string (TOML trims it).
    return '"""\n' + _escaped(text, keep_newlines=True) + '"""'


def _escaped(text: str, *, keep_newlines: bool) -> str:
    # Every quote and backslash is escaped, so neither a delimiter nor a line continuation can appear;
    # every character a terminal or diff would not show as itself (`printable`) is written as an escape.
    def escape(match: re.Match[str]) -> str:
        char = match.group()
        if char in '"\\':
            return "\\" + char
        if char == "\n" and keep_newlines:
            return char
        if char in _TOML_SHORT_ESCAPES:
            return _TOML_SHORT_ESCAPES[char]
        if printable(char) == char:
            return char
        code = 0xFFFD if 0xD800 <= ord(char) <= 0xDFFF else ord(char)  # TOML has no escape for a surrogate
        return f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"

    return re.sub(r"[^\x20-\x21\x23-\x5b\x5d-\x7e]", escape, text)


# ---------------------------------------------------------------------------------------------- reading


def read_lock(path: Path | str) -> ToolLock:
    """The lock in the file `path`; an empty lock when there is no such file.

    Raises:
        LockFileError: It is not a lock ipybox wrote, a symlink, not a regular file, too large or
            unreadable (one line, `path:line:column: what is wrong; what to do`).
    """
    source = str(path)
    try:
        # Not through a symlink a kernel or server may have planted, and not blocking on a FIFO.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return ToolLock()
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) and Path(path).is_symlink():
            raise LockFileError(
                source,
                "is a symlink, and the lock is read only as a regular file; replace the link with the file "
                "it points to, or delete it to pin every server anew as first seen",
            ) from None
        raise LockFileError(source, f"can't be read ({e.strerror or e}); {_WHAT_TO_DO}") from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise LockFileError(source, f"is not a regular file; {_WHAT_TO_DO}")
        try:
            data = file.read(MAX_LOCK_BYTES + 1)
        except OSError as e:
            raise LockFileError(source, f"can't be read ({e.strerror or e}); {_WHAT_TO_DO}") from None
    if len(data) > MAX_LOCK_BYTES:
        raise LockFileError(source, f"is larger than {MAX_LOCK_BYTES} bytes, which no lock is; {_WHAT_TO_DO}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise LockFileError(source, f"not UTF-8 text ({e.reason}); {_WHAT_TO_DO}", line, column) from None
    return parse_lock(text, source)


def parse_lock(text: str, source: str = LOCK_FILE) -> ToolLock:
    """The lock written in `text`; `source` names it in errors.

    Raises:
        LockFileError: `text` is not a lock ipybox wrote.
    """
    deep = too_deep(text, _MAX_NESTING)
    if deep is not None:
        (line, column), what = deep
        raise LockFileError(source, f"{what}, which a lock never has; {_WHAT_TO_DO}", line, column)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        message = str(e)
        place = _TOML_ERROR_PLACE.search(message)
        if place is None:  # "(at end of document)": the place is the end
            last = text.rsplit("\n", 1)[-1]
            line, column = text.count("\n") + 1, len(last) + 1
            message = message.replace(" (at end of document)", " at the end of the file")
        else:
            line, column, message = int(place.group(1)), int(place.group(2)), message[: place.start()]
        raise LockFileError(source, f"not valid TOML: {message}; {_WHAT_TO_DO}", line, column) from None
    except RecursionError:  # a backstop: `too_deep` keeps tomllib's recursion far from the limit
        raise LockFileError(source, f"nested too deeply to read; {_WHAT_TO_DO}") from None
    return _Reader(text, source).lock(data)


class _Reader:
    """Checks a parsed lock key by key; a refusal names the key's place (positions found only then)."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self._positions: dict[KeyPath, tuple[int, int]] | None = None

    def fail(self, at: KeyPath, what: str) -> LockFileError:
        if self._positions is None:
            self._positions = key_positions(self.text)
        for end in range(len(at), 0, -1):  # the key, else the nearest table around it that is written
            if at[:end] in self._positions:
                line, column = self._positions[at[:end]]
                return LockFileError(self.source, f"{what}; {_WHAT_TO_DO}", line, column)
        return LockFileError(self.source, f"{what}; {_WHAT_TO_DO}")

    def lock(self, data: dict[str, Any]) -> ToolLock:
        self.keys((), data, {"format", "servers"})
        if "format" not in data:
            raise self.fail((), f"no `format = {LOCK_FORMAT}`: this is not a lock ipybox wrote")
        version = data["format"]
        if type(version) is not int or version != LOCK_FORMAT:
            shown = _shown_toml(version)
            if type(version) is int and version > LOCK_FORMAT:
                newer = f"format {shown} is from a newer ipybox, and this one reads format {LOCK_FORMAT}"
                what = f"{newer}: upgrade ipybox"
            else:
                what = f"format {shown} is not one ipybox writes (it writes format {LOCK_FORMAT})"
            raise self.fail(("format",), what)
        servers = self.table(("servers",), data.get("servers", {}))
        return ToolLock({name: self.server(name, servers[name]) for name in sorted(servers)})

    def server(self, name: str, data: Any) -> ServerPins:
        at: KeyPath = ("servers", name)
        table = self.table(at, data)
        self.keys(at, table, {"version", "tools"})
        version = self.optional(at, table, "version", str)
        tools = self.table((*at, "tools"), table.get("tools", {}))
        return ServerPins(
            version, {tool: self.tool((*at, "tools", tool), tools[tool]) for tool in sorted(tools)}
        )

    def tool(self, at: KeyPath, data: Any) -> ToolPin:
        table = self.table(at, data)
        self.keys(at, table, {"digest", "input_digest", "output_digest", "description", "annotations"})
        annotations = self.table((*at, "annotations"), table.get("annotations", {}))
        for key, value in annotations.items():
            if not isinstance(value, bool | str):
                raise self.fail(
                    (*at, "annotations", key), f"annotation {key!r} is neither a boolean nor a string"
                )
        return ToolPin(
            name=str(at[-1]),
            digest=self.digest(at, table, "digest", required=True) or "",
            description=self.optional(at, table, "description", str),
            annotations=dict(annotations),
            input_digest=self.digest(at, table, "input_digest", required=True) or "",
            output_digest=self.digest(at, table, "output_digest", required=False),
        )

    def digest(self, at: KeyPath, table: dict[str, Any], key: str, *, required: bool) -> str | None:
        if key not in table:
            if required:
                raise self.fail(at, f"[{_dotted(at)}] has no {key}")
            return None
        value = table[key]
        if not isinstance(value, str) or not _DIGEST.fullmatch(value):
            raise self.fail((*at, key), f'{key} is not "sha256:" and 64 lowercase hex digits')
        return value

    def optional(self, at: KeyPath, table: dict[str, Any], key: str, kind: type[str]) -> str | None:
        value = table.get(key)
        if value is not None and not isinstance(value, kind):
            raise self.fail((*at, key), f"{key} in [{_dotted(at)}] is not a string")
        return value

    def table(self, at: KeyPath, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(at, f"{_dotted(at)} is not a table")
        return value

    def keys(self, at: KeyPath, table: dict[str, Any], known: set[str]) -> None:
        for key in table:
            if key not in known:
                where = f" in [{_dotted(at)}]" if at else ""
                expected = ", ".join(sorted(known))
                raise self.fail(
                    (*at, key), f"unknown key {printable(repr(key))}{where} (expected: {expected})"
                )


def _dotted(at: KeyPath) -> str:
    return printable(".".join(_toml_key(str(part)) for part in at))


def _shown_toml(value: Any) -> str:
    return printable(repr(value))
