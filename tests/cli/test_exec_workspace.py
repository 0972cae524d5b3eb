"""`ipybox exec` in a workspace runs the code in a kernel of that workspace (its sandbox, environment,
servers and rules), however the workspace is named: `--workspace DIR`, the current directory, or
`--working-dir DIR`. A fresh unsandboxed kernel in a sandboxed workspace would read its `.env`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

TAG = "cli-exec-workspace"
SECRET = "never-in-a-kernel"  # make_workspace's .env
READ_DOTENV = (
    "try:\n    print(open('.env').read())\nexcept OSError as e:\n    print('hidden:', type(e).__name__)"
)


def ipybox(*args: str, cwd: Path | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipybox.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def sandboxed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A sandboxed workspace that `ipybox up -d` runs."""
    directory = make_workspace(tmp_path_factory.mktemp("exec-ws"), TAG, sandbox=True)
    up = ipybox("up", "-d", str(directory))
    assert up.returncode == 0, up.stderr
    yield directory
    ipybox("down", str(directory))


def test_every_way_of_naming_a_sandboxed_workspace_runs_the_code_in_its_sandbox_under_its_rules(
    sandboxed: Path,
) -> None:
    for args, cwd in (
        (["--workspace", str(sandboxed)], None),
        ([], sandboxed),
        (["--working-dir", str(sandboxed)], None),
    ):
        done = ipybox("exec", *args, READ_DOTENV, cwd=cwd)
        assert done.returncode == 0, (args, done.stderr)
        assert SECRET not in done.stdout + done.stderr, args
        assert done.stdout.startswith("hidden: "), (args, done.stdout)
    # Its rules decide; an ask is left to its people (none here), since standard input is no terminal
    # (--approve none).
    code = (
        "from mcptools.edge import echo, slow\n"
        "from ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
        "print(echo.run(echo.Params(text='hi')))\n"  # allowed by rule echo-ok
        "try:\n    slow.run(slow.Params(seconds=0))\nexcept ApprovalRejectedError as e:\n    print('rejected:', e)"
    )
    done = ipybox("exec", "--workspace", str(sandboxed), code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("hi\nrejected: ") and "nobody is connected to answer" in done.stdout
    entries = [json.loads(line) for line in (sandboxed / ".ipybox" / "audit.jsonl").read_text().splitlines()]
    assert [(e["tool"], e["decision"], e["decided_by"]) for e in entries[-2:]] == [
        ("echo", "allow", "rule"),
        ("slow", "deny", "timeout"),
    ]


def test_exec_starts_a_workspace_that_is_not_running_for_the_command_only(tmp_path: Path) -> None:
    # No servers: only what exec needs starts.
    (tmp_path / "ipybox.toml").write_text("[sandbox]\nenabled = true\n\n[kernel]\nwarm_pool = 1\n")
    (tmp_path / ".env").write_text(f"WORKSPACE_SECRET={SECRET}\n")
    directory = tmp_path
    done = ipybox("exec", READ_DOTENV, cwd=directory)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout and done.stdout.startswith("hidden: ")
    assert f"ipybox: starting the workspace {directory} for this command" in done.stderr
    assert not (directory / ".ipybox" / "state.json").exists()  # stopped again


def test_contradictory_exec_options_are_one_clear_error(sandboxed: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text("{}")
    for args, message in (
        (
            ["--workspace", str(sandboxed), "--working-dir", str(tmp_path)],
            "--workspace and --working-dir: give one",
        ),
        (
            ["--workspace", str(sandboxed), "--sandbox-config", str(policy)],
            "--sandbox-config is for a fresh kernel",
        ),
        (["--sandbox-config", str(policy)], "--sandbox-config is for a fresh kernel"),  # in the workspace
        (["--workspace", str(tmp_path)], f"--workspace {tmp_path} is not a workspace: it has no ipybox.toml"),
    ):
        done = ipybox("exec", *args, "print('ran')", cwd=sandboxed)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        assert done.stdout == ""
