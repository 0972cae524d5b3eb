"""`ipybox audit verify DIR [--json]`: whether a workspace's audit log is intact (its hash chain, across its
rotated files; see `ipybox.rules.audit`).

The log is where the supervisor and `ipybox mcp` write it: `audit.jsonl` in the workspace's state directory
(`[workspace] state_dir` of its `ipybox.toml`, `.ipybox` by default or when the file can't be read). It is
read as it is at one moment, so it can be verified while the workspace runs.

Output, one line: `ipybox: the audit log PATH is intact: N records in K files` (and how many lines before
them were written before ipybox chained the log, which nothing vouches for), or `ipybox: the audit log PATH
is broken at FILE:LINE: REASON`. With `--json`, one JSON object instead: `log`, `ok`, `records`,
`unchained`, `files`, `head` (the hash the next record will name: kept elsewhere, it shows later that no
record was cut off the end), `broken` (`file`, `line`, `reason`, or `null`); or `log`, `ok` (false) and
`error` when the log can't be read.

Exit status: `EXIT_INTACT` (0), `EXIT_BROKEN` (1), `EXIT_UNREADABLE` (2): the log does not exist, or
can't be read (a symlink, not a regular file, no permission). Not `EXIT_ERROR` (1 in the rest of the
command line), which would mix up "the log was tampered with" and "the log could not be checked" for a
script that checks the status.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from ipybox.display_text import printable
from ipybox.rules.audit import ChainReport, verify_chain
from ipybox.running.state import StatePaths

EXIT_INTACT: Final = 0
EXIT_BROKEN: Final = 1
EXIT_UNREADABLE: Final = 2


def verify(workspace: Path, *, as_json: bool) -> int:
    """Verify the audit log of `workspace` and print the result (see the module docstring): on standard
    output, except that a log that can't be read is said on standard error without `as_json`.

    Args:
        workspace: The workspace directory (its `ipybox.toml` names the state directory).
        as_json: Print one JSON object instead of a line for humans.

    Returns:
        `EXIT_INTACT`, `EXIT_BROKEN` or `EXIT_UNREADABLE`.
    """
    log = StatePaths.of(workspace).audit
    try:
        report = verify_chain(log)
    except OSError as e:
        if as_json:
            print(json.dumps({"log": str(log), "ok": False, "error": _error_text(e, log)}))
        else:
            print(f"ipybox: {printable(_error_text(e, log))}", file=sys.stderr)
        return EXIT_UNREADABLE
    print(json.dumps(_report_json(log, report)) if as_json else _report_line(log, report))
    return EXIT_INTACT if report.ok else EXIT_BROKEN


def _error_text(error: OSError, log: Path) -> str:
    if isinstance(error, FileNotFoundError) and error.filename == str(log):
        return f"there is no audit log at {log} (no tool call has been decided in this workspace yet?)"
    if error.filename is None:  # ipybox.rules.audit's own errors, which name the file
        return f"could not verify the audit log: {error.strerror or error}"
    return f"could not verify the audit log {log}: {error.filename}: {error.strerror or error}"


def _report_line(log: Path, report: ChainReport) -> str:
    if report.broken is not None:
        broken = report.broken
        return printable(
            f"ipybox: the audit log {log} is broken at {broken.file}:{broken.line}: {broken.reason}"
        )
    counts = f"{_count(report.records, 'record')} in {_count(len(report.files), 'file')}"
    line = f"ipybox: the audit log {log} is intact: {counts}"
    if report.unchained:
        line += f" (after {_count(report.unchained, 'older line')} written before the chain, not verifiable)"
    return printable(line)


def _report_json(log: Path, report: ChainReport) -> dict[str, Any]:
    broken = report.broken
    return {
        "log": str(log),
        "ok": report.ok,
        "records": report.records,
        "unchained": report.unchained,
        "files": report.files,
        "head": report.head,
        "broken": None
        if broken is None
        else {"file": broken.file, "line": broken.line, "reason": broken.reason},
    }


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"
