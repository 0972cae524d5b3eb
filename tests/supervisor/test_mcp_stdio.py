"""`ipybox mcp`: its sandbox options against a workspace's own `ipybox.toml` (no processes), and its stop when
the client signals."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ipybox.config import ConfigError, load_config
from ipybox.supervisor import ControlClient, SupervisorState, mcp_stdio, read_state
from ipybox.supervisor.mcp_stdio import ensure_config, planned_config

# A handshake-era client's first request, as a raw JSON-RPC line.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


def test_sandbox_asked_for_in_a_sandboxed_workspace_uses_its_file(tmp_path: Path) -> None:
    (tmp_path / "ipybox.toml").write_text("[sandbox]\nenabled = true\n")
    ensure_config(tmp_path, sandbox=True, sandbox_config=None)
    assert (tmp_path / "ipybox.toml").read_text() == "[sandbox]\nenabled = true\n"


def test_a_workspace_without_a_file_gets_one_with_the_sandbox_asked_for(tmp_path: Path) -> None:
    ensure_config(tmp_path, sandbox=True, sandbox_config=None)
    assert load_config(tmp_path / "ipybox.toml").sandbox.enabled is True


def test_a_new_unsandboxed_workspace_lifts_in_its_file_the_defaults_this_machine_cannot_enforce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in ipybox's container image (not root, no delegated cgroup): setrlimit can't bound an unsandboxed
    # kernel's memory, and a default that can't be enforced would stop `ipybox mcp` at its first start.
    why = {"memory": "setrlimit counts mapped memory only"}
    monkeypatch.setattr(mcp_stdio, "unenforceable_defaults", lambda sandboxed: {} if sandboxed else why)
    ensure_config(tmp_path, sandbox=False, sandbox_config=None)
    text = (tmp_path / "ipybox.toml").read_text()
    assert '# not enforceable here: setrlimit counts mapped memory only\nmemory = "unlimited"' in text
    config = load_config(tmp_path / "ipybox.toml")
    assert config.kernel.limits.memory is None and config.kernel.limits.processes is not None


def test_the_planned_configuration_is_read_without_writing_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IPYBOX_SANDBOX__ENABLED", raising=False)
    # No ipybox.toml: what `ensure_config` would write, as it would load; nothing is written.
    assert planned_config(tmp_path, sandbox=True, sandbox_config=None).sandbox.enabled is True
    assert planned_config(tmp_path, sandbox=False, sandbox_config=None).sandbox.enabled is False
    assert list(tmp_path.iterdir()) == []
    # What `ipybox mcp` answers every request with instead of serving: the file's problem, or the sandbox's.
    (tmp_path / "ipybox.toml").write_text("[sandbox]\nenabled = false\nnope = 1\n")
    with pytest.raises(ConfigError, match="nope"):
        planned_config(tmp_path, sandbox=False, sandbox_config=None)
    (tmp_path / "ipybox.toml").write_text("[sandbox]\nenabled = false\n")
    with pytest.raises(ConfigError, match=r"sandboxed kernels were asked for \(--sandbox\)"):
        planned_config(tmp_path, sandbox=True, sandbox_config=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ipybox.toml"]


@pytest.mark.integration
def test_ipybox_mcp_stops_cleanly_when_its_client_sends_sigint_then_sigterm(tmp_path: Path) -> None:
    """As Claude Code ends an MCP server: SIGINT, then SIGTERM 100 ms later. The second signal must not kill
    the process half-way through its stop: it exits 0, and the workspace's state and run directory are gone.
    Without --sandbox, `.env` overrides the file's sandbox as documented (the workspace runs unsandboxed)."""
    (tmp_path / "ipybox.toml").write_text("[kernel]\nwarm_pool = 1\n\n[sandbox]\nenabled = true\n")
    (tmp_path / ".env").write_text("IPYBOX_SANDBOX__ENABLED=false\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "ipybox.cli", "mcp", "--workspace", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write((json.dumps(INITIALIZE) + "\n").encode())
        process.stdin.flush()
        assert json.loads(process.stdout.readline())["id"] == 1
        # A workspace already (it has an ipybox.toml): it starts while the client initializes.
        deadline = time.monotonic() + 60
        while not (tmp_path / ".ipybox" / "state.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        state = read_state(tmp_path)
        run_dir = Path(state.control_socket).parent
        assert run_dir.is_dir()
        assert asyncio.run(sandboxed(state)) is False
        process.send_signal(signal.SIGINT)
        time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not (tmp_path / ".ipybox" / "state.json").exists()
    assert not run_dir.exists()


async def sandboxed(state: SupervisorState) -> bool:
    async with ControlClient(state) as control:
        return (await control.status()).sandbox
