"""An append-only JSONL record of approval decisions, with secrets redacted.

Each decision is one JSON object on one line:

```json
{"time": "2025-06-01T12:00:00.000000Z", "server": "filesystem", "tool": "write_file",
 "args": {"path": "out/a.md", "token": "[redacted]"}, "decision": "allow", "rule_id": "writes-to-out",
 "decided_by": "rule", "reason": "rule 'writes-to-out' applies"}
```

Contract: a line is appended whole or not at all. With the disk full (`ENOSPC`) or past the file size
limit (`EFBIG`), a write stores part of a line and fails, or stores part and reports it (a short write);
left there, that part glued the next record to it and made the log unreadable (issue 14, item 10). So each
line is one `write(2)` on an `O_APPEND` descriptor, under an exclusive `flock` of the log that every
ipybox process appending to it takes (the supervisor, `ipybox mcp`); a write that fails or comes up short
is cut back (`ftruncate`) to the size the log had before, and `record` raises `OSError`, so the decision is
not acted on. The `flock` is what makes cutting back safe: no other ipybox process appends in between.
A log whose last line is unterminated anyway (a crash of an older ipybox, a writer that takes no lock)
gets the next line on a line of its own.

A full disk must not turn every decision into a refusal (issue 31: a kernel fills the workspace's disk,
then no other session's call could be recorded, so none ran). The log keeps a reserve: `RESERVE_BYTES`
allocated past its end (`fallocate` with `FALLOC_FL_KEEP_SIZE`: the size and the content stay as they
are), topped up before every append. With the disk full the top-up fails but the line still fits, in
blocks that are already the log's, which nothing else can take (a reserve file freed for the append would
race a kernel still writing); the first such append logs an ERROR that the disk is full, and the first
top-up that succeeds again logs that the reserve is back. `arm_reserve()` makes it before the first
decision (the supervisor calls it at start). Where the filesystem can't preallocate (some network and FUSE
filesystems), or it never had room for the reserve, a full disk refuses lines as before.

Reading skips a damaged line instead of failing: `AuditLog.load()` returns the entries and the numbers of
the lines it could not read; `read()` logs those at WARNING.

`AuditLog.page()` reads the log newest first, a page at a time, for the console's audit view: it reads
the file backwards from a byte offset in blocks of `PAGE_BLOCK_BYTES`, so its memory is one block plus
the longest line whatever the size of the log, and a page's `older` offset names where the next page
starts, stable while the log grows (lines are only ever appended). With an `AuditFilter.since`, reading
stops at the first entry older than it: the log is in time order, give or take `ORDER_SLACK` (two
processes append, each stamping its line just before it takes the lock). Measured on a 100 MB log
(271,000 lines): the newest page of 50 in 0.4 ms; 50 entries of a filter one line in 1,000 matches in
0.33 s; a filter nothing matches reads the whole file in 1.9 s, peaking at 131 KiB (tracemalloc), where
`load()` takes 10 s and 491 MiB; the same filter with `since` an hour back stops after 27 ms.

Tamper evidence: every line carries `prev`, the SHA-256 (hex) of the line before it as it stands in the
file (its bytes without the newline), so editing, inserting or deleting a line breaks the link of the line
after it, which `verify_chain()` finds. The first record of a log has `prev` = `GENESIS`. `prev` is the
last key of the object: the line is made outside the lock without it, and the hash is put in under the
`flock` of the append, because two processes append (the supervisor and `ipybox mcp`) and the line before
is only known there. Finding it costs no read in the common case: each `AuditLog` keeps the hash of the
line it wrote last with the file's (device, inode, size) after it, and only reads the file's last line
backwards when that no longer matches (the other process appended). Lines written before ipybox chained
them (no `prev`) may open the oldest file: they are counted, not checked, and the first chained record
names the last of them. What the chain can't show by itself: the newest records cut off the end (the
records before still link up), or a whole log rewritten with new hashes. `ChainReport.head` is the hash
the next record will name: kept elsewhere, it shows both.

Rotation: an append that would take the file past `max_bytes` (default `MAX_BYTES`, 64 MiB) first renames
it to `<name>.<n>`, `n` one more than the highest number there (so the oldest keeps the smallest; a rename
never replaces a file, `RENAME_NOREPLACE`), and the line starts a new file, whose first record names the
last line of the renamed one: the chain runs on across files. Rotated files are never deleted, nor written
again. The rename is made under the file's `flock`; an append that waited for that lock checks that the
path still names the file it locked, and opens the new one if not. A current file that is empty (or not
there yet) continues the newest rotated file. While the disk is (nearly) full the rotation waits: the new
file would have no reserve, and the old one's is where the lines go.

Reading every file, oldest first: `AuditLog.files()`, `AuditLog.iter_entries()` (a line at a time, damaged
lines skipped) and `verify_chain()`. Those two read the current file up to its size at one moment taken
under a shared `flock` (no append is half-written there, and the file list and the file agree).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import fnmatch
import functools
import hashlib
import json
import logging
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal, get_args

from ipybox.rules.calls import ToolCall, Verdict

DecidedBy = Literal[
    "rule", "default", "application", "elicitation", "console", "terminal", "session", "timeout"
]
"""Who made the final decision: a rule, the policy's default; for an `ask`, where it was answered (the
attached application, the MCP client's elicitation, the web console, `ipybox approve`), an answer given
earlier for the whole session (`session`), or nobody in time (`timeout`, which denies)."""

Scope = Literal["once", "session", "always"]
"""How far a person's answer to an `ask` reaches (see `ipybox.approval.asks`)."""

REDACTED: Final = "[redacted]"

_SECRET_KEY: Final = re.compile(
    r"token|password|passwd|secret|api[_-]?key|authorization|credential|private[_-]?key", re.IGNORECASE
)
# Shorter strings would redact ordinary words and numbers all over the log.
_MIN_SECRET_LENGTH: Final = 4


def names_a_secret(key: str) -> bool:
    """Whether a value under `key` is a secret by its name (`token`, `password`, `api_key`,
    `authorization`, ...): the log redacts those, and `ipybox server add` suggests a `${VAR}` for them."""
    return _SECRET_KEY.search(key) is not None


logger = logging.getLogger(__name__)

# One lock for every log in the process (threads, and tasks through `asyncio.to_thread`); `flock` on the
# file is the lock between processes.
_WRITE_LOCK: Final = threading.Lock()
# How long an append waits for another process's: one append takes microseconds, so a lock held this long
# is held by something that is not appending (it fails the call rather than hang it).
_FLOCK_WAIT_S: Final = 10.0

