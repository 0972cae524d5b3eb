"""`ipybox up / status / down / logs / validate` against real processes: a detached supervisor with its
gateway, kernels and an MCP server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_main import IPYBOX, ipybox
from tests.plugin.test_claude_code_plugin import CLAUDE, ClaudeCode
from tests.servers.processes import pids_anywhere
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

TAG = "cli-workspace"


def wait_until(condition: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def status_json(workspace: Path) -> dict[str, object]:
    done = ipybox("status", "--json", str(workspace))
    info: dict[str, object] = json.loads(done.stdout)
    return info


# The HTTP endpoint's token an earlier run of the workspace left (`ipybox.running.mcp_token`): served again.
KEPT_TOKEN = "a-token-an-earlier-run-of-this-workspace-kept"


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    workspace = make_workspace(tmp_path_factory.mktemp("ws"), TAG)
    (workspace / ".ipybox").mkdir(mode=0o700)
    (workspace / ".ipybox" / "mcp_token").write_text(KEPT_TOKEN + "\n")
    up = ipybox("up", "-d", str(workspace))
    assert up.returncode == 0, up.stderr
    yield workspace, up.stdout
    ipybox("down", str(workspace))


def test_up_prints_the_endpoints(running: tuple[Path, str]) -> None:
    workspace, out = running
    assert f"ipybox is up in {workspace}" in out
    assert "control:  unix:" in out and "gateway:  unix:" in out and "\n  servers:  1 (1 ready)\n" in out
    assert re.search(r"\n    edge  ready, \d+ tools\n", out), out  # each server with its state
    state = workspace / ".ipybox" / "state.json"
    assert oct(state.stat().st_mode & 0o777) == "0o600"


def mcp_answer(url: str, token: str) -> int:
    """The HTTP status of an MCP `initialize` sent to `url` with `token`."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_up_serves_the_token_an_earlier_run_kept_and_says_how_to_connect(running: tuple[Path, str]) -> None:
    workspace, out = running
    state = json.loads((workspace / ".ipybox" / "state.json").read_text())
    assert state["mcp_token"] == KEPT_TOKEN
    assert f"  mcp:      {state['mcp_url']}  (streamable HTTP, bearer token)" in out
    assert (
        f"  connect:  `ipybox connect CLIENT -w {workspace}` prints the entry for an agent (claude, " in out
    )


def test_token_rotate_refuses_the_old_token_at_once(running: tuple[Path, str]) -> None:
    workspace, _ = running
    old = json.loads((workspace / ".ipybox" / "state.json").read_text())
    assert mcp_answer(old["mcp_url"], old["mcp_token"]) == 200
    rotated = ipybox("token", "rotate", "-w", str(workspace))
    assert rotated.returncode == 0, rotated.stderr
    assert "it serves with it now and refuses the old one" in rotated.stdout
    printed = ipybox("connect", "json", "--http", "-w", str(workspace))
    [server] = json.loads(printed.stdout)["mcpServers"].values()
    assert "port changes at each `ipybox up`" in printed.stderr  # the port is not pinned here
    new = server["headers"]["Authorization"].removeprefix("Bearer ")
    assert new != old["mcp_token"] and server["url"] == old["mcp_url"]
    assert mcp_answer(old["mcp_url"], old["mcp_token"]) == 401
    assert mcp_answer(old["mcp_url"], new) == 200
    token_file = workspace / ".ipybox" / "mcp_token"
    assert token_file.read_text().strip() == new and oct(token_file.stat().st_mode & 0o777) == "0o600"
    assert json.loads((workspace / ".ipybox" / "state.json").read_text())["mcp_token"] == new


def test_claude_code_connects_over_http_with_the_command_line_connect_printed(
    running: tuple[Path, str], tmp_path: Path
) -> None:
    # (`ipybox connect claude --write`'s .mcp.json is checked in tests/plugin, over stdio.)
    if not CLAUDE.exists():
        pytest.skip(f"Claude Code is not installed ({CLAUDE}): `bash scripts/setup` installs it")
    workspace, _ = running
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir(mode=0o700)
    project.mkdir()
    cli = ClaudeCode(CLAUDE, home, marker=uuid.uuid4().hex)
    printed = ipybox("connect", "claude", "--http", "-w", str(workspace))
    assert printed.returncode == 0, printed.stderr
    claude, *args = shlex.split(printed.stdout)
    assert claude == "claude"
    cli.run(*args, cwd=project)
    url = json.loads((workspace / ".ipybox" / "state.json").read_text())["mcp_url"]
    listing = cli.run("mcp", "list", cwd=project)
    assert f"ipybox: {url} (HTTP) - ✔ Connected" in listing.splitlines(), listing


