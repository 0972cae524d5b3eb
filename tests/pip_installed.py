"""ipybox as a user gets it: the wheel built from this checkout, and that wheel installed with pip into a
fresh venv outside the checkout. Both are built once per test run, not once per module or per xdist
worker: any test asks for the session fixtures `ipybox_wheel` or `pip_installed` (tests/conftest.py), and
the first worker to need one builds it while the others wait for it (a file lock in the run's shared
temporary directory).

The venv is an ordinary one (`python -m venv`; it has a pip of its own) into which this run's pip installed
the packages without byte-compiling them (`--no-compile`): compiling every module of every dependency costs
about 10 s of CPU and, on CI's two busy cores, up to a minute of the install's wall time, where a program
run from the venv compiles (and caches) only the modules it imports. Nothing else differs from
`pip install` in that venv.

A test that uses the venv runs it through `Installed.run` (or with `Installed.env`): a clean environment
whose PATH starts with the venv's bin and whose HOME is the test session's own 0700 directory, so nothing
of the checkout or of the test run is on the path; a test that writes into HOME takes one of its own
(`Installed.in_home`). Tests share the venv (they may run at once on two workers): they must not install
into it or change it. tests/test_pip_install.py checks that no process of the venv outlives its
workspace (`pgrep -f VENV`), so a test elsewhere must not leave one running either.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIP = ["-m", "pip", "--disable-pip-version-check", "-q"]


class Installed:
    """ipybox installed from its wheel into a fresh venv, and a clean environment to run it in."""

    def __init__(self, venv: Path, home: Path) -> None:
        self.venv = venv
        self.home = home
        self.env = {
            "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }

    def in_home(self, home: Path) -> Installed:
        """The same venv with another HOME: for a test that writes there (a client's config, say)."""
        return Installed(self.venv, home)

    def run(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`ipybox ARGS...` of the venv, in `cwd`, in the clean environment."""
        return subprocess.run(
            ["ipybox", *args], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )


def checked(done: subprocess.CompletedProcess[str]) -> str:
    """The standard output of a command that must have succeeded (else its whole output, to see why)."""
    assert done.returncode == 0, f"{done.args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The directory `name`, made by `build` once in this test run, whichever worker asks first."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's directory, which holds each worker's own
    target = base / name
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if `build` fails
        if not (target / ".built").exists():
            shutil.rmtree(target, ignore_errors=True)  # what a failed attempt left
            target.mkdir()
            build(target)
            (target / ".built").touch()
    return target


def build_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, as `pip wheel` builds it (in an isolated build environment)."""

    def build(out: Path) -> None:
        command = [sys.executable, *PIP, "wheel", "--no-deps", "-w", str(out), str(ROOT)]
        checked(subprocess.run(command, capture_output=True, text=True, timeout=600))

    (wheel,) = once_per_run(tmp_path_factory, "ipybox-wheel", build).glob("ipybox-*.whl")
    return wheel


def install(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Installed:
    """`wheel` and mcp-server-time (the README's quick start adds it) pip-installed into a fresh venv."""

    def build(base: Path) -> None:
        venv = base / "venv"
        make = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
        checked(subprocess.run(make, capture_output=True, text=True, timeout=120))
        # This run's pip, for the venv's interpreter (`--python`), puts a pip into the venv too: the venv's
        # own would be the one ensurepip bundles with this Python (23.x here), which takes three times as
        # long (about 75 s against 25 s on CI's two cores) for the same packages.
        command = [sys.executable, *PIP, "--python", str(venv / "bin" / "python"), "install", "--no-compile"]
        command += ["pip", str(wheel), "mcp-server-time"]
        checked(subprocess.run(command, capture_output=True, text=True, timeout=900))

    base = once_per_run(tmp_path_factory, "pip-install", build)
    assert not base.is_relative_to(ROOT), "the install must stand outside the checkout"
    home = tmp_path_factory.mktemp("home")
    home.chmod(0o700)
    return Installed(base / "venv", home)
