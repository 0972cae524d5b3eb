"""`ipybox doctor`: what this machine offers for sandboxing, and what is missing."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ipybox.sandbox.bwrap import check_sandbox
from ipybox.sandbox.errors import SandboxUnavailableError
from ipybox.sandbox.seatbelt import SANDBOX_EXEC, check_seatbelt

_LANDLOCK_CREATE_RULESET = {"x86_64": 444, "aarch64": 444}
_LANDLOCK_CREATE_RULESET_VERSION = 1


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    required: bool  # needed for sandbox=True (others are reported for what later hardening can use)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_checks() -> list[Check]:
    """Every check, in report order."""
    system = platform.system()
    if system == "Darwin":
        found = _sandbox_exec()
        return [found, _seatbelt_profile()] if found.ok else [found]
    if system != "Linux":
        return [Check("platform", False, f"{system}: sandboxing needs Linux or macOS", True)]
    return [_bwrap(), _namespaces(), _userns_sysctls(), _landlock(), _seccomp()]


def _bwrap() -> Check:
    path = shutil.which("bwrap")
    if path is None:
        return Check("bubblewrap", False, "not installed: 'sudo apt-get install bubblewrap'", True)
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return Check("bubblewrap", True, f"{path} ({version})", True)


def _namespaces() -> Check:
    try:
        check_sandbox.__wrapped__()
    except SandboxUnavailableError as e:
        return Check("namespaces (user, pid, net, mount)", False, str(e), True)
    return Check("namespaces (user, pid, net, mount)", True, "a test sandbox started", True)


def _sandbox_exec() -> Check:
    if not os.access(SANDBOX_EXEC, os.X_OK):
        return Check("sandbox-exec", False, f"{SANDBOX_EXEC} not found (it is part of macOS)", True)
    return Check(
        "sandbox-exec", True, f"{SANDBOX_EXEC} (ipybox's macOS sandbox is untested: see README)", True
    )


def _seatbelt_profile() -> Check:
    try:
        check_seatbelt.__wrapped__()
    except SandboxUnavailableError as e:
        return Check("Seatbelt profile", False, str(e), True)
    return Check("Seatbelt profile", True, "a test sandbox started with ipybox's profile", True)


def _userns_sysctls() -> Check:
    notes = []
    for path, bad in (
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"),
        ("/proc/sys/user/max_user_namespaces", "0"),
    ):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        notes.append(f"{Path(path).name}={value}{' (blocks unprivileged users)' if value == bad else ''}")
    blocked = any("blocks" in note for note in notes)
    return Check(
        "unprivileged user namespaces", not blocked, ", ".join(notes) or "no restriction found", False
    )


def _landlock() -> Check:
    number = _LANDLOCK_CREATE_RULESET.get(platform.machine())
    if number is None:
        return Check("Landlock", False, f"unknown syscall number on {platform.machine()}", False)
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(number, None, ctypes.c_size_t(0), ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 0:
        return Check("Landlock", False, f"not available (errno {ctypes.get_errno()})", False)
    return Check("Landlock", True, f"ABI {abi}", False)


def _seccomp() -> Check:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return Check("seccomp", False, "/proc/self/status unreadable", False)
    if "Seccomp:" not in status:
        return Check("seccomp", False, "kernel without seccomp", False)
    return Check("seccomp", True, "filters available", False)


def sandbox_ready(checks: list[Check]) -> bool:
    return all(check.ok for check in checks if check.required)