RESERVE_BYTES: Final = 1024**2
"""Space kept allocated past the end of the log for a full disk: about 3,000 decisions."""
_FALLOC_FL_KEEP_SIZE: Final = 1


@functools.cache
def _fallocate() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    function = libc.fallocate64 if hasattr(libc, "fallocate64") else libc.fallocate
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function


def _preallocate(fd: int, offset: int, length: int) -> None:
    """Allocate `length` bytes from `offset` without changing the file's size.

    Raises:
        OSError: ENOSPC (the disk is full), EOPNOTSUPP (the filesystem can't), ...
    """
    if not sys.platform.startswith("linux"):  # FALLOC_FL_KEEP_SIZE is Linux's
        raise OSError(errno.EOPNOTSUPP, "no fallocate on this platform")
    if _fallocate()(fd, _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


_AT_FDCWD: Final = -100
_RENAME_NOREPLACE: Final = 1


@functools.cache
def _renameat2() -> Any:
    """libc's `renameat2` (glibc 2.28 and later), or `None`."""
    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        function.restype = ctypes.c_int
    return function


def _rename_noreplace(source: Path, target: Path) -> None:
    """Rename `source` to `target`, never replacing an existing `target`.

    Raises:
        FileExistsError: `target` exists.
        OSError: The rename failed otherwise.
    """
    function = _renameat2() if sys.platform.startswith("linux") else None
    if function is not None:
        if function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE) == 0:
            return
        number = ctypes.get_errno()
        if number not in (errno.ENOSYS, errno.EINVAL):  # EINVAL: the filesystem can't do NOREPLACE
            raise OSError(number, os.strerror(number), str(source), None, str(target))
    # Without it, a check then a rename: ipybox only rotates under the log's flock, so no other ipybox
    # process takes the name in between.
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    os.rename(source, target)


GENESIS: Final = "0" * 64
"""The `prev` of the first record of a log: the hash of no line."""

MAX_BYTES: Final = 64 * 1024**2
"""The default size at which `AuditLog` starts a new file: about 180,000 decisions (370 bytes each). The
console's page and `load()` read the current file only, all of it at worst; scaled from the 100 MB measured
in the module docstring, a filter nothing matches takes about 1.3 s on 64 MiB and `load()` about 330 MiB of
memory, where an unbounded log would make both grow without end."""

# How much of the end of the log is read (backwards) at a time for the hash of its last line: a few lines.
_TAIL_BLOCK: Final = 4096
# The read buffer of the readers of every file (`verify_chain`, `iter_entries`).
_READ_BUFFER: Final = 256 * 1024
# How many times an append reopens the log renamed away under it before it gives up (each takes a whole
# rotation by another process: more than a few means something else keeps replacing the file).
_REOPEN_LIMIT: Final = 100
# Free space on the filesystem below which a rotation waits: the new file's reserve, and room to spare.
_ROTATE_MIN_FREE: Final = 2 * RESERVE_BYTES
_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def code_hash(code: str) -> str:
    """The hex SHA-256 of a code action's text (UTF-8; a lone surrogate is hashed as it is, never an
    error), as `AuditLog.record(code=...)` takes it."""
    return _sha256(code.encode("utf-8", "surrogatepass"))


# Left out of a line when `None`: lines of decisions without them keep the keys they always had. `prev`
# last: `AuditLog` puts it in at the end of the line made without it (see the module docstring).
_OPTIONAL_KEYS: Final = ("tier", "scope", "by", "code", "quota", "provenance", "session_read", "prev")

MAX_PROVENANCE_PATHS: Final = 16
"""Argument paths whose provenance a line records (each with at most `provenance.MAX_ORIGINS` origins):
a call with thousands of matched values writes a bounded line."""


