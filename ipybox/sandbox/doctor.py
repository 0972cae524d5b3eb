"""`ipybox doctor`: what this machine offers for sandboxing, what is missing, and what a sandboxed kernel
can do (the threat model, the same table as in docs/sandbox.md).

In a container (`ipybox.sandbox.container`) the "container" check says whether bubblewrap can nest there,
and when it can't, why (the runtime's default seccomp/AppArmor confinement), that the container is then the
isolation boundary, and which `docker run` flags would let it nest, at what cost. It is not required:
`sandbox=True` needs the namespaces check, which already fails in such a container.

Its bubblewrap check finds `bwrap` with the sandbox's own lookup (`ipybox.sandbox.bwrap.bwrap_path`: `PATH`,
then the system's directories), so it reports the executable a sandboxed kernel will run.

The command also reports how this machine enforces resource limits, as more `Check`s made by
`ipybox.cli.doctor` (`ipybox.limits` is this package's sibling layer, so neither imports the other)."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ipybox.sandbox.bwrap import bwrap_path, check_sandbox
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
# workspace is kept out of its reach. The "Threat model" table of docs/sandbox.md holds the same rows (a test
# checks).
THREAT_MODEL: tuple[tuple[str, str], ...] = (
    (
        "kernel reads",
        "the filesystem, except `.env*` in the workspace, its parents and the directories beside it (also "
        "ones made or replaced later), workspaces' `.ipybox` (its own, its parents', its siblings'), "
        "ipybox's host state (`~/.local/state/ipybox`: the server registry, gateway tokens), credential "
        "stores in the home (`~/.ssh`, ...), `denyRead`, other kernels' connection files and sockets, the "
        "host's `/tmp` and processes",
    ),
    (
        "kernel writes",
        "inside the workspace's top-level entries (existing files in place, directories throughout), "
        "`allowWrite` (a path of it inside a tree already writable gets no bind of its own, so a symlink "
        "a kernel puts in its place is never followed), its private `/tmp`; never a new name at the "
        "workspace's top level, a protected name (`ipybox.toml`, `.git`, `.ipybox`, `mcptools`, `.venv`, "
        "`node_modules`, `.vscode`, `.claude`, `.mcp.json`, `.envrc`, shell rc files, ...) or what the "
        "host executes (next row)",
    ),
    (
        "what the host executes",
        "read-only to kernels and sandboxed servers: the environments programs run from (`.venv`, `venv`, "
        "`node_modules`, `__pypackages__`, `.tox`, `.nox`; tool caches in a home workspace) and what "
        "ipybox derives from `ipybox.toml` and its own interpreter (each server's resolved command, a "
        "virtualenv's whole tree, its script's directory, or at the top level the script, `__pycache__`, "
        "`*.py` and the packages it imports, a `-m` module, a subdirectory `cwd`, package-runner project "
        "files, `PATH`/`PYTHONPATH`/`NODE_PATH` entries); a server whose code a living kernel can still "
        "write is refused (`ServerCodeWritableError`) and gets no secrets; `ipybox doctor DIR` warns "
        "about what can't be derived",
    ),
    (
        "kernel reaches",
        "no network; the tool server's call socket with a token valid for its own calls only; "
        "`allowedDomains` through the host's filtering proxy (methods and paths per entry, "
        "`readOnly`; changes apply at the next connection); `allowUnixSockets`",
    ),
    (
        "secrets (`[secrets]`)",
        "resolved on the host; a kernel holds only a placeholder; the proxy puts the value only in "
        "the allowed headers of HTTPS requests to the secret's hosts, over TLS it terminates with a "
        "workspace CA name-constrained to those hosts, its key hidden in `.ipybox/`; sent elsewhere "
        "the placeholder stays a placeholder (refused and logged in plain HTTP and wherever the proxy "
        "reads requests); a `Host` that differs from the `CONNECT` is refused; smuggling shapes are "
        "refused; the value is redacted from the audit log; a secret's command in the workspace or on "
        "a kernel-writable `PATH` is refused",
    ),
    (
        "unknown hosts",
        'refused, or with `unknown = "ask"` asked of the people present (never of code in the '
        "kernel): once, for the session, or always (written into `allowedDomains` by the host)",
    ),
    (
        "kernel's resources",
        "memory, processes, open files, file size and `/tmp` per kernel, set before its first instruction "
        '(see "Limits"); under `setrlimit`, memory only for a sandboxed kernel with a `tmp` limit, with '
        "`memfd_create` and `shmget` refused by seccomp; `disk` as a project quota on the workspace where "
        "its filesystem has them (`.ipybox/` outside it); the audit log keeps a reserve, so a kernel that "
        "fills the disk does not turn other sessions' calls into refusals",
    ),
    (
        "`ipybox.toml`, `.env`",
        "read-only or hidden and impossible to create or replace: the workspace's top level is a "
        "read-only view built when the kernel starts, so a rename by the host changes nothing inside",
    ),
    (
        "`.ipybox/` (state, tokens, audit log)",
        "hidden from kernels and sandboxed servers, also those of parent and sibling workspaces; the "
        "supervisor refuses one that is a symlink or not its user's and opens files in it without "
        "following symlinks",
    ),
    (
        "other projects beside the workspace",
        "their `.ipybox/` and `.env*` are hidden: each directory beside the workspace that holds one when "
        "a kernel starts is a read-only view (a rotated or new one stays hidden); in one that held none "
        "then, one made later shows up until the next kernel starts",
    ),
    (
        "`mcptools/` and its generation marker",
        "read-only to kernels; the generator refuses symlinks and ignores names in the marker that it "
        "would not have written",
    ),
    (
        "server registry (`~/.local/state/ipybox`)",
        "hidden from kernels and sandboxed servers, also when the workspace is the home; holds `${VAR}` "
        "names, never secret values; read without following symlinks, each entry validated; an executor "
        "looks up only its own package roots (`mcptools_dir`, `package_roots`): another project's root, "
        "or a name not in it, starts nothing and asks no one",
    ),
    (
        "catalog servers (`ipybox init --server`)",
        "the filesystem server runs in a sandbox of its own (its program installed beforehand); `init`'s "
        "rules deny paths outside the workspace, with a `..` part, or naming a protected name in any "
        "spelling; the git server's rule keeps it on the workspace's own repository",
    ),
    (
        "server sandboxes and links",
        "a sandboxed server sees the view a kernel does, also when its `cwd` is a subdirectory (protected "
        "names read-only; `.env*`, `.ipybox` and the state dir hidden): a write through a kernel-made "
        "link to `ipybox.toml` fails; an ask about a path with a link on its way shows the target, "
        "resolved on the host (`→ /ws/ipybox.toml (protected)`)",
    ),
    (
        "servers registered over MCP",
        "where kernels are sandboxed: always sandboxed, and bounded by `[sandbox]` (writable only the "
        "workspace, its unprotected top-level directories or its `allowWrite`; `allowedDomains` and "
        "`allowUnixSockets` within the workspace's; its `denyRead`/`denyWrite` kept); beyond that always "
        "asked with the policy shown, even under an allow rule, and refused when nobody can answer",
    ),
    (
        "files over MCP (`upload_file`, `download_file`)",
        "only where the workspace's sandboxed kernels may write (inside an existing top-level directory; "
        "not `denyWrite` or what the host executes) or read (not `denyRead`); never a `..` part, a hidden"
        " name or a protected one at any depth; never through a symlink (refused before the call is "
        "decided, and reached with `O_NOFOLLOW`, so a link planted meanwhile is refused too); written "
        "atomically; at most 2 MiB; decided by the rules as `ipybox.upload_file`/`ipybox.download_file` "
        "(path and size, never the content) before anything is read or written",
    ),
    (
        "MCP 2026-07-28 handles and asks",
        "a kernel handle and a task id are 128 random bits bound to their caller (the stdio process, or "
        "the endpoint's bearer token): another caller's is unknown; a `requestState` is sealed by the MCP"
        " SDK (AES-GCM, bound to the tool and its arguments, expiring) and names a round of a paused call"
        " of the same caller: a forged, foreign or replayed one resumes nothing; an answer resumes the "
        "cell where it waits, never runs it again",
    ),
    (
        "kernel-written parsers and saved actions",
        "checked in a fresh sandboxed kernel, in the background and bounded, never under the lock that "
        "applies rules or servers: a rule edit applies in well under a second; one whose check times out "
        "is disabled and reported until its content changes; `tools/list` answers from manifests and "
        "never imports; generated modules import parsers lazily with a timeout; a check kernel's `ask` is "
        "refused and reaches nobody",
    ),
    (
        "attached applications, `ipybox exec`",
        "run in the workspace's own kernels (its sandbox, environment, rules) however the workspace is "
        "named (`--workspace`, the current directory, `--working-dir`); `--sandbox` is checked against "
        "the configuration in effect (`ipybox.toml` with `.env` and the environment over it), also when "
        "an edit turns it off later; `execute()` answers no `ask` (the people `[approval] ask` lists do, "
        "else it is denied at once) unless the application passes `execute_accepts_asks=True`; the audit "
        "log records who answered",
    ),
    (
        "text a kernel or server controls",
        "names, arguments, errors, server stderr and output are shown escaped everywhere ipybox prints "
        "them (terminal commands, logs, console pages): no escape sequence (OSC 52 clipboard, title, "
        "clear screen), carriage return, bidi or zero-width character reaches a terminal or page raw; "
        "`ipybox approve` answers only an ask that has been on screen for 0.5 s, by its id, and shows "
        "folded arguments in full on `v`",
    ),
    (
        "approval channel",
        "its own token, which never reaches a kernel; a kernel's token opens only the call channel",
    ),
    (
        "complete outputs and images",
        "complete outputs in a private per-user directory (0700), files 0600 with unpredictable names; "
        "images and tool-result files reached without following symlinks (a link on the path gets nothing "
        "written there), saved under their own extension for image and audio types only and as `.bin` "
        "otherwise; at most `max_output_file_bytes` per cell and `max_image_bytes` per image, past which "
        "the output says what was not saved",
    ),
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
    try:
        path = bwrap_path()  # where the sandbox finds it, which may be off PATH
    except SandboxUnavailableError as e:
        return Check("bubblewrap", False, str(e), True)
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