def test_a_second_up_says_it_is_already_running(running: tuple[Path, str]) -> None:
    workspace, _ = running
    again = ipybox("up", "-d", str(workspace))
    assert again.returncode == 1
    assert "already running" in again.stderr and "ipybox down" in again.stderr


def test_status(running: tuple[Path, str]) -> None:
    workspace, _ = running
    human = ipybox("status", "-w", str(workspace))
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0] == f"ipybox is running in {workspace}"
    assert re.fullmatch(r"  state:     up .+, pid \d+, kernels NOT sandboxed", lines[1]), lines
    assert "  servers:   1 (1 ready)" in lines and any(
        re.fullmatch(r"    edge  ready, \d+ tools", line) for line in lines
    )
    assert any(line.startswith("  control:   unix:") for line in lines), lines
    assert any(line.startswith("  mcp:       http://127.0.0.1:") for line in lines), lines
    assert (
        f"  connect:   `ipybox connect CLIENT -w {workspace}` prints the entry for an agent" in human.stdout
    )
    info = status_json(workspace)
    assert info["running"] is True and info["workspace"] == str(workspace)
    assert info["pool"] == {"size": 1, "idle": 1, "leased": 0} or info["pool"]["size"] == 1  # type: ignore[index]


def test_status_shows_each_kernels_memory_and_cpu(running: tuple[Path, str]) -> None:
    workspace, _ = running

    def pool_kernels() -> list[dict[str, object]]:
        kernels = status_json(workspace)["kernels"]
        assert isinstance(kernels, dict) and kernels["reported"] is True
        return [kernel for kernel in kernels["kernels"] if kernel["role"] == "pool"]

    wait_until(lambda: pool_kernels() != [])  # the warm pool's kernel may still be starting
    [kernel] = pool_kernels()
    usage = kernel["usage"]
    assert isinstance(usage, dict) and usage["memory"] > 10 * 1024**2 and usage["cpu_seconds"] > 0
    assert usage["processes"] >= 1 and usage["oom_kills"] == 0
    kernels = status_json(workspace)["kernels"]
    assert kernels["limits"]["memory"] == 4 * 1024**3  # type: ignore[index]
    human = ipybox("status", str(workspace)).stdout
    assert "  limits:    memory 4 GiB, processes 256, open files 4096 per kernel (" in human
    assert "idle leased kernels kept" in human
    prefix = f"    kernel {str(kernel['kernel_id'])[:8]}  warm pool  "
    [line] = [line for line in human.splitlines() if line.startswith(prefix)]
    assert all(word in line for word in (" RSS ", " MiB", " CPU ", " processes"))


def test_logs(running: tuple[Path, str]) -> None:
    workspace, _ = running
    logs = ipybox("logs", str(workspace))
    assert logs.returncode == 0 and f"workspace {workspace} is up" in logs.stdout


