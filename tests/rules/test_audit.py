from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ipybox.rules import AuditEntry, AuditFilter, AuditLog, AuditPage, ToolCall, Verdict, audit

ALLOW = Verdict("allow", "read-only", "rule 'read-only' applies")
ASK = Verdict("ask", None, "no rule applies; the default is ask")


def lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.split("\n")[:-1]]


def test_record_a_rule_verdict(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    entry = log.record(ToolCall("fs", "read_file", {"path": "a"}), ALLOW)
    [line] = lines(log.path)
    assert line == {
        "time": entry.time,
        "server": "fs",
        "tool": "read_file",
        "args": {"path": "a"},
        "decision": "allow",
        "rule_id": "read-only",
        "decided_by": "rule",
        "reason": "rule 'read-only' applies",
        "prev": audit.GENESIS,  # the first record of a log
    }
    assert log.read() == [entry]
    time = datetime.fromisoformat(entry.time)
    assert entry.time.endswith("Z") and time.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - time) < timedelta(seconds=10)


def test_record_the_default(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    entry = log.record(ToolCall("fs", "t"), Verdict("deny", None, "no rule applies; the default is deny"))
    assert (entry.decision, entry.rule_id, entry.decided_by) == ("deny", None, "default")
    assert lines(log.path)[0]["rule_id"] is None


@pytest.mark.parametrize("answer", ["allow", "deny"])
def test_record_the_applications_answer(tmp_path: Path, answer: Any) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    asked = Verdict("ask", "writes", "rule 'writes' applies")
    entry = log.record(ToolCall("fs", "t"), asked, answer=answer)
    assert (entry.decision, entry.rule_id, entry.decided_by) == (answer, "writes", "application")
    assert entry.reason == f"rule 'writes' applies; the application answered {answer}"
    again = log.record(ToolCall("fs", "t"), asked, answer=answer, reason="user clicked")
    assert again.reason == "user clicked"


def test_record_a_timeout_as_deny(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    entry = log.record(ToolCall("fs", "t"), ASK, timed_out=True)
    assert (entry.decision, entry.decided_by) == ("deny", "timeout")
    assert lines(log.path)[0]["decided_by"] == "timeout"


@pytest.mark.parametrize(
    ("verdict", "kwargs"),
    [
        (ASK, {}),
        (ASK, {"answer": "allow", "timed_out": True}),
        (ALLOW, {"answer": "deny"}),
        (ALLOW, {"timed_out": True}),
    ],
)
def test_inconsistent_outcomes_are_refused(tmp_path: Path, verdict: Verdict, kwargs: dict[str, Any]) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    with pytest.raises(ValueError):
        log.record(ToolCall("fs", "t"), verdict, **kwargs)
    assert not log.path.exists()


# --- redaction ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "access_token",
        "Password",
        "passwd",
        "client_secret",
        "api_key",
        "apiKey",
        "X-API-KEY",
        "Authorization",
        "credentials",
        "private_key",
        "privateKey",
    ],
)
def test_secret_looking_keys_are_redacted(tmp_path: Path, key: str) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.record(ToolCall("s", "t", {key: "hunter2", "user": "bob", "nested": {key: {"any": "thing"}}}), ALLOW)
    assert lines(log.path)[0]["args"] == {key: "[redacted]", "user": "bob", "nested": {key: "[redacted]"}}


