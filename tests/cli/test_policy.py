"""`ipybox policy check` and `ipybox policy replay`, on workspaces and audit logs written here (no
processes: the commands read files)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ipybox.cli.main import main
from ipybox.rules import AuditLog, ToolCall, Verdict

WORKSPACE = """
[approval]
default = "ask"

[[approval.rules]]
id = "reads"
server = "fs"
tool = "read_*"
decision = "allow"

[[approval.rules]]
id = "no-secrets"
server = "fs"
tool = "*"
args = { path = { glob = "secret/*" } }
decision = "deny"
priority = 10
reason = "secret/ is off limits"

[[approval.rules]]
id = "ro"
annotations = { readOnlyHint = true }
decision = "allow"
"""


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-admin"))  # no admin tier here
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "ipybox.toml").write_text(WORKSPACE)
    return tmp_path / "ws"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_check_names_the_deciding_rule_its_reason_and_the_other_rules_that_apply(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "policy", "check", str(workspace), 'fs.read_file {"path": "secret/a"}', "--json"
    )
    assert code == 0
    call = json.loads(out)["calls"][0]
    assert (call["decision"], call["rule"], call["tier"]) == ("deny", "no-secrets", "workspace")
    assert call["explanation"] == "secret/ is off limits"
    assert [m["rule"] for m in call["also_matched"]] == ["reads"]
    code, out, _ = run(capsys, "policy", "check", str(workspace), 'fs.read_file {"path": "a"}')
    assert code == 0 and out.startswith('fs.read_file {"path": "a"}: ALLOW by rule \'reads\' of ipybox.toml')


def test_check_reads_the_tools_annotations_from_the_lock_or_the_option(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "policy", "check", str(workspace), "time.now {}", "--json")
    assert code == 0 and json.loads(out)["calls"][0]["decision"] == "ask"
    given = '{"readOnlyHint": true}'
    code, out, _ = run(
        capsys, "policy", "check", str(workspace), "time.now {}", "--annotations", given, "--json"
    )
    assert code == 0
    assert json.loads(out)["calls"][0]["rule"] == "ro"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("fs.read_file {path: 1}", "the arguments are not JSON"),
        ("read_file {}", "is not SERVER.TOOL"),
        ('fs.read_file ["a"]', "the arguments are a JSON object"),
    ],
)
def test_check_refuses_a_call_it_cannot_read_with_one_line_saying_how_to_write_it(
    workspace: Path, capsys: pytest.CaptureFixture[str], call: str, message: str
) -> None:
    code, _, err = run(capsys, "policy", "check", str(workspace), call)
    assert code == 2 and message in err and "Traceback" not in err and err.count("\n") == 1


def write_log(workspace: Path, entries: list[tuple[ToolCall, Verdict]]) -> Path:
    log = AuditLog(workspace / ".ipybox" / "audit.jsonl")
    for call, verdict in entries:
        if verdict.decision == "ask":
            log.record(call, verdict, answer="allow", decided_by="console")
        else:
            log.record(call, verdict)
    return log.path


def test_replay_groups_the_calls_a_policy_change_would_decide_differently_and_fails_on_a_flip(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_log(
        workspace,
        [
            (ToolCall("fs", "read_file", {"path": "a"}), Verdict("allow", "reads", "")),
            (ToolCall("fs", "read_file", {"path": "b"}), Verdict("allow", "reads", "")),
            (ToolCall("fs", "write_file", {"path": "a"}), Verdict("ask", None, "")),
        ],
    )
    code, out, _ = run(capsys, "policy", "replay", str(workspace))
    assert (
        code == 0 and "replayed 3 calls under the workspace's policy: 0 would be decided differently" in out
    )
    other = workspace.parent / "other.toml"
    other.write_text(
        WORKSPACE.replace('glob = "secret/*"', 'glob = "*"').replace('tool = "read_*"', 'tool = "x"')
    )
    code, out, _ = run(capsys, "policy", "replay", str(workspace), "--config", str(other), "--json")
    report = json.loads(out)
    assert code == 1 and (report["records"], report["changed"], report["flips"]) == (3, 3, 2)
    groups = {g["rule"]: g for g in report["groups"]}
    assert groups["no-secrets"]["transitions"] == {"allow -> deny": 2, "ask -> deny": 1}
    assert groups["no-secrets"]["count"] == 3 and len(groups["no-secrets"]["examples"]) == 3


def test_replay_since_skips_older_calls(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(workspace, [(ToolCall("fs", "read_file", {"path": "a"}), Verdict("allow", "reads", ""))])
    code, out, _ = run(capsys, "policy", "replay", str(workspace), "--since", "2999-01-01", "--json")
    assert code == 0 and json.loads(out)["records"] == 0
    code, _, err = run(capsys, "policy", "replay", str(workspace), "--since", "yesterday")
    assert code == 2 and "since: expected an ISO 8601 date" in err


@pytest.mark.slow
def test_replay_of_100000_records_streams_the_log(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Written as `record()` would, but in one go (the replay, not the writing, is under test).
    log = AuditLog(workspace / ".ipybox" / "audit.jsonl")
    log.path.parent.mkdir(parents=True)
    line: dict[str, Any] = {
        "time": "2026-12-07T10:00:00.000000Z",
        "server": "fs",
        "tool": "read_file",
        "args": {"path": "notes.md"},
        "decision": "allow",
        "rule_id": "reads",
        "decided_by": "rule",
        "reason": "rule 'reads' applies",
    }
    with open(log.path, "w") as file:
        for i in range(100_000):
            line["args"] = {"path": f"secret/{i}" if i % 10 == 0 else f"notes-{i}.md"}
            file.write(json.dumps(line) + "\n")
    os.chmod(log.path, 0o600)
    started = time.perf_counter()
    code, out, _ = run(capsys, "policy", "replay", str(workspace), "--json")
    seconds = time.perf_counter() - started
    report = json.loads(out)
    assert code == 1 and (report["records"], report["changed"], report["flips"]) == (100_000, 10_000, 10_000)
    # Its time and memory are measured by `bench/policy_replay.py` (targets: under 5 s and 200 MB).
    assert len(report["groups"]) == 1 and len(report["groups"][0]["examples"]) == 5
    print(f"replay of 100,000 records: {seconds:.2f} s")


def test_disable_switches_a_hand_written_rule_off_check_says_so_and_remove_refuses_it(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "policy", "disable", "reads", "-w", str(workspace))
    assert (code, out) == (0, "Rule 'reads' disabled.\n")
    assert '[[approval.rules]]\nenabled = false\nid = "reads"' in (workspace / "ipybox.toml").read_text()
    code, out, _ = run(capsys, "policy", "check", str(workspace), 'fs.read_file {"path": "a"}')
    assert ": ASK by " in out.splitlines()[0]  # the default, no longer the rule
    assert "would apply, but is disabled (enabled = false): rule 'reads'" in out
    code, _, err = run(capsys, "policy", "remove", "reads", "-w", str(workspace))
    assert code == 2 and "written by hand" in err
    code, out, _ = run(capsys, "policy", "enable", "reads", "-w", str(workspace), "--json")
    assert (code, json.loads(out)) == (0, {"rule": "reads", "edit": "enable", "changed": True})
    assert (workspace / "ipybox.toml").read_text() == WORKSPACE
