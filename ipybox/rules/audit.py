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
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import fnmatch
import functools
import json
import logging
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
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


_OPTIONAL_KEYS: Final = ("scope", "by")


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
        scope: For an answered `ask`: `once`, `session` or `always` (`None` otherwise, and in lines
            written before ipybox recorded it).
        by: For an answered `ask`: who answered (`console (root)`, `terminal (alice on /dev/pts/3)`).
    """

    time: str
    server: str
    tool: str
    args: dict[str, Any]
    decision: Literal["allow", "deny"]
    rule_id: str | None
    decided_by: DecidedBy
    reason: str | None = None
    scope: Scope | None = None
    by: str | None = None

    def to_json(self) -> str:
        """The entry as one line of JSON (without the newline)."""
        # ASCII only: JSON escapes every line break then, including U+2028 that some readers split on.
        data = asdict(self)
        for key in _OPTIONAL_KEYS:  # only for answered asks: other lines keep the keys they always had
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


class AuditLog:
    """Appends one `AuditEntry` per decision to a JSONL file.

    The file and its missing parent directories are created on the first append, the file with mode
    0600 (an existing file is narrowed to 0600). It is never opened through a symlink, and only written
    if it is a regular file of ours with one link (a kernel may have planted a link where it goes). Each
    append opens the file in append mode and writes the whole line with one `write` call, so lines from
    concurrent tasks, threads and processes never interleave, and a line reaches the OS before `record`
    returns; a line that does not fit (disk full) is taken back whole (see the module docstring). It is a
    short blocking call, fine on the event loop.

    Args:
        path: The log file.
        secrets: Strings to redact wherever they occur in recorded values, e.g. the resolved values of
            `${VAR}` references in the workspace config. Strings shorter than 4 characters are ignored.
    """

    def __init__(self, path: str | os.PathLike[str], secrets: Iterable[str] = ()) -> None:
        self.path = Path(path)
        self._redactor = _Redactor(secrets)
        self._prepared = False
        self._disk_full = False
        self._no_reserve: int | None = None  # the errno the reserve could not be made with, logged once

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
    ) -> AuditEntry:
        """Append the final decision on `call`.

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

        Returns:
            The entry as written.

        Raises:
            ValueError: An `ask` verdict without exactly one of `answer` and `timed_out`, or another
                verdict with either.
            OSError: The line could not be written (nothing of it is left in the log); the caller should
                not run the call.
        """
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
        entry = AuditEntry(
            time=datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            server=call.server,
            tool=call.tool,
            args=redact.mapping(call.args),
            decision=decision,
            rule_id=verdict.rule_id,
            decided_by=final,
            reason=redact.text(reason if reason is not None else default_reason),
            scope=scope,
            by=by,
        )
        self._append((entry.to_json() + "\n").encode("utf-8"))
        return entry

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

    def _open(self, flags: int) -> int:
        """Open the log without following a symlink (a kernel may have planted one where the log goes) or
        blocking on a FIFO; a log written to must be a regular file of ours with one link."""
        try:
            fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO) and not self.path.is_dir():
                kind = "a symlink" if self.path.is_symlink() else "not a regular file"
                raise OSError(
                    e.errno, f"the audit log {self.path} is {kind}: not writing through it"
                ) from None
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(errno.EINVAL, f"the audit log {self.path} is not a regular file")
            if flags & (os.O_WRONLY | os.O_RDWR) and (info.st_nlink != 1 or info.st_uid != os.geteuid()):
                raise OSError(
                    errno.EPERM,
                    f"the audit log {self.path} is hard-linked or owned by another user: not writing to it",
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
            self._append(b"")
        except OSError as e:
            logger.error("could not prepare the audit log %s: %s", self.path, e)

    def _append(self, line: bytes) -> None:
        with _WRITE_LOCK:
            if not self._prepared:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Read-write: the last byte is read (`pread`) to see whether the log ends a line.
            fd = self._open(os.O_RDWR | os.O_APPEND | os.O_CREAT)
            try:
                if not self._prepared:
                    if os.fstat(fd).st_mode & 0o077:
                        os.fchmod(fd, 0o600)
                    self._prepared = True
                self._lock(fd)  # released by the close below
                info = os.fstat(fd)
                before = info.st_size
                self._top_up(fd, info)
                if not line:
                    return
                if before and os.pread(fd, 1, before - 1) != b"\n":
                    line = b"\n" + line  # an unterminated line is there already: keep it apart from ours
                try:
                    written = os.write(fd, line)
                except OSError as e:  # nothing was stored: a write that stores some reports a count
                    if e.errno in (errno.ENOSPC, errno.EDQUOT):
                        logger.error("the audit log %s is full: a decision was refused", self.path)
                    raise OSError(
                        e.errno, f"the audit log {self.path} could not be written ({e.strerror})"
                    ) from None
                if written != len(line):
                    self._take_back(fd, before, written)
                    logger.error("the audit log %s is full: a decision was refused", self.path)
                    raise OSError(
                        errno.ENOSPC,
                        f"the audit log {self.path} could not be written: {written} of {len(line)} bytes "
                        "fit (is the disk full, or the file size limit reached?)",
                    )
            finally:
                os.close(fd)

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

    def _lock(self, fd: int) -> None:
        """Take the log's `flock`, waiting a bounded time for another process's append."""
        deadline = time.monotonic() + _FLOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OSError(
                        errno.EWOULDBLOCK,
                        f"the audit log {self.path} has been locked by another process for "
                        f"{_FLOCK_WAIT_S:.0f} s: not writing to it",
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


class _Redactor:
    """Replaces secrets in argument values: values under secret-looking keys, and known secret strings."""

    def __init__(self, secrets: Iterable[str]) -> None:
        kept = sorted({s for s in secrets if len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True)
        # A lookahead finds the longest secret starting at every position, overlapping ones included:
        # replacing only non-overlapping matches would leave the tail of a secret that overlaps another.
        self._secrets = re.compile("(?=(" + "|".join(map(re.escape, kept)) + "))") if kept else None

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
