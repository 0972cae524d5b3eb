"""An append-only JSONL record of approval decisions, with secrets redacted.

Each decision is one JSON object on one line:

```json
{"time": "2025-06-01T12:00:00.000000Z", "server": "filesystem", "tool": "write_file",
 "args": {"path": "out/a.md", "token": "[redacted]"}, "decision": "allow", "rule_id": "writes-to-out",
 "decided_by": "rule", "reason": "rule 'writes-to-out' applies"}
```
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import threading
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

# One lock for every log in the process: a line is written by a single write(2) on an O_APPEND
# descriptor, which the kernel does not interleave, but a short write is completed by a second call,
# and those must not interleave with another thread's line.
_WRITE_LOCK: Final = threading.Lock()


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
        """Parse one line written by `to_json`."""
        return cls(**json.loads(line))


class AuditLog:
    """Appends one `AuditEntry` per decision to a JSONL file.

    The file and its missing parent directories are created on the first append, the file with mode
    0600 (an existing file is narrowed to 0600). It is never opened through a symlink, and only written
    if it is a regular file of ours with one link (a kernel may have planted a link where it goes). Each
    append opens the file in append mode and writes the whole line with one `write` call, so lines from
    concurrent tasks, threads and processes never interleave, and a line reaches the OS before `record`
    returns. It is a short blocking call, fine on the event loop.

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
            OSError: The line could not be written; the caller should not run the call.
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
        """All entries in the log, oldest first (none if the file does not exist).

        Raises:
            OSError: The file is a symlink or not a regular file.
        """
        try:
            fd = self._open(os.O_RDONLY)
        except FileNotFoundError:
            return []
        with os.fdopen(fd, encoding="utf-8") as file:
            text = file.read()
        return [AuditEntry.from_json(line) for line in text.split("\n") if line]

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
            if flags & os.O_WRONLY and (info.st_nlink != 1 or info.st_uid != os.geteuid()):
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
            fd = self._open(os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                if not self._prepared:
                    if os.fstat(fd).st_mode & 0o077:
                        os.fchmod(fd, 0o600)
                    self._prepared = True
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)


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