def _provenance_entry(call: ToolCall) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None]:
    """`call`'s provenance and session taint as an audit line holds them (bounded), `None` when empty."""
    provenance = None
    if call.provenance:
        provenance = {
            path: [origin.to_json() for origin in origins]
            for path, origins in list(call.provenance.items())[:MAX_PROVENANCE_PATHS]
        }
        if len(call.provenance) > MAX_PROVENANCE_PATHS:
            provenance["..."] = [{"more": len(call.provenance) - MAX_PROVENANCE_PATHS}]
    read = [origin.to_json() for origin in call.session_read] or None
    return provenance, read


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One line of the audit log.

    Attributes:
        time: When the decision was recorded, ISO 8601 in UTC (`...Z`).
        server: The MCP server.
        tool: The tool.
        args: The call's arguments, secrets redacted.
        decision: The final decision (an `ask` is recorded with the answer it got).
        rule_id: The rule that decided or asked, `None` if the default did.
        decided_by: Who decided (see `DecidedBy`).
        reason: A short explanation for humans.
        tier: The admin tier of that rule (`system`, `user`; `Verdict.tier`), `None` for the workspace's
            own rules (and in lines written before ipybox had tiers).
        scope: For an answered `ask`: `once`, `session` or `always` (`None` otherwise, and in lines
            written before ipybox recorded it).
        by: For an answered `ask`: who answered (`console (root)`, `terminal (alice on /dev/pts/3)`).
        code: The hex SHA-256 of the code action that made the call (`code_hash`), when known.
        quota: When a rule's call quota tripped: which, and how far (`session 100/100`).
        provenance: Where argument values came from (`ToolCall.provenance`): by argument path, the
            origins (`server`, `tool`, `serial`, `label`, `time`) each matched; at most
            `MAX_PROVENANCE_PATHS` paths. `None` when no value matched.
        session_read: The labels the calling session had read, each with the first result that brought
            it (`ToolCall.session_read`). `None` when it had read nothing.
        prev: The hex SHA-256 of the line before this one in the log (`GENESIS` for the first); `None` in
            an entry not written yet, and in lines written before ipybox chained them.
    """

    time: str
    server: str
    tool: str
    args: dict[str, Any]
    decision: Literal["allow", "deny"]
    rule_id: str | None
    decided_by: DecidedBy
    reason: str | None = None
    tier: str | None = None
    scope: Scope | None = None
    by: str | None = None
    code: str | None = None
    quota: str | None = None
    provenance: dict[str, Any] | None = None
    session_read: list[dict[str, Any]] | None = None
    prev: str | None = None  # the last field: see _OPTIONAL_KEYS

    def to_json(self) -> str:
        """The entry as one line of JSON (without the newline), exactly as `AuditLog` writes it."""
        # ASCII only: JSON escapes every line break then, including U+2028 that some readers split on.
        # The fields as they are, not `asdict`, which copies `args` deeply for nothing: 27 µs a line (a
        # third of a `record()`), where this takes 7.
        data = {name: getattr(self, name) for name in self.__slots__}
        for key in _OPTIONAL_KEYS:
            if data[key] is None:
                del data[key]
        return json.dumps(data, ensure_ascii=True, separators=(", ", ": "))

    @classmethod
    def from_json(cls, line: str) -> AuditEntry:
        """Parse one line written by `to_json`.

        Raises:
            ValueError: Not a line `to_json` writes (not JSON, not an object, or other fields).
        """
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("an audit line is a JSON object")
        try:
            return cls(**data)
        except TypeError as e:
            raise ValueError(f"not an audit entry: {e}") from None


@dataclass(frozen=True, slots=True)
class AuditLogContents:
    """What `AuditLog.load()` read.

    Attributes:
        entries: The entries of the lines that could be read, oldest first.
        damaged_lines: The numbers (1-based) of the lines that could not: cut short (by a crash or a
            full disk before ipybox wrote lines whole), glued to another, or not an audit entry.
    """

    entries: list[AuditEntry]
    damaged_lines: list[int]


PAGE_BLOCK_BYTES: Final = 64 * 1024
"""How much of the log `AuditLog.page()` reads at a time (backwards)."""

ORDER_SLACK: Final = timedelta(seconds=60)
"""How far out of time order two lines of the log may be: a page with `since` reads on this far past the
first entry older than `since` before it stops."""

_GLOB_CHARS: Final = re.compile(r"[*?\[]")


def _parse_time(value: str) -> datetime:
    """An ISO 8601 date or date-time as an aware datetime (UTC when it names no zone).

    Raises:
        ValueError: Not one.
    """
    parsed = datetime.fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def _name_matcher(pattern: str | None) -> Any:
    """`None`, or a test of a name against `pattern`: equality, or an fnmatch glob if it has `*?[`."""
    if pattern is None:
        return None
    if _GLOB_CHARS.search(pattern):
        return re.compile(fnmatch.translate(pattern)).match
    return pattern.__eq__


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which entries of the audit log to show; every field given must hold (`None`: any).

    Attributes:
        server: The server's name; with `*`, `?` or `[` an fnmatch glob (`file*`).
        tool: The tool's name, or a glob as for `server`.
        decision: `allow` or `deny`.
        rule_id: The rule that decided or asked, or a glob as for `server` (entries the default decided
            have none: filter those by `decided_by="default"`).
        decided_by: Who decided (see `DecidedBy`).
        since: ISO 8601 date or date-time (UTC when it names no zone), inclusive: `2026-11-24`,
            `2026-11-24T07:00`, `2026-11-24T07:00:00+01:00`.
        until: As `since`, exclusive (`until="2026-11-25"` ends with the 24th).

    Raises:
        ValueError: `since` or `until` is not an ISO 8601 date or date-time, or `until` is not after
            `since`; the message names the field.

    Example:
        ```python
        where = AuditFilter.parse(server="filesystem", decision="deny", since="2026-11-24")
        page = log.page(where=where)
        ```
    """

    server: str | None = None
    tool: str | None = None
    decision: Literal["allow", "deny"] | None = None
    rule_id: str | None = None
    decided_by: DecidedBy | None = None
    since: str | None = None
    until: str | None = None
    _since: datetime | None = field(default=None, init=False, repr=False, compare=False)
    _until: datetime | None = field(default=None, init=False, repr=False, compare=False)
    _tests: tuple[tuple[str, Any], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bounds = {}
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None:
                try:
                    bounds[name] = _parse_time(value)
                except ValueError:
                    raise ValueError(
                        f"{name}: expected an ISO 8601 date or date-time (2026-11-24, 2026-11-24T07:00, "
                        f"2026-11-24T07:00:00Z), got {value!r}"
                    ) from None
        if "since" in bounds and "until" in bounds and bounds["until"] <= bounds["since"]:
            raise ValueError(
                f"until: {self.until!r} is not after since ({self.since!r}): no entry could match"
            )
        tests = [
            (name, matcher)
            for name in ("server", "tool", "rule_id")
            if (matcher := _name_matcher(getattr(self, name))) is not None
        ]
        # Frozen: set the derived fields the way dataclasses' own __init__ does.
        object.__setattr__(self, "_since", bounds.get("since"))
        object.__setattr__(self, "_until", bounds.get("until"))
        object.__setattr__(self, "_tests", tuple(tests))

    @classmethod
    def parse(cls, **fields_given: str) -> AuditFilter:
        """A filter from form fields, by name; `""` (or only spaces) means not given.

        Raises:
            ValueError: An unknown field, a `decision` or `decided_by` that is not one of its values, or
                a bad time; the message names the field and what it expects.
        """
        known = [f.name for f in fields(cls) if not f.name.startswith("_")]
        values: dict[str, Any] = {}
        for name, raw in fields_given.items():
            if name not in known:
                raise ValueError(f"{name}: not an audit filter; the filters are {', '.join(known)}")
            value = raw.strip()
            if not value:
                continue
            allowed = {"decision": ("allow", "deny"), "decided_by": get_args(DecidedBy)}.get(name)
            if allowed is not None and value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
            values[name] = value
        return cls(**values)

    def matches(self, entry: AuditEntry) -> bool:
        """Whether `entry` passes every condition given (an entry whose time does not read as a time
        passes no condition on time)."""
        if self.decision is not None and entry.decision != self.decision:
            return False
        if self.decided_by is not None and entry.decided_by != self.decided_by:
            return False
        for name, test in self._tests:
            value = getattr(entry, name)
            if not isinstance(value, str) or not test(value):
                return False
        if self._since is None and self._until is None:
            return True
        at = _entry_time(entry)
        if at is None:
            return False
        return (self._since is None or at >= self._since) and (self._until is None or at < self._until)


def _entry_time(entry: AuditEntry) -> datetime | None:
    try:
        return _parse_time(entry.time)
    except (TypeError, ValueError):  # a line not written by ipybox may hold anything there
        return None


@dataclass(frozen=True, slots=True)
class AuditPage:
    """One page of the audit log, as `AuditLog.page()` read it.

    Attributes:
        entries: The entries, newest first.
        older: Pass as `before` for the next, older page; `None`: the start of the log was reached (or,
            with `since`, entries older than it).
        damaged: How many damaged lines were skipped on this page.
    """

    entries: list[AuditEntry]
    older: int | None
    damaged: int


@dataclass(frozen=True, slots=True)
class BrokenLink:
    """Where `verify_chain` found the chain broken: the first line that does not link up.

    Attributes:
        file: The file the line is in.
        line: The line's number in that file (1-based).
        reason: What is wrong, for humans: "prev does not match the hash of line 41", "line is not valid
            JSON", "the first record of audit.jsonl does not continue audit.jsonl.3", ...
    """

    file: str
    line: int
    reason: str


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What `verify_chain` found.

    Attributes:
        ok: Every record links to the line before it (the chain is intact).
        records: How many chained records were checked (up to the break, when broken).
        files: The files read, oldest first (rotated files, then the current one).
        broken: Where the chain breaks; `None` when `ok`.
        unchained: How many lines at the start of the oldest file were written before ipybox chained
            them (no `prev`): tolerated, but nothing vouches for them (except the last, which the first
            chained record names).
        head: The hash of the last line, which the next record will name as its `prev` (`None` when
            broken, or when there are no lines): kept elsewhere, it shows later that no record was cut off
            the end or the log rewritten.
    """

    ok: bool
    records: int
    files: list[str]
    broken: BrokenLink | None
    unchained: int = 0
    head: str | None = None


class AuditLog:
    """Appends one `AuditEntry` per decision to a JSONL file.

    The file and its missing parent directories are created on the first append, the file with mode
    0600 (an existing file is narrowed to 0600). It is never opened through a symlink, and only written
    if it is a regular file of ours with one link (a kernel may have planted a link where it goes). Each
    append opens the file in append mode and writes the whole line with one `write` call, so lines from
    concurrent tasks, threads and processes never interleave, and a line reaches the OS before `record`
    returns; a line that does not fit (disk full) is taken back whole (see the module docstring). It is a
    short blocking call, fine on the event loop.

    Each line carries the hash of the line before it (`prev`), and the file is rotated at `max_bytes`
    (see the module docstring). `read()`, `load()` and `page()` read the current file; `files()` and
    `iter_entries()` reach the rotated ones too.

    Args:
        path: The log file.
        secrets: Strings to redact wherever they occur in recorded values, e.g. the resolved values of
            `${VAR}` references in the workspace config. Strings shorter than 4 characters are ignored.
        max_bytes: An append that would take the file past this size starts a new file (a single line
            longer than that gets a file of its own).

    Raises:
        ValueError: `max_bytes` is below 1.
    """

    def __init__(
        self, path: str | os.PathLike[str], secrets: Iterable[str] = (), *, max_bytes: int = MAX_BYTES
    ) -> None:
        if max_bytes < 1:
            raise ValueError(
                f"max_bytes: the size at which the log starts a new file (1 or more), got {max_bytes}"
            )
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._redactor = _Redactor(secrets)
        self._prepared = False
        self._disk_full = False
        self._no_reserve: int | None = None  # the errno the reserve could not be made with, logged once
        self._no_rotation: int | None = None  # the errno a rotation failed with, logged once
        # The hash of the line this object wrote last, and the file's (device, inode, size) right after it:
        # while those still match, that line is the file's last and the next `prev` needs no read.
        self._head: tuple[tuple[int, int, int], str] | None = None
        self._rotated_pattern = re.compile(re.escape(self.path.name) + r"\.([1-9][0-9]*)")

    def redact_also(self, secrets: Iterable[str]) -> None:
        """Redact `secrets` too from now on (secrets resolved again after an edit); those given before
        stay redacted."""
        self._redactor = self._redactor.more(secrets)

    def record(
        self,
        call: ToolCall,
        verdict: Verdict,
        *,
        answer: Literal["allow", "deny"] | None = None,
        timed_out: bool = False,
        reason: str | None = None,
        decided_by: DecidedBy | None = None,
        scope: Scope | None = None,
        by: str | None = None,
        code: str | None = None,
        quota: str | None = None,
    ) -> AuditEntry:
        """Append the final decision on `call`, chained to the line before it (`prev`).

        Args:
            call: The tool call.
            verdict: The policy's verdict on it.
            answer: For an `ask` verdict, the application's answer.
            timed_out: For an `ask` verdict, `True` if the application did not answer in time (the call
                is then recorded as denied).
            reason: Overrides the recorded reason (by default the verdict's, with the answer appended).
            decided_by: For an answered `ask`: where it was answered (default `application`).
            scope: For an answered `ask`: how far the answer reaches.
            by: For an answered `ask`: who answered.
            code: The hex SHA-256 of the code action that made the call (`code_hash(text)`), when known.
                Never the code itself: it may hold secrets the log has no way to find.
            quota: When a rule's call quota tripped, a short text saying which (`session 100/100`).

        Returns:
            The entry as written, `prev` included.

        Raises:
            ValueError: An `ask` verdict without exactly one of `answer` and `timed_out`, or another
                verdict with either; a `code` that is not a hex SHA-256.
            OSError: The line could not be written (nothing of it is left in the log); the caller should
                not run the call.
        """
        if code is not None and not _SHA256_HEX.fullmatch(code):
            raise ValueError(
                "code: the hex SHA-256 of the code action (code_hash(text)), not the code itself"
            )
        decision: Literal["allow", "deny"]
        final: DecidedBy
        if verdict.decision == "ask":
            if (answer is None) == (not timed_out):
                raise ValueError("an `ask` verdict is recorded with either an `answer` or `timed_out=True`")
            if answer is not None:
                decision, final = answer, decided_by or "application"
                who = by or f"the {final}"
                default_reason = f"{verdict.reason}; {who} answered {answer}"
            else:
                decision, final = "deny", "timeout"
                default_reason = f"{verdict.reason}; no answer in time"
        else:
            if answer is not None or timed_out or decided_by is not None or scope is not None:
                raise ValueError(
                    "`answer`, `timed_out`, `decided_by` and `scope` are only for `ask` verdicts"
                )
            decision = verdict.decision
            final = "rule" if verdict.rule_id is not None else "default"
            default_reason = verdict.reason
        redact = self._redactor
        provenance, read = _provenance_entry(call)
        values: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "server": call.server,
            "tool": call.tool,
            "args": redact.mapping(call.args),
            "decision": decision,
            "rule_id": verdict.rule_id,
            "decided_by": final,
            "reason": redact.text(reason if reason is not None else default_reason),
            "tier": verdict.tier,
            "scope": scope,
            "by": by,
            "code": code,
            "quota": None if quota is None else redact.text(quota),
            "provenance": provenance,
            "session_read": read,
        }
        prev = self._append(AuditEntry(**values).to_json().encode("utf-8"))
        # Made again rather than `dataclasses.replace`d: a third of the cost.
        return AuditEntry(**values, prev=prev)

    def read(self) -> list[AuditEntry]:
        """All entries in the log, oldest first (none if the file does not exist). Damaged lines are
        skipped and logged at WARNING with their numbers (`load()` returns them).

        Raises:
            OSError: The file is a symlink or not a regular file.
        """
        contents = self.load()
        if contents.damaged_lines:
            logger.warning(
                "the audit log %s has %d damaged line(s), skipped: line %s",
                self.path,
                len(contents.damaged_lines),
                ", ".join(map(str, contents.damaged_lines[:20]))
                + (", ..." if len(contents.damaged_lines) > 20 else ""),
            )
        return contents.entries

    def load(self) -> AuditLogContents:
        """The entries in the log and the numbers of its damaged lines (empty if the file does not exist).

        Raises:
            OSError: The file is a symlink or not a regular file.
        """
        try:
            fd = self._open(os.O_RDONLY)
        except FileNotFoundError:
            return AuditLogContents([], [])
        with os.fdopen(fd, "rb") as file:
            data = file.read()
        entries: list[AuditEntry] = []
        damaged: list[int] = []
        for number, line in enumerate(data.split(b"\n"), start=1):
            if not line:
                continue
            try:
                entries.append(AuditEntry.from_json(line.decode("utf-8")))
            except ValueError:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
                damaged.append(number)
        return AuditLogContents(entries, damaged)

    def page(
        self, *, before: int | None = None, limit: int = 50, where: AuditFilter | None = None
    ) -> AuditPage:
        """The newest `limit` entries (that `where` matches) before byte offset `before`, newest first.

        The file is read backwards in blocks, never whole: memory stays within a block plus the longest
        line. Damaged lines are skipped and counted. Paging on with each page's `older` gives every entry
        once, also while entries are appended.

        Args:
            before: Where to start reading backwards: a page's `older`; `None` (the end of the log) for the
                newest page. A line that `before` cuts is left out (it belongs to a newer page).
            limit: At most this many entries.
            where: Only entries it matches; with `since`, reading stops at entries older than that.

        Raises:
            ValueError: `limit` is below 1 or `before` is negative.
            OSError: The file is a symlink or not a regular file.
        """
        if limit < 1:
            raise ValueError(f"limit: at least 1 entry per page, got {limit}")
        if before is not None and before < 0:
            raise ValueError(f"before: a byte offset in the log (0 or more), got {before}")
        try:
            fd = self._open(os.O_RDONLY)
        except FileNotFoundError:
            return AuditPage([], None, 0)
        try:
            size = os.fstat(fd).st_size
            end = size if before is None else min(before, size)
            oldest = None
            if where is not None and where._since is not None:
                oldest = where._since - ORDER_SLACK
            entries: list[AuditEntry] = []
            damaged = 0
            for start, line, terminated in _lines_backwards(fd, end, PAGE_BLOCK_BYTES):
                if not line or (before is not None and not terminated):
                    continue
                try:
                    entry = AuditEntry.from_json(line.decode("utf-8"))
                except ValueError:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
                    damaged += 1
                    continue
                if where is None or where.matches(entry):
                    entries.append(entry)
                elif oldest is not None:
                    at = _entry_time(entry)
                    if at is not None and at < oldest:
                        return AuditPage(entries, None, damaged)  # all older ones are older still
                if len(entries) == limit:
                    return AuditPage(entries, start or None, damaged)
            return AuditPage(entries, None, damaged)
        finally:
            os.close(fd)

    def redact(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """`args` with secrets replaced by `[redacted]`, as `record()` writes them: values under
        secret-looking keys (`token`, `password`, `api_key`, ...) and the known secret strings wherever
        they occur, in nested values too."""
        return self._redactor.mapping(args)

    def _open(self, flags: int, path: Path | None = None) -> int:
        """Open the log (or another of its files) without following a symlink (a kernel may have planted
        one where the log goes) or blocking on a FIFO; a log written to must be a regular file of ours with
        one link."""
        path = self.path if path is None else path
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO) and not path.is_dir():
                kind = "a symlink" if path.is_symlink() else "not a regular file"
                raise OSError(e.errno, f"the audit log {path} is {kind}: not writing through it") from None
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(errno.EINVAL, f"the audit log {path} is not a regular file")
            if flags & (os.O_WRONLY | os.O_RDWR) and (info.st_nlink != 1 or info.st_uid != os.geteuid()):
                raise OSError(
                    errno.EPERM,
                    f"the audit log {path} is hard-linked or owned by another user: not writing to it",
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def arm_reserve(self) -> None:
        """Make the log (if need be) and its reserve for a full disk (see the module docstring), before
        anything fills the disk. Never raises: a log that can't have one is logged, and still written.
        """
        try:
            self._append(None)
        except OSError as e:
            logger.error("could not prepare the audit log %s: %s", self.path, e)

    def _append(self, record: bytes | None) -> str | None:
        """Append `record` (a JSON object without `prev`, as `AuditEntry.to_json` makes it) as one line with
        `prev` put in as its last key, rotating the file first if the line would take it past `max_bytes`;
        `None` only makes the log and tops up its reserve.

        Returns:
            The `prev` written (`None` for `None`).

        Raises:
            OSError: Nothing of the line is in the log (see the module docstring).
        """
        with _WRITE_LOCK:
            if not self._prepared:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            continues: str | None = None  # after a rotation of ours: what the new file's first line names
            retired = -1  # the file rotated away, its reserve given back once the new file has made its own
            try:
                for _ in range(_REOPEN_LIMIT):
                    # Read-write: the end of the log is read (`pread`) for the hash of its last line.
                    fd = self._open(os.O_RDWR | os.O_APPEND | os.O_CREAT)
                    try:
                        if not self._prepared:
                            if os.fstat(fd).st_mode & 0o077:
                                os.fchmod(fd, 0o600)
                            self._prepared = True
                        self._lock(fd)  # released by the close below
                        info = os.fstat(fd)
                        if not self._names(info):
                            continue  # another process rotated the file while this one waited for the lock
                        self._top_up(fd, info)
                        if retired >= 0:
                            self._retire(retired)
                            retired = -1
                        if record is None:
                            return None
                        prev, ends_a_line = self._last_hash(fd, info, continues)
                        line = record[:-1] + b', "prev": "' + prev.encode("ascii") + b'"}'
                        before = info.st_size
                        # + 2: the newline, and one before the line if the file does not end one.
                        if before and before + len(line) + 2 > self.max_bytes and self._rotate(fd):
                            # Kept open (and locked) until the new file has made its reserve.
                            continues, retired, fd = prev, fd, -1
                            continue
                        # An unterminated line is there already: keep it apart from ours (which names it).
                        data = line + b"\n" if ends_a_line else b"\n" + line + b"\n"
                        self._write(fd, before, data)
                        self._head = ((info.st_dev, info.st_ino, before + len(data)), _sha256(line))
                        return prev
                    finally:
                        if fd >= 0:
                            os.close(fd)
                raise OSError(
                    errno.EAGAIN,
                    f"the audit log {self.path} was replaced {_REOPEN_LIMIT} times while a line waited to be "
                    "written: something other than ipybox is renaming it",
                )
            finally:
                if retired >= 0:
                    os.close(retired)

    def _names(self, info: os.stat_result) -> bool:
        """Whether the log's path still names the file of `info` (a rotation renames it away)."""
        try:
            here = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return (here.st_dev, here.st_ino) == (info.st_dev, info.st_ino)

    def _last_hash(self, fd: int, info: os.stat_result, continues: str | None) -> tuple[str, bool]:
        """The `prev` of a line appended to the file of `fd` (locked), and whether the file ends a line.

        An empty file continues `continues` if given (the file this process just rotated away), else the
        newest rotated file, else starts the chain (`GENESIS`)."""
        if info.st_size == 0:
            return (continues if continues is not None else self._rotated_head()), True
        if self._head is not None and self._head[0] == (info.st_dev, info.st_ino, info.st_size):
            return self._head[1], True  # nobody appended since this object did: its line is the last
        line, terminated = _last_line(fd, info.st_size)
        return _sha256(line), terminated

    def _rotated_head(self) -> str:
        """The hash of the last line of the newest rotated file that has one; `GENESIS` if none does."""
        for _, path in reversed(self._rotated()):
            fd = self._open(os.O_RDONLY, path)
            try:
                size = os.fstat(fd).st_size
                if size:
                    return _sha256(_last_line(fd, size)[0])
            finally:
                os.close(fd)
        return GENESIS

    def _rotate(self, fd: int) -> bool:
        """Rename the log (locked as `fd`) to `<name>.<n>`, `n` one more than the highest there; whether it
        was. Not while the filesystem is (nearly) full (the new file would have no reserve: the lines go on
        into this one's), nor when the rename fails (logged once: a decision is not refused for it)."""
        try:
            stats = os.fstatvfs(fd)
            if stats.f_bavail * stats.f_frsize < _ROTATE_MIN_FREE:
                logger.debug("the audit log %s is not rotated while the disk is nearly full", self.path)
                return False
        except OSError:
            pass  # nothing says the disk is full: rotate
        rotated = self._rotated()
        number = rotated[-1][0] + 1 if rotated else 1
        try:
            for attempt in range(_REOPEN_LIMIT):
                target = self.path.with_name(f"{self.path.name}.{number + attempt}")
                try:
                    _rename_noreplace(self.path, target)
                except FileExistsError:  # made since the listing, by something other than ipybox
                    continue
                self._no_rotation = None
                return True
            raise OSError(errno.EEXIST, f"{_REOPEN_LIMIT} names after {self.path.name}.{number} are taken")
        except OSError as e:
            if self._no_rotation != e.errno:
                self._no_rotation = e.errno
                logger.error(
                    "could not rotate the audit log %s (%s): it grows past %d bytes",
                    self.path,
                    e,
                    self.max_bytes,
                )
            return False

    def _retire(self, fd: int) -> None:
        """Give back the reserve past the end of a file rotated away (truncating to its own size frees the
        blocks past its end), and close it, which releases its lock."""
        try:
            os.ftruncate(fd, os.fstat(fd).st_size)
        except OSError as e:  # only space stays taken
            logger.debug("could not free the reserve of the rotated audit log: %s", e)
        finally:
            os.close(fd)

    def _write(self, fd: int, before: int, data: bytes) -> None:
        """Write `data` (whole lines) to the end of the locked log of size `before`, whole or not at all."""
        try:
            written = os.write(fd, data)
        except OSError as e:  # nothing was stored: a write that stores some reports a count
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                logger.error("the audit log %s is full: a decision was refused", self.path)
            raise OSError(e.errno, f"the audit log {self.path} could not be written ({e.strerror})") from None
        if written != len(data):
            self._take_back(fd, before, written)
            logger.error("the audit log %s is full: a decision was refused", self.path)
            raise OSError(
                errno.ENOSPC,
                f"the audit log {self.path} could not be written: {written} of {len(data)} bytes "
                "fit (is the disk full, or the file size limit reached?)",
            )

    def _rotated(self) -> list[tuple[int, Path]]:
        """The rotated files (`<name>.<n>`) and their numbers, oldest (lowest) first."""
        try:
            names = os.listdir(self.path.parent)
        except FileNotFoundError:
            return []
        found = [(int(m[1]), name) for name in names if (m := self._rotated_pattern.fullmatch(name))]
        return [(number, self.path.with_name(name)) for number, name in sorted(found)]

    def files(self) -> list[Path]:
        """The log's files, oldest first: the rotated ones (`<name>.1`, `<name>.2`, ...), then the current
        one if it exists. A rotation may rename the current file a moment later: `iter_entries()` without
        arguments reads a consistent set."""
        files = [path for _, path in self._rotated()]
        if os.path.lexists(self.path):
            files.append(self.path)
        return files

    def _snapshot(self) -> tuple[list[Path], tuple[int, int] | None]:
        """The rotated files and the current one (open read-only, and its size) as of one moment.

        Taken under a shared `flock` of the current file, which every append and rotation holds exclusively:
        its first `size` bytes hold no half-written line, and no rotation falls between opening it and
        listing the rotated files (it would be missed, or read twice). The caller closes the descriptor.

        Raises:
            OSError: A file is a symlink or not a regular file, or can't be read.
        """
        for _ in range(_REOPEN_LIMIT):
            try:
                fd = self._open(os.O_RDONLY)
            except FileNotFoundError:  # none yet, or a rotation is between the rename and the next line
                rotated = self._rotated()
                if not os.path.lexists(self.path):
                    return [path for _, path in rotated], None
                continue
            try:
                self._lock(fd, shared=True)
                info = os.fstat(fd)
                if self._names(info):
                    rotated = self._rotated()
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    return [path for _, path in rotated], (fd, info.st_size)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # rotated away while this waited for the lock
        raise OSError(errno.EAGAIN, f"the audit log {self.path} kept being replaced while it was read")

    def _each_file(
        self, rotated: list[Path], current: tuple[int, int] | None
    ) -> Iterator[tuple[Path, Iterator[bytes]]]:
        """Each file and its lines (see `_lines_forward`), oldest first; the current file (`current`, from
        `_snapshot`, which the caller closes) up to its size then."""
        for path in rotated:
            fd = self._open(os.O_RDONLY, path)
            try:
                yield path, _lines_forward(fd, None)
            finally:
                os.close(fd)
        if current is not None:
            yield self.path, _lines_forward(*current)

    def iter_entries(self, files: Iterable[str | os.PathLike[str]] | None = None) -> Iterator[AuditEntry]:
        """Every entry of the log, oldest first, across its files, read a line at a time (memory: one
        buffer and the longest line, whatever the size of the log). Damaged lines are skipped, and counted
        at WARNING per file.

        Args:
            files: The files to read, in this order, each to its end (`files()` gives them); `None`: the
                rotated files and the current one as of the call (see `_snapshot`), the current up to its
                size then (lines appended meanwhile are left to the next reader).

        Raises:
            OSError: A file is a symlink or not a regular file, or can't be read (nothing is raised for a
                log that does not exist with `files=None`: it has no entries).
        """
        if files is None:
            rotated, current = self._snapshot()
        else:
            rotated, current = [Path(file) for file in files], None
        try:
            for path, lines in self._each_file(rotated, current):
                damaged = 0
                for line in lines:
                    if not line:
                        continue
                    try:
                        entry = AuditEntry.from_json(line.decode("utf-8"))
                    except ValueError:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
                        damaged += 1
                        continue
                    yield entry
                if damaged:
                    logger.warning("the audit log %s has %d damaged line(s), skipped", path, damaged)
        finally:
            if current is not None:
                os.close(current[0])

    def verify(self) -> ChainReport:
        """Check the hash chain across every file of the log (see `verify_chain`)."""
        rotated, current = self._snapshot()
        try:
            files = [*rotated, *([self.path] if current is not None else [])]
            if not files:
                raise FileNotFoundError(errno.ENOENT, f"there is no audit log at {self.path}", str(self.path))
            return self._verify(files, self._each_file(rotated, current))
        finally:
            if current is not None:
                os.close(current[0])

    @staticmethod
    def _verify(files: list[Path], reader: Iterator[tuple[Path, Iterator[bytes]]]) -> ChainReport:
        names = [str(file) for file in files]
        records = unchained = 0
        chained = False  # a chained record was seen: from then on every line must be one
        last: str | None = None  # the hash of the line before, across files (None: no line yet)
        last_file: Path | None = None  # the file that line is in
        loads, sha256 = json.loads, hashlib.sha256  # looked up once: this loop is the cost of a verify
        for index, (path, lines) in enumerate(reader):
            for number, line in enumerate(lines, start=1):
                try:
                    # Decoded here: `loads` would take bytes in UTF-16 or 32 too.
                    data = loads(line.decode("utf-8")) if line else None
                except ValueError:  # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
                    data = _NOT_JSON
                prev = data.get("prev") if isinstance(data, dict) else None
                if not chained and index == 0 and not isinstance(prev, str):
                    unchained += 1  # written before the chain: nothing to check (the next line names it)
                else:
                    reason = _link_problem(line, data, prev, last, path, number, last_file)
                    if reason is not None:
                        return ChainReport(
                            False, records, names, BrokenLink(str(path), number, reason), unchained
                        )
                    chained = True
                    records += 1
                last, last_file = sha256(line).hexdigest(), path
        return ChainReport(True, records, names, None, unchained, last)

    def _top_up(self, fd: int, info: os.stat_result) -> None:
        """Keep `RESERVE_BYTES` allocated past the end of the log; say so when the disk is full."""
        try:
            _preallocate(fd, info.st_size, RESERVE_BYTES)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                if self._no_reserve != e.errno:
                    self._no_reserve = e.errno
                    logger.warning(
                        "the audit log %s has no reserve for a full disk (%s): with the disk full, decisions "
                        "will be refused",
                        self.path,
                        e.strerror,
                    )
            elif not self._disk_full:
                self._disk_full = True
                left = max(0, info.st_blocks * 512 - info.st_size)  # allocated past the end
                logger.error(
                    "THE DISK IS FULL: the audit log %s is writing into its reserve (about %d KiB left); once "
                    "that is used up, every tool call will be refused. Free space on the disk (a kernel may "
                    "be filling the workspace)",
                    self.path,
                    left // 1024,
                )
            return
        self._no_reserve = None
        if self._disk_full:
            self._disk_full = False
            logger.warning("the disk has space again: the audit log %s has its reserve back", self.path)

    def _lock(self, fd: int, *, shared: bool = False) -> None:
        """Take the log's `flock` (exclusive to append, shared to read a consistent snapshot), waiting a
        bounded time for another process's append."""
        deadline = time.monotonic() + _FLOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OSError(
                        errno.EWOULDBLOCK,
                        f"the audit log {self.path} has been locked by another process for "
                        f"{_FLOCK_WAIT_S:.0f} s: not {'reading' if shared else 'writing to'} it",
                    ) from None
                time.sleep(0.001)

    def _take_back(self, fd: int, before: int, written: int) -> None:
        """Cut the log back to `before` bytes after a write that stored `written` bytes of a line, when
        nothing but those bytes came after (a writer that takes no lock may have appended meanwhile: its
        line is not cut, and the next append starts a line of its own after the damaged one)."""
        try:
            if os.fstat(fd).st_size == before + written:
                os.ftruncate(fd, before)
        except OSError as e:  # shrinking needs no space; if it fails all the same, the reader skips it
            logger.error("could not take a partial line back out of the audit log %s: %s", self.path, e)


def _lines_backwards(fd: int, end: int, block: int) -> Iterator[tuple[int, bytes, bool]]:
    """The lines of the file's first `end` bytes, last first: (offset of the line's start, the line
    without its newline, whether a newline ends it). The last is the text after the last newline (`b""`
    when the bytes end with one). Reads `block` bytes at a time; holds a block plus one line."""
    position = end
    carry = b""  # the end of a line whose start is before `position`
    carry_is_last = True  # `carry` is the text after the last newline: no newline ends it
    while position > 0:
        start = max(0, position - block)
        chunk = os.pread(fd, position - start, start)
        if len(chunk) != position - start:
            # Only the end of the log ever shrinks (an append taken back): it was the unfinished last line.
            if carry or not carry_is_last:
                raise OSError(errno.EIO, "the audit log was cut short while it was read")
            position = start + len(chunk)
            continue
        cut = chunk.rfind(b"\n")
        if cut < 0:
            carry = chunk + carry  # a line longer than a block
            position = start
            continue
        yield start + cut + 1, chunk[cut + 1 :] + carry, not carry_is_last
        carry_is_last = False
        while (previous := chunk.rfind(b"\n", 0, cut)) >= 0:
            yield start + previous + 1, chunk[previous + 1 : cut], True
            cut = previous
        carry = chunk[:cut]
        position = start
    if carry or carry_is_last:
        yield 0, carry, not carry_is_last


def _last_line(fd: int, size: int) -> tuple[bytes, bool]:
    """The last line of the file's first `size` bytes (more than 0), without its newline, and whether a
    newline ends it: the text after the last newline if there is any, else the line before."""
    lines = _lines_backwards(fd, size, _TAIL_BLOCK)
    _, after, _ = next(lines)
    if after:
        return after, False
    for _, line, _ in lines:
        return line, True
    return b"", True  # the file is one empty line, which `_lines_backwards` does not give


def _lines_forward(fd: int, limit: int | None) -> Iterator[bytes]:
    """The lines of the file from its start (without their newlines; the last may have none), up to
    `limit` bytes (`None`: to its end). Holds a read buffer and one line."""
    with open(fd, "rb", buffering=_READ_BUFFER, closefd=False) as file:
        remaining = limit
        for line in file:
            if remaining is not None:
                if remaining <= 0:
                    return
                if len(line) > remaining:
                    line = line[:remaining]  # appended after the snapshot: not this reader's
                remaining -= len(line)
            yield line[:-1] if line.endswith(b"\n") else line


_NOT_JSON: Final = object()
_ENTRY_KEYS: Final = frozenset(field.name for field in fields(AuditEntry))
_REQUIRED_KEYS: Final = _ENTRY_KEYS - {"reason", *_OPTIONAL_KEYS}


def _link_problem(
    line: bytes, data: Any, prev: Any, last: str | None, path: Path, number: int, last_file: Path | None
) -> str | None:
    """What is wrong with a line that must be a chained record (`data`: its JSON, or `_NOT_JSON`; `last`:
    the hash of the line before it, in `last_file`, `None` if it is the first); `None` if nothing."""
    if not line:
        return "line is empty"
    if data is _NOT_JSON:
        return "line is not valid JSON"
    if not isinstance(data, dict):
        return "line is not a JSON object"
    if not isinstance(prev, str):
        return "line has no prev (only lines at the start of the oldest file, older than the chain, may lack one)"
    # The keys `AuditEntry.from_json` takes, compared as sets: making the entry took a third of a line's time.
    if not _REQUIRED_KEYS <= data.keys() <= _ENTRY_KEYS:
        missing, unknown = sorted(_REQUIRED_KEYS - data.keys()), sorted(data.keys() - _ENTRY_KEYS)
        what = [
            f"{label} {', '.join(keys)}" for label, keys in (("no", missing), ("unknown", unknown)) if keys
        ]
        return f"line is not an audit record ({'; '.join(what)})"
    if prev == (GENESIS if last is None else last):
        return None
    if last is None or last_file is None:
        return (
            f"the first record of {path.name} does not start the chain (its prev is not the genesis value: are "
            "older files missing?)"
        )
    if number == 1:
        return f"the first record of {path.name} does not continue {last_file.name}"
    return f"prev does not match the hash of line {number - 1}"


def verify_chain(path: str | os.PathLike[str]) -> ChainReport:
    """Check the hash chain of the audit log at `path`: its rotated files oldest first, then the current
    one (as of one moment, see the module docstring).

    Every line must be a record whose `prev` is the hash of the line before it (across files: a file's
    first record names the last line of the file before; the log's first, `GENESIS`), except lines without
    `prev` at the start of the oldest file, written before ipybox chained the log (counted as
    `unchained`). Reports the first line that breaks the chain; an empty line, a line that is not JSON or
    not an audit record (damaged), and a chained record's line edited (the next line's `prev` no longer
    matches) each break it, and so do a line deleted or inserted, and a missing rotated file.

    Streams a line at a time: memory is a read buffer and the longest line. Measured on 100,000 records
    of 320 bytes (31 MiB, one file): 0.6 s, peaking at 263 KiB (tracemalloc); most of it parsing each
    line's JSON (`iter_entries()`, which also makes an `AuditEntry` of each, takes 0.9 s).

    Raises:
        FileNotFoundError: No file of the log exists.
        OSError: A file is a symlink or not a regular file, or can't be read.
    """
    return AuditLog(path).verify()


class _Redactor:
    """Replaces secrets in argument values: values under secret-looking keys, and known secret strings."""

    def __init__(self, secrets: Iterable[str]) -> None:
        kept = sorted({s for s in secrets if len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True)
        self._given = kept
        # A lookahead finds the longest secret starting at every position, overlapping ones included:
        # replacing only non-overlapping matches would leave the tail of a secret that overlaps another.
        self._secrets = re.compile("(?=(" + "|".join(map(re.escape, kept)) + "))") if kept else None

    def more(self, secrets: Iterable[str]) -> _Redactor:
        """A redactor of these secrets and `secrets`."""
        return _Redactor([*self._given, *secrets])

    def text(self, text: str) -> str:
        if self._secrets is None:
            return text
        spans: list[list[int]] = []
        for match in self._secrets.finditer(text):
            start, end = match.span(1)
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], end)
            else:
                spans.append([start, end])
        if not spans:
            return text
        parts, position = [], 0
        for start, end in spans:
            parts += [text[position:start], REDACTED]
            position = end
        parts.append(text[position:])
        return "".join(parts)

    def mapping(self, mapping: Mapping[Any, Any]) -> dict[str, Any]:
        return {
            self.text(str(key)): REDACTED if _SECRET_KEY.search(str(key)) else self.value(value)
            for key, value in mapping.items()
        }

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int | float):
            # A numeric secret (a PIN) passed as a number.
            return REDACTED if self.text(str(value)) != str(value) else value
        if isinstance(value, Mapping):
            return self.mapping(value)
        if isinstance(value, list | tuple):
            return [self.value(item) for item in value]
        # Not JSON: record its text, which may contain secrets too.
        return self.text(str(value))
