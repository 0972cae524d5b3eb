"""`ipybox validate --live` (`validate_live`): approval rules checked against the tools our edge server
really lists, every server stopped afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipybox.cli.validate_live import validate_live
from tests.servers.processes import pids
from tests.supervisor.workspaces import edge_server

pytestmark = pytest.mark.integration  # starts MCP servers

TAG = "cli-validate-live"


def write_workspace(directory: Path, rules: str, *, broken: bool = False) -> Path:
    servers = edge_server(TAG)
    if broken:  # a server that can't start: exits before the handshake
        servers += edge_server(TAG, "broken").replace(
            'edge_server.py"]', 'edge_server.py", "--exit-at-once"]'
        )
    (directory / "ipybox.toml").write_text("[sandbox]\nenabled = false\n\n" + servers + "\n" + rules)
    return directory


def test_a_misspelt_tool_is_reported_where_it_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = (
        '[[approval.rules]]\nid = "echo-ok"\nserver = "edge"\ntool = ["add", "ecoh"]\ndecision = "allow"\n'
    )
    workspace = write_workspace(tmp_path, rules)
    line = (workspace / "ipybox.toml").read_text().splitlines().index('tool = ["add", "ecoh"]') + 1

    assert validate_live(workspace, as_json=False, timeout=20) == 1

    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"{workspace / 'ipybox.toml'}:{line}:16: rule 'echo-ok': tool glob 'ecoh' matches no tool of server "
        "'edge' (did you mean 'echo'?)"
    )
    assert "1 finding in 1 rule" in out[-1]
    assert pids(TAG) == []  # the server was stopped


def test_a_clean_policy_passes_and_a_server_that_cannot_start_is_not_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = (
        '[[approval.rules]]\nserver = "edge"\ntool = "kitchen_sink"\n'
        'args = { "nested.inner.deep" = { exists = true }, color = { in = ["red", "blue"] } }\n'
        'decision = "allow"\n\n'
        # Its typo can't be told from a tool of a server that is down: not a finding.
        '[[approval.rules]]\nserver = "broken"\ntool = "no_such_tool"\ndecision = "deny"\n'
    )
    workspace = write_workspace(tmp_path, rules, broken=True)

    assert validate_live(workspace, as_json=True, timeout=20) == 0

    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["findings"] == []
    assert report["servers"]["edge"]["tools"] > 10
    assert "exited" in report["servers"]["broken"]["error"]
    assert pids(TAG) == []


def test_lock_accept_outside_a_running_workspace_pins_what_the_servers_serve_now(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ipybox.cli.lock import accept
    from ipybox.config.tool_lock import read_lock

    workspace = write_workspace(tmp_path, "", broken=True)
    # The broken server can't be listed: it is reported and left unpinned, the other is pinned.
    assert accept(workspace, None, as_json=True) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["accepted"] == ["edge"] and list(report["failed"]) == ["broken"]
    pins = read_lock(workspace / "ipybox.lock").servers
    assert list(pins) == ["edge"] and pins["edge"].tools["forecast"].annotations["readOnlyHint"] is True
    # Nothing differs the second time: nothing is written.
    assert accept(workspace, "edge", as_json=False) == 0
    assert "already pins what the servers serve" in capsys.readouterr().out
    assert accept(workspace, "nope", as_json=False) == 2
    assert "has no enabled server 'nope'" in capsys.readouterr().err
    assert pids(TAG) == []
