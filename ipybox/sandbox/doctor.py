"""`ipybox doctor`: what this machine offers for sandboxing, and what is missing."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ipybox.sandbox.bwrap import check_sandbox
from ipybox.sandbox.errors import SandboxUnavailableError

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
        found = shutil.which("sandbox-exec")
        return [
            Check(
                "macOS sandbox-exec",
                found is not None,
                f"{found} (ipybox's macOS sandbox is not implemented yet: use sandbox=False or a Linux VM)"
                if found
                else "not found",
                True,
            )
        ]
    if system != "Linux":
        return [Check("platform", False, f"{system}: sandboxing needs Linux", True)]
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
