"""`ipybox doctor`: what this machine offers for sandboxing, what is missing, and what a sandboxed kernel
can do (the threat model, the same table as in the README).

In a container (`ipybox.sandbox.container`) the "container" check says whether bubblewrap can nest there,
and when it can't, why (the runtime's default seccomp/AppArmor confinement), that the container is then the
isolation boundary, and which `docker run` flags would let it nest, at what cost. It is not required:
`sandbox=True` needs the namespaces check, which already fails in such a container.

The command also reports how this machine enforces resource limits, as more `Check`s made by
`ipybox.cli.doctor` (`ipybox.limits` is this package's sibling layer, so neither imports the other)."""

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
from ipybox.sandbox.container import container_remedy, detect_container
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

    def line(self) -> str:
        """The check as `ipybox doctor` prints it: `ok`, `MISSING` (required) or `no`, name, detail."""
        mark = "ok" if self.ok else ("MISSING" if self.required else "no")
        return f"{mark:>7}  {self.name}: {self.detail}"


# What a sandboxed kernel (Linux) can read, write and reach, and how each thing the host reads later from a
# workspace is kept out of its reach. The README's "Threat model" table holds the same rows (a test checks).
THREAT_MODEL: tuple[tuple[str, str], ...] = (
    (
        "kernel reads",
        "the filesystem, except `.env*` in the workspace and its parents (also ones made or replaced "
        "later), credential stores in the home (`~/.ssh`, ...), `denyRead`, other kernels' connection "
        "files and sockets, the host's `/tmp` and processes",
    ),
    (
        "kernel writes",
        "inside the workspace's top-level entries (existing files in place, directories throughout), "
        "`allowWrite`, its private `/tmp`; never a new name at the workspace's top level, a protected name "
        "(`ipybox.toml`, `.git`, `.ipybox`, `mcptools`, `.vscode`, `.claude`, `.mcp.json`, `.envrc`, "
        "shell rc files, ...) or the host's ipybox state (`~/.local/state/ipybox`)",
    ),
    (
        "kernel reaches",
        "no network; the tool server's call socket with a token valid for its own calls only; "
        "`allowedDomains` through the host's filtering proxy; `allowUnixSockets`",
    ),
    (
        "`ipybox.toml`, `.env`",
        "read-only or hidden and impossible to create or replace: the workspace's top level is a "
        "read-only view built when the kernel starts, so a rename by the host changes nothing inside",
    ),
    (
        "`.ipybox/` (state, tokens, audit log)",
        "hidden from kernels; the supervisor refuses one that is a symlink or not its user's and opens "
        "files in it without following symlinks",
    ),
    (
        "`mcptools/` and its generation marker",
        "read-only to kernels; the generator refuses symlinks and ignores names in the marker that it "
        "would not have written",
    ),
    (
        "server registry (`~/.local/state/ipybox`)",
        "outside the workspace, read-only to kernels also when the workspace is the home; read without "
        "following symlinks, each entry validated; a name not in it starts nothing",
    ),
    (
        "approval channel",
        "its own token, which never reaches a kernel; a kernel's token opens only the call channel",
    ),
    ("complete outputs", "in a private per-user directory (0700), files 0600 with unpredictable names"),
)


def run_checks() -> list[Check]:
    """Every check, in report order."""
    system = platform.system()
    if system == "Darwin":
        found = _sandbox_exec()
        return [found, _seatbelt_profile()] if found.ok else [found]
    if system != "Linux":
        return [Check("platform", False, f"{system}: sandboxing needs Linux or macOS", True)]
    namespaces = _namespaces()
    return [
        _bwrap(),
        namespaces,
        container_check(namespaces, detect_container()),
        _userns_sysctls(),
        _landlock(),
        _seccomp(),
    ]


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


def container_check(namespaces: Check, evidence: str | None) -> Check:
    """Whether this is a container (`evidence`, from `detect_container()`), and (from the namespaces check)
    whether bubblewrap nests in it."""
    if evidence is None:
        return Check("container", True, "not in a container", False)
    if namespaces.ok:
        return Check("container", True, f"{evidence}; bubblewrap nests in it", False)
    remedy = container_remedy(evidence)
    return Check("container", False, remedy[0].upper() + remedy[1:], False)


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
