"""`--sandbox` against a workspace whose effective configuration turns the sandbox off: `ipybox.toml` may
enable it while the environment or the workspace's `.env` (which override the file) set
`IPYBOX_SANDBOX__ENABLED=false`. The check is made on the configuration that runs, so such a workspace is
refused with one error naming the variable, and nothing starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ipybox.config import ConfigError, load_config
from ipybox.supervisor import Supervisor
from tests.supervisor.test_mcp_stdio import INITIALIZE

OVERRIDE = "IPYBOX_SANDBOX__ENABLED"
SANDBOXED = "[sandbox]\nenabled = true\n\n[kernel]\nwarm_pool = 1\n"


def overridden(directory: Path, where: str) -> tuple[Path, dict[str, str]]:
    """A workspace whose ipybox.toml enables the sandbox, turned off by `where` (`environment` or `.env`);
    the environment to run ipybox with."""
    (directory / "ipybox.toml").write_text(SANDBOXED)
    env = {key: value for key, value in os.environ.items() if not key.upper().startswith("IPYBOX_")}
    if where == "environment":
        env[OVERRIDE] = "false"
    else:
        (directory / ".env").write_text(f"SECRET=never-in-a-kernel\n{OVERRIDE}=false\n")
    return directory, env


def ipybox(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipybox.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def placed(where: str, workspace: Path) -> str:
    """How the error names the override."""
    if where == "environment":
        return f"ipybox: environment variable {OVERRIDE}: sandboxed kernels were asked for (--sandbox), but this variable turns"
    return (
        f"ipybox: {workspace / '.env'}:2:1: sandboxed kernels were asked for (--sandbox), but this line turns"
    )


@pytest.mark.integration
@pytest.mark.parametrize("where", ["environment", ".env"])
def test_ipybox_mcp_sandbox_refuses_a_workspace_whose_override_turns_the_sandbox_off(
    tmp_path: Path, where: str
) -> None:
    workspace, env = overridden(tmp_path, where)
    done = ipybox(
        "mcp", "--workspace", str(workspace), "--sandbox", env=env, stdin=json.dumps(INITIALIZE) + "\n"
    )
    assert done.returncode == 1, done.stderr
    errors = [
        line for line in done.stderr.splitlines() if line.startswith("ipybox: ") and "exists" not in line
    ]
    assert len(errors) == 1 and errors[0].startswith(placed(where, workspace)), done.stderr
    assert "or don't ask for them (leave out --sandbox)" in errors[0] and "Traceback" not in done.stderr
    # The client is answered with the reason (Claude Code shows it in `claude mcp list`), nothing served.
    answer = json.loads(done.stdout)
    assert answer["id"] == INITIALIZE["id"] and "result" not in answer
    assert answer["error"]["message"] == errors[0]
    assert not (workspace / ".ipybox").exists()  # nothing started: no state, no kernels


@pytest.mark.integration
@pytest.mark.parametrize("where", ["environment", ".env"])
def test_ipybox_exec_sandbox_refuses_a_workspace_whose_override_turns_the_sandbox_off(
    tmp_path: Path, where: str
) -> None:
    workspace, env = overridden(tmp_path, where)
    done = ipybox("exec", "--workspace", str(workspace), "--sandbox", "print(open('.env').read())", env=env)
    assert done.returncode == 1
    assert done.stderr.startswith(placed(where, workspace)) and len(done.stderr.splitlines()) == 1
    assert "never-in-a-kernel" not in done.stdout
    assert not (workspace / ".ipybox").exists()


def test_the_error_places_what_turned_the_sandbox_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in os.environ:
        if key.upper().startswith("IPYBOX_"):
            monkeypatch.delenv(key)
    config = tmp_path / "ipybox.toml"
    config.write_text("[workspace]\nname = 'w'\n")  # no [sandbox]: sandboxed by default
    assert Supervisor(tmp_path, serve_mcp=False, require_sandbox=True).config.sandbox.enabled is True
    config.write_text("[sandbox]\nenabled = false\n")
    with pytest.raises(ConfigError) as info:
        Supervisor(tmp_path, serve_mcp=False, require_sandbox=True)
    assert str(info.value).startswith(
        f"{config}:2:1: sandboxed kernels were asked for (--sandbox), but this file does not enable"
    )
    assert "set `enabled = true` under [sandbox]" in str(info.value)
    config.write_text(SANDBOXED)
    (tmp_path / ".env").write_text(f"export {OVERRIDE.lower()}=0\n")
    with pytest.raises(
        ConfigError,
        match=rf"^{tmp_path / '.env'}:1:8: sandboxed kernels were asked for \(--sandbox\), but this line",
    ):
        Supervisor(tmp_path, serve_mcp=False, require_sandbox=True)
    monkeypatch.setenv("IPYBOX_SANDBOX", '{"enabled": false}')
    with pytest.raises(
        ConfigError,
        match=r"^environment variable IPYBOX_SANDBOX: sandboxed kernels were asked for \(--sandbox\)",
    ):
        Supervisor(tmp_path, serve_mcp=False, require_sandbox=True)
    # Without --sandbox the override works as documented.
    assert Supervisor(tmp_path, serve_mcp=False).config.sandbox.enabled is False


async def test_an_edit_that_turns_the_sandbox_off_is_refused_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in os.environ:
        if key.upper().startswith("IPYBOX_"):
            monkeypatch.delenv(key)
    (tmp_path / "ipybox.toml").write_text(SANDBOXED)
    supervisor = Supervisor(tmp_path, serve_mcp=False, require_sandbox=True)
    (tmp_path / ".env").write_text(f"{OVERRIDE}=false\n")
    edited = load_config(tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"sandboxed kernels were asked for \(--sandbox\), but this line turns the sandbox off",
    ):
        await supervisor.kernels_changed(edited, ["sandbox.enabled: true -> false"])
    assert supervisor.config.sandbox.enabled is True