def test_logs_follow(running: tuple[Path, str]) -> None:
    workspace, _ = running
    follow = subprocess.Popen([str(IPYBOX), "logs", "-f", str(workspace)], stdout=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None
        assert ipybox("status", str(workspace)).returncode == 0
        (workspace / "ipybox.toml").write_text((workspace / "ipybox.toml").read_text() + "\n[kernel.bad\n")
        deadline = time.monotonic() + 30
        seen = ""
        while "ipybox.toml:" not in seen or "last good configuration" not in seen:
            assert time.monotonic() < deadline, seen[-2000:]
            seen += follow.stdout.readline()  # a new line appears while it follows
    finally:
        follow.terminate()
        follow.wait(10)
        text = (workspace / "ipybox.toml").read_text()
        (workspace / "ipybox.toml").write_text(text.replace("\n[kernel.bad\n", ""))


def test_a_crashed_gateway_is_restarted(running: tuple[Path, str]) -> None:
    workspace, _ = running
    before = status_json(workspace)
    gateway_pid = before["gateway"]["pid"]  # type: ignore[index]
    os.kill(gateway_pid, signal.SIGKILL)
    wait_until(lambda: status_json(workspace)["restarts"]["gateway"] == 1)  # type: ignore[index]
    wait_until(
        lambda: status_json(workspace)["gateway"]["running"] and status_json(workspace)["pool"]["idle"] == 1
    )  # type: ignore[index]
    assert status_json(workspace)["gateway"]["pid"] != gateway_pid  # type: ignore[index]
    assert "the kernel gateway exited" in ipybox("logs", str(workspace)).stdout


def test_down_stops_everything(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, "cli-down")
    assert ipybox("up", "-d", str(workspace)).returncode == 0
    supervisor = status_json(workspace)["pid"]
    wait_until(lambda: len(pids_anywhere("cli-down")) >= 2)  # the pool's kernel and the edge server
    down = ipybox("down", str(workspace))
    assert down.returncode == 0 and "is down" in down.stdout
    wait_until(lambda: not pids_anywhere("cli-down"), timeout=10)
    with pytest.raises(ProcessLookupError):
        os.kill(supervisor, 0)  # type: ignore[arg-type]
    assert not (workspace / ".ipybox" / "state.json").exists()
    after = ipybox("status", str(workspace))
    assert after.returncode == 1 and "not running" in after.stderr
    again = ipybox("down", "-w", str(workspace))  # idempotent: a stopped workspace stays stopped
    assert (
        again.returncode == 0 and again.stdout == f"ipybox is not running in {workspace}: nothing to stop\n"
    )


def test_sigterm_to_a_foreground_up_leaves_no_process(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, "cli-sigterm")
    process = subprocess.Popen([str(IPYBOX), "up", str(workspace)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert "ipybox is up" in process.stdout.readline()
    wait_until(lambda: len(pids_anywhere("cli-sigterm")) >= 2)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert not pids_anywhere("cli-sigterm")


def test_up_refuses_an_invalid_file_with_its_position(tmp_path: Path) -> None:
    make_workspace(tmp_path, "cli-invalid")
    (tmp_path / "ipybox.toml").write_text("[kernel]\nwarm_pol = 1\n")
    done = ipybox("up", "-d", str(tmp_path))
    assert done.returncode == 1
    assert (
        f"{tmp_path / 'ipybox.toml'}:2:1: unknown key 'warm_pol' in [kernel] (did you mean 'warm_pool'?)"
        in done.stderr
    )
    assert not pids_anywhere("cli-invalid")


def test_a_console_port_in_use_fails_up_with_one_line_naming_the_setting(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, "cli-port")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = workspace / "ipybox.toml"
        config.write_text(config.read_text() + f"\n[endpoints]\nconsole_port = {port}\n")
        done = ipybox("up", "-d", str(workspace))
    assert done.returncode == 1
    assert done.stderr == (
        f"ipybox: ipybox up failed: the web console: ipybox-console cannot listen on 127.0.0.1:{port}: Address "
        "already in use (another program uses it; choose another port, or 0 for a free one) (set by "
        "[endpoints] console_port)\n"
    )
    assert not pids_anywhere("cli-port")
    assert not (workspace / ".ipybox" / "state.json").exists()


def test_validate(tmp_path: Path) -> None:
    make_workspace(tmp_path, "cli-validate")
    ok = ipybox("validate", str(tmp_path))
    assert ok.returncode == 0 and "ok (1 server, 2 approval rules, sandbox off)" in ok.stdout
    (tmp_path / "ipybox.toml").write_text('[servers.x]\ncommand = "a"\nurl = "http://127.0.0.1:1/mcp"\n')
    bad = ipybox("validate", str(tmp_path))
    assert bad.returncode == 1 and f"{tmp_path / 'ipybox.toml'}:" in bad.stderr


def test_verbs_outside_a_workspace_say_so(tmp_path: Path) -> None:
    done = ipybox("status", str(tmp_path))
    assert done.returncode == 2 and "has no ipybox.toml" in done.stderr


@pytest.mark.parametrize(
    "damage",
    ["deeply nested", "gone"],
)
def test_validate_status_and_down_work_whatever_happened_to_ipybox_toml(tmp_path: Path, damage: str) -> None:
    workspace = make_workspace(tmp_path, "cli-damaged")
    assert ipybox("up", "-d", str(workspace)).returncode == 0
    supervisor = status_json(workspace)["pid"]
    assert isinstance(supervisor, int)
    config = workspace / "ipybox.toml"
    try:
        if damage == "gone":
            config.unlink()
        else:
            config.write_text("x = " + "[" * 100_000)  # a RecursionError traceback in all three before
            validate = ipybox("validate", str(workspace))
            assert validate.returncode == 1
            assert validate.stderr == (
                f"{config}:1:37: nesting deeper than 32 levels (arrays and inline tables): "
                "an ipybox.toml needs a few\n"
            )
        status = ipybox("status", str(workspace))
        assert status.returncode == 0, status.stderr
        assert f"ipybox is running in {workspace}" in status.stdout and not status.stderr
        down = ipybox("down", str(workspace))
        assert down.returncode == 0 and "is down" in down.stdout and not down.stderr
        after = ipybox("status", str(workspace))
        assert after.returncode in (1, 2) and "Traceback" not in after.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGTERM)
    wait_until(lambda: not pids_anywhere("cli-damaged"), timeout=10)
