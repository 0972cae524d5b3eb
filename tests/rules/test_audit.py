from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ipybox.rules import AuditEntry, AuditLog, ToolCall, Verdict

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