def test_keys_are_redacted_inside_lists(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    args: dict[str, Any] = {
        "headers": [{"name": "x", "authorization": "Bearer abc"}, "plain"],
        "n": [1, None, True],
    }
    entry = log.record(ToolCall("s", "t", args), ALLOW)
    assert entry.args == {
        "headers": [{"name": "x", "authorization": "[redacted]"}, "plain"],
        "n": [1, None, True],
    }
    assert args["headers"][0] == {"name": "x", "authorization": "Bearer abc"}  # the call is not changed


def test_known_secret_values_are_redacted_anywhere(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", secrets=["s3cr3t-value", "abc", "", "424242"])
    args = {
        "url": "https://x/?k=s3cr3t-value&q=1",
        "deep": [{"cmd": ["echo", "s3cr3t-values"]}],
        "s3cr3t-value": "as a key",
        "short": "abc",
        "pin": 424242,
    }
    entry = log.record(ToolCall("s", "t", args), ALLOW, reason="used s3cr3t-value")
    assert entry.args == {
        "url": "https://x/?k=[redacted]&q=1",
        "deep": [{"cmd": ["echo", "[redacted]s"]}],
        "[redacted]": "as a key",
        "short": "abc",  # too short to redact without mangling the log
        "pin": "[redacted]",
    }
    assert entry.reason == "used [redacted]"
    assert "s3cr3t" not in log.path.read_text() and "424242" not in log.path.read_text()


def test_longer_secret_is_redacted_whole(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", secrets=["abcd", "abcdefgh"])
    assert log.record(ToolCall("s", "t", {"v": "xabcdefghx abcd"}), ALLOW).args == {
        "v": "x[redacted]x [redacted]"
    }


def test_non_json_values_are_recorded_as_text(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", secrets=["topsecret"])
    entry = log.record(ToolCall("s", "t", {"p": Path("/x/topsecret"), "t": (1, 2)}), ALLOW)
    assert entry.args == {"p": "/x/[redacted]", "t": [1, 2]}


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings(v)]]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return []


def test_overlapping_secrets_are_redacted_whole(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", secrets=["abcd", "cdefgh"])
    assert log.record(ToolCall("s", "t", {"v": "xabcdefghx"}), ALLOW).args == {"v": "x[redacted]x"}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    secrets=st.lists(st.text("abc", min_size=4, max_size=6), min_size=1, max_size=3),
    values=st.lists(st.text("abc", max_size=30), max_size=3),
)
@pytest.mark.integration  # no process, but a property test that takes seconds
def test_no_known_secret_survives(tmp_path: Path, secrets: list[str], values: list[str]) -> None:
    # A small alphabet makes secrets overlap each other and their surroundings.
    path = tmp_path / "audit.jsonl"
    path.unlink(missing_ok=True)
    log = AuditLog(path, secrets=secrets)
    log.record(ToolCall("s", "t", {"v": values, "w": {"x": "".join(secrets)}}), ALLOW)
    [entry] = log.read()
    assert not [s for s in strings(entry.args) for secret in secrets if secret in s]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    secret=st.text(st.characters(codec="utf-8", exclude_characters="[]"), min_size=4, max_size=12),
    prefix=st.text(max_size=5),
    key=st.text(max_size=8),
)
def test_a_known_secret_never_reaches_the_file(tmp_path: Path, secret: str, prefix: str, key: str) -> None:
    assume(secret not in "[redacted]")  # else the marker itself would contain it
    path = tmp_path / "audit.jsonl"
    path.unlink(missing_ok=True)
    log = AuditLog(path, secrets=[secret])
    log.record(ToolCall("s", "t", {key: [prefix + secret + prefix, {"x": secret}]}), ALLOW)
    [entry] = log.read()
    assert not [s for s in strings(entry.args) if secret in s]


# --- the file ----------------------------------------------------------------------------------------------


def test_file_is_private_and_parents_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "audit.jsonl"
    old = os.umask(0)
    try:
        AuditLog(path).record(ToolCall("s", "t"), ALLOW)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_file_is_created_private_not_narrowed_afterwards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file created readable and chmod-ed later would be readable in between.
    def no_chmod(*_: Any) -> None:
        raise AssertionError("a new log should not need chmod")

    monkeypatch.setattr(os, "fchmod", no_chmod)
    old = os.umask(0)
    try:
        AuditLog(tmp_path / "audit.jsonl").record(ToolCall("s", "t"), ALLOW)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "audit.jsonl").stat().st_mode) == 0o600


