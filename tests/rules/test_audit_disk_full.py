"""The audit log when the disk is full: a line is appended whole or not at all, and a damaged line (left by
a crash, or by an older ipybox) is skipped and reported instead of making the whole log unreadable.

A full disk is made for real: a 64 KiB tmpfs mounted in a private mount namespace (`unshare`, root only),
and, for any user, the file size limit (`RLIMIT_FSIZE`) of a child process, where a write past the limit
stores what fits and reports a short count, and the next one fails with `EFBIG` (Python ignores the
`SIGXFSZ` that comes with it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ipybox.rules import AuditLog, ToolCall, Verdict

ALLOW = Verdict("allow", "read-only", "rule 'read-only' applies")
ROOT = Path(__file__).resolve().parents[2]

# Appends (in a child process) under a full disk or a file size limit and reports what happened as JSON.
APPEND_WHEN_FULL = """
import errno, json, os, resource, sys
from ipybox.rules import AuditLog, ToolCall, Verdict

how, path = sys.argv[1], sys.argv[2]
log = AuditLog(path)
allow = Verdict("allow", "read-only", "rule 'read-only' applies")
report = {}

def record(tool, size):
    try:
        log.record(ToolCall("fs", tool, {"v": "x" * size}), allow)
        return "written"
    except OSError as e:
        return f"{errno.errorcode.get(e.errno, e.errno)}: {e.strerror}"

