"""Without bubblewrap, `sandbox=True` fails with one clear error and never runs code unsandboxed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ipybox.sandbox import SandboxUnavailableError
from ipybox.sandbox.bwrap import bwrap_path, check_sandbox

pytestmark = pytest.mark.integration


def test_missing_bubblewrap_is_named_with_the_remedy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(
        "ipybox.sandbox.bwrap.BWRAP_SYSTEM_DIRS", (str(tmp_path),)
    )  # nor where distros put it
    with pytest.raises(SandboxUnavailableError, match=r"needs bubblewrap.*apt-get install bubblewrap"):
        bwrap_path()


def test_executor_without_bubblewrap_runs_nothing(tmp_path: Path) -> None:
    canary = tmp_path / "ran-unsandboxed"
    script = textwrap.dedent(
        f"""
        import asyncio
        from ipybox import CodeExecutor
        from ipybox.sandbox import SandboxUnavailableError
        import ipybox.sandbox.bwrap

        ipybox.sandbox.bwrap.BWRAP_SYSTEM_DIRS = ()  # not found in the system's directories either

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


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        ("bwrap: Unknown option --disable-userns", "too old: ipybox needs 0.8 or newer"),
        (
            "bwrap: setting up uid map: Permission denied",
            "Unprivileged user namespaces are probably disabled",
        ),
    ],
)
def test_a_bubblewrap_that_cannot_sandbox_is_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stderr: str, expected: str
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("IPYBOX_IN_CONTAINER", "0")  # the host's advice, also where tests run in a container
    check_sandbox.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match=expected):
            check_sandbox()
    finally:
        check_sandbox.cache_clear()
