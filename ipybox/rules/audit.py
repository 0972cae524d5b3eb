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

Reading skips a damaged line instead of failing: `AuditLog.load()` returns the entries and the numbers of
the lines it could not read; `read()` logs those at WARNING.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from ipybox.rules.calls import ToolCall, Verdict

DecidedBy = Literal["rule", "default", "application", "timeout"]
"""Who made the final decision: a rule, the policy's default, the application answering an `ask`, or the
`ask` timing out (which denies)."""

REDACTED: Final = "[redacted]"

_SECRET_KEY: Final = re.compile(
    r"token|password|passwd|secret|api[_-]?key|authorization|credential|private[_-]?key", re.IGNORECASE
)
# Shorter strings would redact ordinary words and numbers all over the log.
_MIN_SECRET_LENGTH: Final = 4

logger = logging.getLogger(__name__)

# One lock for every log in the process (threads, and tasks through `asyncio.to_thread`); `flock` on the
# file is the lock between processes.
_WRITE_LOCK: Final = threading.Lock()
# How long an append waits for another process's: one append takes microseconds, so a lock held this long
# is held by something that is not appending (it fails the call rather than hang it).
_FLOCK_WAIT_S: Final = 10.0


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
        decided_by: `rule`, `default`, `application` or `timeout`.
        reason: A short explanation for humans.
    """

    time: str
    server: str
    tool: str
    args: dict[str, Any]
    decision: Literal["allow", "deny"]
    rule_id: str | None
    decided_by: DecidedBy
    reason: str | None = None

    def to_json(self) -> str:
        """The entry as one line of JSON (without the newline)."""
        # ASCII only: JSON escapes every line break then, including U+2028 that some readers split on.
        return json.dumps(asdict(self), ensure_ascii=True, separators=(", ", ": "))

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

    def record(
        self,
        call: ToolCall,
        verdict: Verdict,
        *,
        answer: Literal["allow", "deny"] | None = None,
        timed_out: bool = False,
        reason: str | None = None,
    ) -> AuditEntry:
        """Append the final decision on `call`.

        Args:
            call: The tool call.
            verdict: The policy's verdict on it.
            answer: For an `ask` verdict, the application's answer.
            timed_out: For an `ask` verdict, `True` if the application did not answer in time (the call
                is then recorded as denied).
            reason: Overrides the recorded reason (by default the verdict's, with the answer appended).

        Returns:
            The entry as written.

        Raises:
            ValueError: An `ask` verdict without exactly one of `answer` and `timed_out`, or another
                verdict with either.
            OSError: The line could not be written (nothing of it is left in the log); the caller should
                not run the call.
        """
        decision: Literal["allow", "deny"]
        decided_by: DecidedBy
        if verdict.decision == "ask":
            if (answer is None) == (not timed_out):
                raise ValueError("an `ask` verdict is recorded with either an `answer` or `timed_out=True`")
            if answer is not None:
                decision, decided_by = answer, "application"
                default_reason = f"{verdict.reason}; the application answered {answer}"
            else:
                decision, decided_by = "deny", "timeout"
                default_reason = f"{verdict.reason}; no answer in time"
        else:
            if answer is not None or timed_out:
                raise ValueError("`answer` and `timed_out` are only for `ask` verdicts")
            decision = verdict.decision
            decided_by = "rule" if verdict.rule_id is not None else "default"
            default_reason = verdict.reason
        redact = self._redactor
        entry = AuditEntry(
            time=datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            server=call.server,
            tool=call.tool,
            args=redact.mapping(call.args),
            decision=decision,
            rule_id=verdict.rule_id,
            decided_by=decided_by,
            reason=redact.text(reason if reason is not None else default_reason),
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
                before = os.fstat(fd).st_size
                if before and os.pread(fd, 1, before - 1) != b"\n":
                    line = b"\n" + line  # an unterminated line is there already: keep it apart from ours
                try:
                    written = os.write(fd, line)
                except OSError as e:  # nothing was stored: a write that stores some reports a count
                    raise OSError(
                        e.errno, f"the audit log {self.path} could not be written ({e.strerror})"
                    ) from None
                if written != len(line):
                    self._take_back(fd, before, written)
                    raise OSError(
                        errno.ENOSPC,
                        f"the audit log {self.path} could not be written: {written} of {len(line)} bytes "
                        "fit (is the disk full, or the file size limit reached?)",
                    )
            finally:
                os.close(fd)

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
