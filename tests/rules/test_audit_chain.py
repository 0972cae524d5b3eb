"""The audit log's hash chain: each line names the hash of the line before it, across rotated files, and
`verify_chain` finds the first line that does not link up. Pure: files in `tmp_path`, no processes (two
processes appending are two `AuditLog` objects on one path; a rotation under a waiting append, a thread).
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from ipybox.cli import audit as audit_cli
from ipybox.rules import AuditEntry, AuditLog, ToolCall, Verdict, audit
from ipybox.rules.audit import GENESIS, BrokenLink, code_hash, verify_chain

ALLOW = Verdict("allow", "read-only", "rule 'read-only' applies")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def raw_lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def record(log: AuditLog, count: int, start: int = 0) -> list[AuditEntry]:
    return [log.record(ToolCall("fs", f"t{n}", {"n": n}), ALLOW) for n in range(start, start + count)]


def rewrite(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def chained(count: int, prev: str = GENESIS, pad: str = "") -> tuple[list[bytes], str]:
    """`count` chained lines as `record` writes them, made directly (fast), and the hash of the last."""
    template = (
        '{"time": "2026-01-01T00:00:00.000000Z", "server": "fs", "tool": "read_file", "args": {"n": %d, '
        '"pad": "%s"}, "decision": "allow", "rule_id": "read-only", "decided_by": "rule", "reason": "rule '
        '\'read-only\' applies", "prev": "%s"}'
    )
    lines = []
    for n in range(count):
        line = (template % (n, pad, prev)).encode()
        lines.append(line)
        prev = sha256(line)
    return lines, prev


# --- the chain ---------------------------------------------------------------------------------------------


def test_each_record_names_the_hash_of_the_line_before_it(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    entries = record(log, 4)
    lines = raw_lines(log.path)
    assert [entry.prev for entry in entries] == [GENESIS, *(sha256(line) for line in lines[:-1])]
    assert [entry.to_json().encode() for entry in entries] == lines, "record returns the entry as written"
    assert all(list(json.loads(line))[-1] == "prev" for line in lines), "prev is the last key"
    report = verify_chain(log.path)
    assert (report.ok, report.records, report.unchained, report.broken) == (True, 4, 0, None)
    assert report.files == [str(log.path)] and report.head == sha256(lines[-1])


def test_editing_one_record_breaks_the_chain_at_the_next_line(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    record(log, 5)
    lines = raw_lines(log.path)
    lines[2] = lines[2].replace(b'"decision": "allow"', b'"decision": "deny"')
    rewrite(log.path, lines)
    report = verify_chain(log.path)
    assert not report.ok and report.records == 3
    assert report.broken == BrokenLink(str(log.path), 4, "prev does not match the hash of line 3")


def test_deleting_a_line_breaks_the_chain_where_it_was(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    record(log, 5)
    lines = raw_lines(log.path)
    rewrite(log.path, lines[:1] + lines[2:])
    assert verify_chain(log.path).broken == BrokenLink(
        str(log.path), 2, "prev does not match the hash of line 1"
    )


def test_deleting_the_first_line_shows_the_chain_no_longer_starts_there(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    record(log, 3)
    rewrite(log.path, raw_lines(log.path)[1:])
    broken = verify_chain(log.path).broken
    assert broken is not None and broken.line == 1
    assert broken.reason.startswith("the first record of audit.jsonl does not start the chain")


def test_editing_the_last_record_changes_the_head_that_was_noted(tmp_path: Path) -> None:
    # Nothing after the last line names it: only the head kept elsewhere shows it was changed.
    log = AuditLog(tmp_path / "audit.jsonl")
    record(log, 3)
    head = verify_chain(log.path).head
    lines = raw_lines(log.path)
    rewrite(log.path, [*lines[:-1], lines[-1].replace(b'"t2"', b'"t9"')])
    report = verify_chain(log.path)
    assert report.ok and report.head != head


def test_the_writer_names_the_line_it_wrote_even_if_it_was_edited_since(tmp_path: Path) -> None:
    # The object's own last line is not read again: an edit of it breaks the chain at the next record.
    log = AuditLog(tmp_path / "audit.jsonl")
    record(log, 2)
    lines = raw_lines(log.path)
    rewrite(log.path, [lines[0], lines[1].replace(b'"t1"', b'"t8"')])  # same size: the file looks unchanged
    record(log, 1, start=2)
    assert verify_chain(log.path).broken == BrokenLink(
        str(log.path), 3, "prev does not match the hash of line 2"
    )


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"time": "2026-01-01T00:00:01Z", "serv', "line is not valid JSON"),
        (b"\xff\xfe not UTF-8", "line is not valid JSON"),
        (b"", "line is empty"),
        (b"[1, 2]", "line is not a JSON object"),
        (b'{"time": "x"}', "line has no prev"),
        (
            b'{"time": "x", "prev": "%s"}',
            "line is not an audit record (no args, decided_by, decision, rule_id",
        ),
    ],
)
def test_a_damaged_line_breaks_the_chain_where_it_is(tmp_path: Path, line: bytes, reason: str) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    record(log, 2)
    with log.path.open("ab") as file:
        file.write(line.replace(b"%s", sha256(raw_lines(log.path)[-1]).encode()) + b"\n")
    record(log, 1, start=2)
    broken = verify_chain(log.path).broken
    assert broken is not None and (broken.line, broken.reason[: len(reason)]) == (3, reason)


def test_a_record_after_a_cut_line_names_that_line_and_the_cut_line_breaks_the_chain(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    record(log, 1)
    with log.path.open("ab") as file:
        file.write(b'{"time": "2026-01-01T00:00:01Z", "ser')  # a crash of a writer that took no lock
    [after] = record(AuditLog(log.path), 1, start=1)
    lines = raw_lines(log.path)
    assert len(lines) == 3 and after.prev == sha256(lines[1])
    assert verify_chain(log.path).broken == BrokenLink(str(log.path), 2, "line is not valid JSON")


def test_old_unchained_lines_at_the_start_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    old = [
        AuditEntry("2025-01-01T00:00:00.000000Z", "fs", f"old{n}", {}, "allow", None, "default")
        for n in range(3)
    ]
    rewrite(path, [entry.to_json().encode() for entry in old] + [b'{"cut short by an old cra'])
    path.chmod(0o600)
    first, _ = record(AuditLog(path), 2)
    assert first.prev == sha256(b'{"cut short by an old cra')
    report = verify_chain(path)
    assert (report.ok, report.records, report.unchained) == (True, 2, 4)


def test_an_unchained_line_after_the_chain_started_breaks_it(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    record(log, 2)
    old_style = AuditEntry("2025-01-01T00:00:00.000000Z", "fs", "t", {}, "allow", None, "default").to_json()
    with log.path.open("a") as file:
        file.write(old_style + "\n")
    broken = verify_chain(log.path).broken
    assert broken is not None and broken.line == 3 and broken.reason.startswith("line has no prev")


def test_verify_of_a_log_that_does_not_exist_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="there is no audit log"):
        verify_chain(tmp_path / "audit.jsonl")


def test_verify_refuses_a_symlinked_log(tmp_path: Path) -> None:
    record(AuditLog(tmp_path / "elsewhere.jsonl"), 1)
    (tmp_path / "audit.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(OSError, match="is a symlink"):
        verify_chain(tmp_path / "audit.jsonl")


def test_verify_of_100_000_records_streams_them(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    lines, head = chained(100_000)
    rewrite(path, lines)
    path.chmod(0o600)
    report = verify_chain(path)
    assert (report.ok, report.records, report.head) == (True, 100_000, head)
    [appended] = record(AuditLog(path), 1)
    assert appended.prev == head, "the lines made here are the ones record() writes"


def test_verify_memory_stays_within_a_buffer_and_a_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    lines, _ = chained(8_000, pad="z" * 1200)
    rewrite(path, lines)
    path.chmod(0o600)
    assert path.stat().st_size > 10_000_000
    tracemalloc.start()
    try:
        report = verify_chain(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.ok and report.records == 8_000
    assert peak < 1_000_000, f"verifying {path.stat().st_size} bytes peaked at {peak} bytes"


# --- code and quota ----------------------------------------------------------------------------------------


def test_code_and_quota_are_recorded_when_given_and_read_back(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", secrets=["hunter22"])
    digest = code_hash("print(read_file('a'))\n")
    with_both = log.record(ToolCall("fs", "t"), ALLOW, code=digest, quota="session 100/100 hunter22")
    without = log.record(ToolCall("fs", "t"), ALLOW)
    first, second = (json.loads(line) for line in raw_lines(log.path))
    assert (first["code"], first["quota"]) == (digest, "session 100/100 [redacted]")
    assert "code" not in second and "quota" not in second
    assert log.read() == [with_both, without] == list(log.iter_entries())
    assert (without.code, without.quota) == (None, None)


def test_code_must_be_a_hash_not_the_code_itself(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    with pytest.raises(ValueError, match="code: the hex SHA-256"):
        log.record(ToolCall("fs", "t"), ALLOW, code="print('secret')")
    assert not log.path.exists()


def test_a_line_from_before_the_chain_reads_with_the_new_fields_none() -> None:
    line = (
        '{"time": "2025-06-01T12:00:00.000000Z", "server": "fs", "tool": "t", "args": {}, "decision": "allow", '
        '"rule_id": null, "decided_by": "default", "reason": "r", "scope": "once", "by": "console (root)"}'
    )
    entry = AuditEntry.from_json(line)
    assert (entry.code, entry.quota, entry.prev, entry.by) == (None, None, None, "console (root)")
    assert entry.to_json() == line


# --- rotation ----------------------------------------------------------------------------------------------


def test_rotation_keeps_the_chain_across_files_and_keeps_old_files(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=1000)
    entries = record(log, 20)
    files = log.files()
    assert [f.name for f in files] == [*(f"audit.jsonl.{n}" for n in range(1, len(files))), "audit.jsonl"]
    assert len(files) >= 5 and all(f.stat().st_size <= 1000 for f in files)
    for older, newer in itertools.pairwise(files):
        assert json.loads(raw_lines(newer)[0])["prev"] == sha256(raw_lines(older)[-1])
    report = verify_chain(log.path)
    assert (report.ok, report.records, report.files) == (True, 20, [str(f) for f in files])
    assert list(log.iter_entries()) == entries
    assert log.read() == entries[-len(raw_lines(log.path)) :], "read() reads the current file"


def test_rotation_never_replaces_an_older_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    kept = {
        name: f"{name} was here\n".encode() for name in ("audit.jsonl.1", "audit.jsonl.5", "audit.jsonl.x")
    }
    for name, data in kept.items():
        (tmp_path / name).write_bytes(data)
    log = AuditLog(path, max_bytes=300)
    record(log, 3)
    assert [f.name for f in log.files()] == [
        "audit.jsonl.1",
        "audit.jsonl.5",
        "audit.jsonl.6",
        "audit.jsonl.7",
        "audit.jsonl",
    ]
    assert all((tmp_path / name).read_bytes() == data for name, data in kept.items())
    with pytest.raises(FileExistsError):
        audit._rename_noreplace(path, tmp_path / "audit.jsonl.1")


def test_deleting_a_rotated_file_breaks_the_chain_at_the_next_file(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=400)
    record(log, 6)
    assert len(log.files()) >= 4
    (tmp_path / "audit.jsonl.2").unlink()
    assert verify_chain(log.path).broken == BrokenLink(
        str(tmp_path / "audit.jsonl.3"),
        1,
        "the first record of audit.jsonl.3 does not continue audit.jsonl.1",
    )
    (tmp_path / "audit.jsonl.1").unlink()  # the oldest: the chain no longer starts at the genesis value
    broken = verify_chain(log.path).broken
    assert broken is not None and broken.file == str(tmp_path / "audit.jsonl.3")
    assert broken.reason.startswith("the first record of audit.jsonl.3 does not start the chain")


def test_two_logs_on_one_path_append_alternately_and_the_chain_holds(tmp_path: Path) -> None:
    # As the supervisor and `ipybox mcp` do: each finds the other's last line, and the other's rotations.
    path = tmp_path / "audit.jsonl"
    first, second = AuditLog(path, max_bytes=2000), AuditLog(path, max_bytes=2000)
    entries = [
        (first, second)[n % 3 == 0].record(ToolCall("fs", f"t{n}", {"n": n}), ALLOW) for n in range(60)
    ]
    report = verify_chain(path)
    assert report.ok and report.records == 60 and len(report.files) > 3
    assert [entry.args["n"] for entry in first.iter_entries()] == list(range(60))
    assert list(second.iter_entries()) == entries


def test_an_append_waiting_for_the_lock_follows_the_file_renamed_under_it(tmp_path: Path) -> None:
    # Another process's rotation: it holds the lock of the file, renames it, and lets go.
    log = AuditLog(tmp_path / "audit.jsonl")
    [before] = record(log, 1)
    other = os.open(log.path, os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)
    done: list[AuditEntry] = []
    appending = threading.Thread(target=lambda: done.extend(record(log, 1, start=1)))
    appending.start()
    time.sleep(0.05)  # the append opened the file and waits for its lock
    assert not done
    os.rename(log.path, tmp_path / "audit.jsonl.1")
    os.close(other)
    appending.join(timeout=10)
    [after] = done
    assert after.prev == sha256(before.to_json().encode()), "the new file's first record continues the old"
    assert raw_lines(log.path) == [after.to_json().encode()]
    assert raw_lines(tmp_path / "audit.jsonl.1") == [before.to_json().encode()], "nothing written to the old"
    assert verify_chain(log.path).ok


def test_rotation_waits_while_the_disk_is_nearly_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Full:
        f_bavail, f_frsize = 10, 4096

    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=300)
    with monkeypatch.context() as patch:
        patch.setattr(os, "fstatvfs", lambda fd: Full())
        record(log, 3)
        assert log.files() == [log.path], "the lines went into the old file's reserve"
    record(log, 1, start=3)
    assert [f.name for f in log.files()] == ["audit.jsonl.1", "audit.jsonl"]
    assert verify_chain(log.path).records == 4


def test_a_rotated_file_gives_back_its_reserve_and_the_new_file_makes_one(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=2000)
    log.arm_reserve()
    if log.path.stat().st_blocks * 512 < audit.RESERVE_BYTES:
        pytest.skip("this filesystem can't preallocate")
    record(log, 10)
    rotated, current = log.files()
    assert rotated.stat().st_blocks * 512 < 64 * 1024
    assert current.stat().st_blocks * 512 >= audit.RESERVE_BYTES


def test_iter_entries_reads_every_file_oldest_first_and_skips_damaged_lines(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=800)
    entries = record(log, 4)
    with log.path.open("ab") as file:
        file.write(b"damaged\n")
    entries += record(log, 4, start=4)
    assert list(log.iter_entries()) == entries
    assert list(log.iter_entries([log.path])) == log.read()
    assert list(AuditLog(tmp_path / "none.jsonl").iter_entries()) == []


@pytest.mark.parametrize("max_bytes", [0, -1])
def test_max_bytes_must_be_positive(tmp_path: Path, max_bytes: int) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        AuditLog(tmp_path / "audit.jsonl", max_bytes=max_bytes)


# --- ipybox audit verify -----------------------------------------------------------------------------------


def test_the_cli_says_intact_broken_or_unreadable_with_exit_0_1_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "ipybox.toml").write_text('[workspace]\nstate_dir = "state"\n')
    path = workspace / "state" / "audit.jsonl"  # where the supervisor writes it: the state dir's audit.jsonl

    assert audit_cli.verify(workspace, as_json=False) == audit_cli.EXIT_UNREADABLE == 2
    assert f"there is no audit log at {path}" in capsys.readouterr().err

    log = AuditLog(path, max_bytes=600)
    record(log, 3)
    assert audit_cli.verify(workspace, as_json=False) == audit_cli.EXIT_INTACT == 0
    assert capsys.readouterr().out == f"ipybox: the audit log {path} is intact: 3 records in 2 files\n"
    assert audit_cli.verify(workspace, as_json=True) == 0
    intact: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert intact == {
        "log": str(path),
        "ok": True,
        "records": 3,
        "unchained": 0,
        "files": [str(path) + ".1", str(path)],
        "head": sha256(raw_lines(path)[-1]),
        "broken": None,
    }

    rotated = Path(str(path) + ".1")
    lines = raw_lines(rotated)
    rewrite(rotated, [*lines[:-1], lines[-1].replace(b'"allow"', b'"deny"')])
    assert audit_cli.verify(workspace, as_json=False) == audit_cli.EXIT_BROKEN == 1
    expected = "the first record of audit.jsonl does not continue audit.jsonl.1"
    assert capsys.readouterr().out == f"ipybox: the audit log {path} is broken at {path}:1: {expected}\n"
    assert audit_cli.verify(workspace, as_json=True) == 1
    broken = json.loads(capsys.readouterr().out)
    assert (broken["ok"], broken["head"]) == (False, None)
    assert broken["broken"] == {"file": str(path), "line": 1, "reason": expected}

    path.unlink()
    path.symlink_to(rotated)
    assert audit_cli.verify(workspace, as_json=True) == 2
    unreadable = json.loads(capsys.readouterr().out)
    assert unreadable["ok"] is False and "symlink" in unreadable["error"]
