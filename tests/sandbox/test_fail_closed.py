"""Without bubblewrap, `sandbox=True` fails with one clear error and never runs code unsandboxed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ipybox.sandbox import SandboxUnavailableError
from ipybox.sandbox.bwrap import bwrap_path


def test_missing_bubblewrap_is_named_with_the_remedy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailableError, match=r"needs bubblewrap.*apt-get install bubblewrap"):
        bwrap_path()


def test_executor_without_bubblewrap_runs_nothing(tmp_path: Path) -> None:
    canary = tmp_path / "ran-unsandboxed"
    script = textwrap.dedent(
        f"""
        import asyncio
        from ipybox import CodeExecutor
        from ipybox.sandbox import SandboxUnavailableError

        async def main():
            try:
                async with CodeExecutor(sandbox=True, working_dir={str(tmp_path)!r}) as ex:
                    await ex.execute("open({str(canary)!r}, 'w').write('x')")
            except SandboxUnavailableError as e:
                print("refused:", e)

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python, but no bwrap
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: sandbox=True needs bubblewrap")
    assert not canary.exists()
