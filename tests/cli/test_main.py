"""The `ipybox` command, run as users run it (the installed console script)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

IPYBOX = Path(sys.executable).parent / "ipybox"


def ipybox(
    *args: str, stdin: str | None = None, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # The console script; the unprivileged run's venv (scripts/test-user) has none: the module then.
        [str(IPYBOX), *args] if IPYBOX.exists() else [sys.executable, "-m", "ipybox.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


def test_exec_prints_output_and_exits_0(tmp_path: Path) -> None:
    done = ipybox("exec", "--working-dir", str(tmp_path), "import os\nprint(1 + 1, os.getcwd())")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"2 {tmp_path}\n"


def test_exec_reads_code_from_stdin(tmp_path: Path) -> None:
    done = ipybox("exec", "--working-dir", str(tmp_path), stdin="import sys\nprint('err', file=sys.stderr)\n")
    assert done.returncode == 0
    assert done.stderr == "err\n" and done.stdout == ""


def test_exec_error_exits_1_with_the_traceback(tmp_path: Path) -> None:
    done = ipybox("exec", "--working-dir", str(tmp_path), "1 / 0")
    assert done.returncode == 1
    assert "ZeroDivisionError" in done.stderr and "Traceback" not in done.stdout


def test_exec_timeout_exits_124(tmp_path: Path) -> None:
    done = ipybox("exec", "--working-dir", str(tmp_path), "--timeout", "0.5", "while True: pass")
    assert done.returncode == 124
    assert "timeout" in done.stderr.lower() or "timed out" in done.stderr.lower()


def test_missing_workspace_is_one_clear_error(tmp_path: Path) -> None:
    done = ipybox("exec", "--working-dir", str(tmp_path / "nope"), "1")
    assert done.returncode == 2
    assert "no such directory" in done.stderr and "Traceback" not in done.stderr


def test_tool_calls_are_rejected_unless_approved(
    tools_workspace: Path, mcptools: Path, tool_servers: dict[str, dict[str, Any]]
) -> None:
    code = "from mcptools.everything import echo\nprint(echo.run(echo.Params(message='cli')))"
    # The registry records the server's literal env as ${VAR} names: this other process supplies the value.
    env = dict(tool_servers["everything"]["env"])
    rejected = ipybox("exec", "--working-dir", str(tools_workspace), code, stdin="", env=env)
    assert rejected.returncode == 1
    assert "rejected tool call everything.echo" in rejected.stderr and "--approve" in rejected.stderr
    approved = ipybox("exec", "--working-dir", str(tools_workspace), "--approve", "all", code, env=env)
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout == "Echo: cli\n"


def test_doctor_reports_what_the_machine_supports() -> None:
    import json

    done = ipybox("doctor", "--json")
    report = json.loads(done.stdout)
    names = [check["name"] for check in report["checks"]]
    assert names[:2] == ["bubblewrap", "namespaces (user, pid, net, mount)"]
    assert done.returncode == (0 if report["sandbox"] else 1)
    human = ipybox("doctor")
    assert "bubblewrap" in human.stdout and "sandbox=True" in human.stdout


def test_exec_in_the_sandbox(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("KEY=cli-secret\n")
    code = "try:\n    open('.env').read()\nexcept PermissionError:\n    print('hidden')"
    done = ipybox("exec", "--sandbox", "--working-dir", str(tmp_path), code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hidden\n"


def test_exec_with_a_bad_sandbox_policy_is_one_clear_error(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text('{"filesystem": {"denyReed": []}}')
    done = ipybox("exec", "--sandbox", "--sandbox-config", str(policy), "--working-dir", str(tmp_path), "1")
    assert done.returncode == 1
    assert "filesystem.denyReed: Extra inputs are not permitted" in done.stderr
    assert "Traceback" not in done.stderr


def test_doctor_and_the_sandbox_docs_state_the_same_threat_model() -> None:
    from ipybox.sandbox.doctor import THREAT_MODEL

    docs = (Path(__file__).resolve().parents[2] / "docs" / "sandbox.md").read_text()
    threat_model = docs[docs.index("\n### Threat model\n") :]
    rows = [f"| {what} | {how} |" for what, how in THREAT_MODEL]
    table = threat_model[threat_model.index("| what | how |") :].split("\n\n")[0].splitlines()[2:]
    assert table == rows
    human = ipybox("doctor")
    assert "ipybox.toml, .env: read-only or hidden" in human.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["--workspace", "{dir}", "mcp"],
        ["mcp", "--workspace", "{dir}"],
        ["--workspace", "{dir}"],
        ["--kernel-gateway-port", "8888", "--log-level", "debug", "--workspace", "{dir}"],  # 0.9's options
    ],
)
def test_the_mcp_workspace_is_taken_wherever_it_is_given(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ipybox.cli.main import main

    # A file: refused before anything starts (a missing directory is created, as ipybox 0.9 did).
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    with pytest.raises(SystemExit):
        main([arg.format(dir=not_a_dir) for arg in argv])
    assert f"--workspace {not_a_dir}: not a directory" in capsys.readouterr().err
