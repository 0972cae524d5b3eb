"""`ipybox mcp`'s sandbox options against a workspace's own `ipybox.toml` (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.config import ConfigError, load_config
from ipybox.supervisor.mcp_stdio import ensure_config


def test_sandbox_asked_for_in_a_workspace_whose_file_runs_kernels_unsandboxed_is_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "ipybox.toml").write_text("[sandbox]\nenabled = false\n")
    with pytest.raises(ConfigError, match=r"--sandbox was given.*enabled = true"):
        ensure_config(tmp_path, sandbox=True, sandbox_config=None)
    (tmp_path / "ipybox.toml").write_text("[workspace]\nname = 'w'\n")  # no [sandbox]: off by default
    with pytest.raises(ConfigError, match="--sandbox was given"):
        ensure_config(tmp_path, sandbox=True, sandbox_config=None)


def test_sandbox_asked_for_in_a_sandboxed_workspace_uses_its_file(tmp_path: Path) -> None:
    (tmp_path / "ipybox.toml").write_text("[sandbox]\nenabled = true\n")
    ensure_config(tmp_path, sandbox=True, sandbox_config=None)
    assert (tmp_path / "ipybox.toml").read_text() == "[sandbox]\nenabled = true\n"


def test_a_workspace_without_a_file_gets_one_with_the_sandbox_asked_for(tmp_path: Path) -> None:
    ensure_config(tmp_path, sandbox=True, sandbox_config=None)
    assert load_config(tmp_path / "ipybox.toml").sandbox.enabled is True