report["first"] = record("first", 10)
before = os.path.getsize(path)
if how == "fsize":
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (before + 100, hard))
else:  # fill the file system up
    filler = os.open(os.path.join(os.path.dirname(path), "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(filler, b"\\0" * 4096):
            pass
    except OSError:
        pass
    os.close(filler)
report["refused"] = record("refused", 20_000)
report["size_before"], report["size_after"] = before, os.path.getsize(path)
if how == "fsize":
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
else:
    os.remove(os.path.join(os.path.dirname(path), "filler"))
report["after"] = record("after", 20_000)
with open(path, "rb") as f:
    report["lines"] = f.read().decode("utf-8", "replace").split("\\n")
print(json.dumps(report))
"""


def append_when_full(how: str, path: Path, wrap: list[str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [*(wrap or []), sys.executable, "-c", APPEND_WHEN_FULL, how, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def assert_taken_back_whole(report: dict[str, Any], expected_error: str) -> None:
    assert report["first"] == "written"
    assert report["refused"].startswith(expected_error) and "could not be written" in report["refused"]
    assert report["size_after"] == report["size_before"], "nothing of the refused line is left"
    assert report["after"] == "written"
    lines = report["lines"]
    assert lines[-1] == "", "the log ends a line"
    assert [json.loads(line)["tool"] for line in lines[:-1]] == ["first", "after"]


@pytest.mark.integration  # a child process
def test_a_line_past_the_file_size_limit_is_taken_back_whole(tmp_path: Path) -> None:
    report = append_when_full("fsize", tmp_path / "audit.jsonl")
    assert_taken_back_whole(report, "ENOSPC")  # a short write: 100 bytes of the line fit
    assert "100 of" in report["refused"]


@pytest.mark.integration  # a child process in a mount namespace of its own
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounting a small tmpfs takes root"
)
def test_a_full_disk_leaves_no_partial_line(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    # The mount lives only in the child's namespace: nothing to unmount, whatever happens to the test.
    mount = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
    script = f'mount -t tmpfs -o size=64k tmpfs "{disk}" && exec "$0" "$@"'
    report = append_when_full("disk", disk / "audit.jsonl", wrap=[*mount, script])
    assert_taken_back_whole(report, "ENOSPC")


# What the supervisor does with a full disk: its log was armed at start, then a kernel fills the disk, then
# another session's call is decided; then the disk is freed. Run in a child with its own small tmpfs.
DECIDE_WHEN_FULL = """
import asyncio, json, logging, os, sys
from ipybox.approval import Approved
from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall

disk = sys.argv[1]
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
rules = [{"id": "reads", "server": "fs", "tool": "read_*", "decision": "allow"}]
log = AuditLog(os.path.join(disk, ".ipybox", "audit.jsonl"))
log.arm_reserve()  # at the supervisor's start
approver = WorkspaceApprover(ApprovalPolicy.model_validate({"rules": rules}), log, lambda caller: None)
filler = os.open(os.path.join(disk, "workspace-file"), os.O_WRONLY | os.O_CREAT)
try:  # the kernel fills the disk
    while os.write(filler, b"x" * 65536):
        pass
except OSError as e:
    full = e.strerror
os.close(filler)
report = {"full": full, "decisions": []}
for i in range(100):
    outcome = asyncio.run(approver.decide(ToolCall("fs", "read_file", {"path": f"file-{i}"})))
    report["decisions"].append(outcome == Approved())
os.remove(os.path.join(disk, "workspace-file"))
report["after"] = asyncio.run(approver.decide(ToolCall("fs", "read_file", {"path": "after"}))) == Approved()
contents = log.load()
report["audited"] = [entry.args["path"] for entry in contents.entries]
report["damaged"] = contents.damaged_lines
print(json.dumps(report))
"""


@pytest.mark.integration  # a child process in a mount namespace of its own
@pytest.mark.root_only
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounting a small tmpfs takes root"
)
def test_with_the_disk_full_other_sessions_calls_are_decided_audited_and_run(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
    script = f'mount -t tmpfs -o size=4m tmpfs "{disk}" && exec "$0" "$@"'
    done = subprocess.run(
        [*mount, script, sys.executable, "-c", DECIDE_WHEN_FULL, str(disk)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])

    assert report["full"] == "No space left on device"
    assert report["decisions"] == [True] * 100, "the reserve took every line"
    assert report["after"]
    assert report["audited"] == [*(f"file-{i}" for i in range(100)), "after"] and report["damaged"] == []
    assert "ERROR THE DISK IS FULL: the audit log" in done.stderr, "said loudly, once"
    assert done.stderr.count("THE DISK IS FULL") == 1
    assert "WARNING the disk has space again" in done.stderr


# -- reading a damaged log


def write_damaged_log(path: Path) -> None:
    log = AuditLog(path)
    log.record(ToolCall("fs", "one"), ALLOW)
    with path.open("ab") as f:
        f.write(b'{"time": "2025-01-01T00:00:00.000000Z", "server": "fs", "to')  # cut short by a crash
    log.record(ToolCall("fs", "two"), ALLOW)
    with path.open("ab") as f:
        f.write(b'{"not": "an entry"}\n[1, 2]\n\xff\xfe not utf-8\n')
    log.record(ToolCall("fs", "three"), ALLOW)


def test_a_record_after_an_unterminated_line_starts_a_line_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_damaged_log(path)
    lines = path.read_bytes().split(b"\n")
    assert b'"to' in lines[1] and lines[1].endswith(b'"to'), "the cut line is kept apart"
    assert json.loads(lines[2])["tool"] == "two"


def test_damaged_lines_are_skipped_and_reported_by_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "audit.jsonl"
    write_damaged_log(path)
    contents = AuditLog(path).load()
    assert [entry.tool for entry in contents.entries] == ["one", "two", "three"]
    assert contents.damaged_lines == [2, 4, 5, 6]
    with caplog.at_level("WARNING", logger="ipybox.rules.audit"):
        assert [entry.tool for entry in AuditLog(path).read()] == ["one", "two", "three"]
    assert f"the audit log {path} has 4 damaged line(s), skipped: line 2, 4, 5, 6" in caplog.text


def test_a_glued_line_from_an_older_ipybox_is_one_damaged_line(tmp_path: Path) -> None:
    # What a partial line followed by the next record looked like before lines were written whole.
    path = tmp_path / "audit.jsonl"
    AuditLog(path).record(ToolCall("fs", "whole"), ALLOW)
    glued = AuditLog(tmp_path / "other.jsonl").record(ToolCall("fs", "glued"), ALLOW).to_json()
    with path.open("a") as f:
        f.write(glued[:40] + glued + "\n")
    AuditLog(path).record(ToolCall("fs", "next"), ALLOW)
    contents = AuditLog(path).load()
    assert [entry.tool for entry in contents.entries] == ["whole", "next"]
    assert contents.damaged_lines == [2]
