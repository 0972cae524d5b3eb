"""The kernel-side tool runner's parts that need no tool server (its calls are tested through real
executors in tests/executor and tests/in_kernel/test_shell_approval.py)."""

from __future__ import annotations

import pytest

from ipybox.in_kernel.tool_runner import ToolRunnerError, approve_shell


def test_an_unknown_kind_of_shell_approval_is_refused() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        approve_shell("exec", "ls", address="unix:/nonexistent")


def test_a_shell_approval_without_a_tool_server_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IPYBOX_TOOL_SERVER", raising=False)
    with pytest.raises(ToolRunnerError, match="no tool server is configured"):
        approve_shell("shell", "ls")
