"""ToolRunner's own errors (its happy paths run in the server and executor tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError


def test_no_tool_server_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IPYBOX_TOOL_SERVER", raising=False)
    with pytest.raises(ToolRunnerError, match="no tool server is configured"):
        ToolRunner("x").run_sync("t", {})


def test_unreachable_tool_server(tmp_path: Path) -> None:
    runner = ToolRunner("x", address=f"unix:{tmp_path / 'missing.sock'}", token="t")
    with pytest.raises(ToolRunnerError, match="cannot reach the ipybox tool server"):
        runner.run_sync("t", {})


def test_bad_address() -> None:
    with pytest.raises(ToolRunnerError, match="unsupported tool server address"):
        ToolRunner("x", address="ftp://nope", token="t").run_sync("t", {})


@pytest.mark.integration
def test_imports_only_the_standard_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import ipybox.in_kernel.tool_runner; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'aiohttp', 'mcp', 'starlette')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