def test_existing_file_is_narrowed_and_appended(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    AuditLog(path).record(ToolCall("s", "first"), ALLOW)
    path.chmod(0o644)
    AuditLog(path).record(ToolCall("s", "second"), ALLOW)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [e.tool for e in AuditLog(path).read()] == ["first", "second"]


def test_line_breaks_in_values_stay_inside_the_line(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.record(ToolCall("s", "t", {"v": "a\nb\r\nc\u2028d\u0085e"}), ALLOW)
    assert log.path.read_text().count("\n") == 1
    assert log.read()[0].args == {"v": "a\nb\r\nc\u2028d\u0085e"}


def test_read_missing_file(tmp_path: Path) -> None:
    assert AuditLog(tmp_path / "none.jsonl").read() == []


def test_entry_json_round_trip() -> None:
    entry = AuditEntry("2025-01-01T00:00:00.000000Z", "s", "t", {"a": [1]}, "deny", None, "timeout", None)
    assert AuditEntry.from_json(entry.to_json()) == entry


async def test_concurrent_appends_from_tasks_and_threads(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    logs = [AuditLog(path), AuditLog(path)]  # two logs on one file must not interleave either
    big = "x" * 200_000  # far beyond any pipe or page size

    def append(n: int) -> None:
        logs[n % 2].record(ToolCall("s", f"t{n}", {"n": n, "big": big if n % 7 == 0 else ""}), ALLOW)

    async def task(n: int) -> None:
        await asyncio.sleep(0)
        append(n)

    def append_many(n: int) -> None:
        for i in range(20):
            append(n * 1000 + i)

    threads = [threading.Thread(target=append_many, args=(n,)) for n in range(1, 9)]
    for thread in threads:
        thread.start()
    await asyncio.gather(
        *(task(n) for n in range(200)), *(asyncio.to_thread(append, 500 + n) for n in range(50))
    )
    for thread in threads:
        thread.join()

    expected = (
        set(range(200))
        | {500 + n for n in range(50)}
        | {n * 1000 + i for n in range(1, 9) for i in range(20)}
    )
    entries = lines(path)
    assert len(entries) == len(expected)
    assert {e["args"]["n"] for e in entries} == expected
    assert all(e["args"]["big"] == (big if e["args"]["n"] % 7 == 0 else "") for e in entries)


# --- paging ------------------------------------------------------------------------------------------------

START = datetime(2026, 1, 1, tzinfo=UTC)


def entry_at(n: int, **changes: Any) -> AuditEntry:
    """The n-th entry of a made-up log: one second apart, servers and decisions taking turns."""
    fields: dict[str, Any] = {
        "time": (START + timedelta(seconds=n)).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "server": ("filesystem", "memory", "time")[n % 3],
        "tool": f"tool_{n % 5}",
        "args": {"n": n},
        "decision": "deny" if n % 4 == 0 else "allow",
        "rule_id": None if n % 2 else f"rule-{n % 3}",
        "decided_by": "default" if n % 2 else "rule",
        "reason": "made up",
    }
    return AuditEntry(**{**fields, **changes})


def write_log(path: Path, count: int, *, extra: str = "") -> list[AuditEntry]:
    entries = [entry_at(n, args={"n": n, "pad": extra}) for n in range(count)]
    path.write_text("".join(entry.to_json() + "\n" for entry in entries))
    path.chmod(0o600)
    return entries


def all_pages(log: AuditLog, limit: int, where: AuditFilter | None = None) -> list[AuditPage]:
    pages = [log.page(limit=limit, where=where)]
    while pages[-1].older is not None:
        pages.append(log.page(before=pages[-1].older, limit=limit, where=where))
    return pages


@pytest.mark.parametrize("block", [64 * 1024, 1000, 7])
def test_paging_through_a_large_log_gives_every_entry_once_newest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(audit, "PAGE_BLOCK_BYTES", block)
    log = AuditLog(tmp_path / "audit.jsonl")
    count = 20_000 if block > 7 else 2_000  # a 7-byte block cuts every line several times
    entries = write_log(log.path, count)
    pages = all_pages(log, limit=777)
    assert [len(page.entries) for page in pages] == [777] * (count // 777) + [count % 777]
    assert [entry for page in pages for entry in page.entries] == entries[::-1]
    assert all(page.damaged == 0 for page in pages)
    assert log.page(before=0) == AuditPage([], None, 0)


def test_a_page_says_where_the_next_one_starts(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    entries = write_log(log.path, 5)
    first = log.page(limit=2)
    assert first.entries == [entries[4], entries[3]]
    assert first.older == log.path.read_bytes().index(entries[3].to_json().encode())
    assert log.page(before=first.older, limit=2).entries == [entries[2], entries[1]]
    assert log.page(limit=5).older is None  # the page reached the first line
    assert log.page(limit=6) == AuditPage(entries[::-1], None, 0)


def test_entries_appended_while_paging_do_not_shift_the_pages(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    entries = write_log(log.path, 10)
    first = log.page(limit=4)
    for n in range(3):
        log.record(ToolCall("s", f"new{n}"), ALLOW)
    assert first.older is not None
    second = log.page(before=first.older, limit=4)
    assert second.entries == entries[5:1:-1]
    assert [e.tool for e in log.page(limit=3).entries] == ["new2", "new1", "new0"]


def test_a_line_cut_at_a_block_boundary_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    lengths = [10, 5000, 30, 70_000, 3]
    entries = [entry_at(n, args={"text": "y" * length}) for n, length in enumerate(lengths)]
    data = "".join(entry.to_json() + "\n" for entry in entries).encode()
    log.path.write_bytes(data)
    log.path.chmod(0o600)
    line_ends = [i for i, byte in enumerate(data) if byte == ord("\n")]
    for block in (100, 4096, 5001, 65536):
        monkeypatch.setattr(audit, "PAGE_BLOCK_BYTES", block)
        boundaries = range(len(data) - block, 0, -block)  # where blocks start, read from the end
        cut = [b for b in boundaries if b not in (0, *[end + 1 for end in line_ends])]
        assert cut, f"no line is cut with {block}-byte blocks"
        assert log.page(limit=10) == AuditPage(entries[::-1], None, 0), f"{block}-byte blocks"


def test_damaged_lines_are_skipped_and_counted_on_their_page(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    entries = [entry_at(n) for n in range(4)]
    log.path.write_bytes(
        b"".join(
            [
                entries[0].to_json().encode() + b"\n",
                b'{"time": "2026-01-01T00:00:01Z", "serv\n',  # cut short by a crash
                entries[1].to_json().encode() + b"\n",
                b"\xff\xfe not UTF-8\n",
                b"\n",  # an empty line is not damaged
                entries[2].to_json().encode() + b"\n",
                b'{"not": "an entry"}\n',
                entries[3].to_json().encode() + b"\n",
                b'{"time": "2026-01-01T00:00:09Z", "server": "unfinished',  # no newline yet
            ]
        )
    )
    log.path.chmod(0o600)
    first = log.page(limit=2)
    assert (first.entries, first.damaged) == ([entries[3], entries[2]], 2)
    assert first.older is not None
    second = log.page(before=first.older, limit=2)
    assert (second.entries, second.older, second.damaged) == ([entries[1], entries[0]], None, 2)
    assert len(log.load().damaged_lines) == 4  # the same four lines load() reports


def test_a_before_offset_inside_a_line_leaves_that_line_to_the_newer_page(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    entries = write_log(log.path, 3)
    inside_the_last = log.path.stat().st_size - 5
    assert log.page(before=inside_the_last) == AuditPage([entries[1], entries[0]], None, 0)
    assert log.page(before=10**12).entries == entries[::-1]  # past the end: from the end


def test_paging_memory_stays_within_a_block_and_a_line(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    write_log(log.path, 20_000, extra="z" * 300)
    size = log.path.stat().st_size
    assert size > 6_000_000
    tracemalloc.start()
    try:
        # Matches nothing, so the page reads the whole file.
        page = log.page(where=AuditFilter(server="nothing-matches"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert page == AuditPage([], None, 0)
    assert peak < 1_000_000, f"paging {size} bytes peaked at {peak} bytes"


def test_paging_a_missing_log_gives_an_empty_page(tmp_path: Path) -> None:
    assert AuditLog(tmp_path / "none.jsonl").page() == AuditPage([], None, 0)


def test_paging_refuses_a_symlinked_log(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    write_log(target, 2)
    (tmp_path / "audit.jsonl").symlink_to(target)
    with pytest.raises(OSError, match="is a symlink"):
        AuditLog(tmp_path / "audit.jsonl").page()


def test_paging_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "audit.jsonl")
    with pytest.raises(OSError, match="not a regular file"):
        AuditLog(tmp_path / "audit.jsonl").page()


@pytest.mark.parametrize(("kwargs", "message"), [({"limit": 0}, "limit"), ({"before": -1}, "before")])
def test_a_bad_page_request_names_the_argument(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AuditLog(tmp_path / "audit.jsonl").page(**kwargs)


# --- filters -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (AuditFilter(server="memory"), [n for n in range(60) if n % 3 == 1]),
        (AuditFilter(tool="tool_2"), [n for n in range(60) if n % 5 == 2]),
        (AuditFilter(tool="tool_[12]"), [n for n in range(60) if n % 5 in (1, 2)]),
        (AuditFilter(server="file*", decision="deny"), [n for n in range(60) if n % 12 == 0]),
        (AuditFilter(rule_id="rule-2"), [n for n in range(60) if n % 6 == 2]),
        (AuditFilter(rule_id="rule-*"), [n for n in range(60) if n % 2 == 0]),
        (AuditFilter(decided_by="default"), [n for n in range(60) if n % 2]),
        (AuditFilter(since="2026-01-01T00:00:50Z"), list(range(50, 60))),
        (AuditFilter(until="2026-01-01T00:00:03"), [0, 1, 2]),  # no zone: UTC
        (AuditFilter(since="2026-01-01T01:00:10+01:00", until="2026-01-01T00:00:12Z"), [10, 11]),
        (AuditFilter(since="2026-01-02"), []),
        (AuditFilter(until="2026-01-01"), []),
    ],
)
def test_a_filter_pages_through_the_entries_it_matches(
    tmp_path: Path, where: AuditFilter, expected: list[int]
) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    write_log(log.path, 60)
    pages = all_pages(log, limit=4, where=where)
    assert [entry.args["n"] for page in pages for entry in page.entries] == expected[::-1]
    assert all(where.matches(entry) for page in pages for entry in page.entries)


def test_since_stops_reading_at_older_entries(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    old = [entry_at(n) for n in range(3)]
    new = [entry_at(3600 + n) for n in range(3)]
    damaged = b"an old damaged line\n"
    log.path.write_bytes(damaged + b"".join(e.to_json().encode() + b"\n" for e in old + new))
    log.path.chmod(0o600)
    page = log.page(where=AuditFilter(since="2026-01-01T00:30:00"))
    # The damaged line at the start was never read: the page stopped at the old entries.
    assert page == AuditPage(new[::-1], None, 0)
    assert log.page(where=AuditFilter(server="*")).damaged == 1


def test_since_reads_on_past_entries_slightly_out_of_order(tmp_path: Path) -> None:
    # Two processes append: a line stamped a moment earlier can land after a later one.
    log = AuditLog(tmp_path / "audit.jsonl")
    order = [entry_at(n) for n in (100, 98, 101, 99, 102)]
    log.path.write_text("".join(e.to_json() + "\n" for e in order))
    log.path.chmod(0o600)
    page = log.page(where=AuditFilter(since="2026-01-01T00:01:39Z"))  # 99 s after the start
    assert [e.args["n"] for e in page.entries] == [102, 99, 101, 100]


def test_a_filter_from_form_fields_treats_blank_as_not_given() -> None:
    where = AuditFilter.parse(
        server=" filesystem ", tool="", decision="deny", rule_id="  ", since="2026-01-01"
    )
    assert where == AuditFilter(server="filesystem", decision="deny", since="2026-01-01")
    assert AuditFilter.parse() == AuditFilter()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"decision": "ask"}, "decision: expected one of allow, deny, got 'ask'"),
        ({"decided_by": "robot"}, "decided_by: expected one of rule, default, application"),
        ({"since": "yesterday"}, "since: expected an ISO 8601 date or date-time"),
        ({"until": "2026-13-01"}, "until: expected an ISO 8601 date or date-time"),
        ({"since": "2026-01-02", "until": "2026-01-01"}, "until: '2026-01-01' is not after since"),
        ({"server_name": "x"}, "server_name: not an audit filter; the filters are server, tool"),
    ],
)
def test_a_bad_filter_names_its_field_and_what_it_expects(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        AuditFilter.parse(**fields)
    assert str(raised.value).startswith(message)


def test_an_entry_without_a_readable_time_passes_no_time_condition() -> None:
    entry = entry_at(1, time="not a time")
    assert AuditFilter(server="memory").matches(entry)
    assert not AuditFilter(since="2000-01-01").matches(entry)


def test_redact_is_what_record_writes(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", secrets=["hunter22"])
    args = {"password": "x", "url": "https://u:hunter22@host/", "list": [{"api_key": 1}]}
    assert log.redact(args) == {
        "password": "[redacted]",
        "url": "https://u:[redacted]@host/",
        "list": [{"api_key": "[redacted]"}],
    }
    assert log.record(ToolCall("s", "t", args), ALLOW).args == log.redact(args)
