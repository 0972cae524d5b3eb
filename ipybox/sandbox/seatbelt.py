"""The macOS sandbox: a kernel (or any command) under `sandbox-exec` with a generated Seatbelt profile.

Status: written against the profile language as Chromium, OpenAI's Codex and Anthropic's sandbox-runtime
use it, and not run here: ipybox is built and tested on Linux, where the tests check the profile text and
the command line but cannot execute `sandbox-exec`.

Seatbelt confines a process by rules on paths and operations in the host's one filesystem, where
bubblewrap gives the process a view of its own. The differences that follow:

- Network: there is no network namespace, so the host's loopback (the kernel gateway's port included)
  would be the sandbox's too. The profile allows no IP traffic at all, loopback included, only Unix
  sockets in the process's own directories (the kernel's ZMQ `ipc` dir, its temp dir) and connections
  to the tool server's socket directory. `network.allowedDomains` would need the
  [DomainProxy][ipybox.sandbox.proxy.DomainProxy] on a loopback TCP port; that is not built, so a
  policy with allowed domains is refused with `SandboxUnavailableError`.
- /tmp: there is no private one. A launcher inside the sandbox makes a temp dir of the process's own
  (under the `temp_dir` its caller gives) and sets TMPDIR to it.
- Processes: host processes are not hidden; signals and process information reach only processes in
  the same sandbox.
- Reading: everything but the hidden paths is readable, the temp files of other processes (in the
  user's TMPDIR and /tmp) included, which a Linux sandbox's private /tmp hides.
- Protected paths are rules, not mounts, so they need not exist: a `.env` written during a session is
  hidden like one that was there at the start, and `ipybox.toml` or `.ipybox/` cannot be created.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from ipybox.sandbox import sbpl
from ipybox.sandbox.errors import SandboxUnavailableError
from ipybox.sandbox.kernel_launch import SandboxedKernelLaunch
from ipybox.sandbox.policy import DEFAULT_DENY_READ, DEFAULT_DENY_WRITE, SandboxPolicy

# Part of macOS (protected by System Integrity Protection): never looked up on PATH.
SANDBOX_EXEC = "/usr/bin/sandbox-exec"
# A directory known only after the command line is made (a kernelspec's runtime dir, filled in when the
# gateway writes it) is named in the profile through this parameter (`sandbox-exec -D`): the command line
# sets it to the caller's placeholder, which is filled in with the rest, and as a parameter its text never
# becomes profile syntax.
RUNTIME_PARAM = "IPYBOX_RUNTIME_DIR"
# Stands for the probe's directory in the profile `check_seatbelt` tries, so the probe covers the
# parameter rules too.
_PROBE_PLACEHOLDER = "{probe_dir}"

# The sysctls Codex's base profile (after Chromium's) allows, enough for Python, Node and the usual tools.
# Not all of them: `kern.procargs2` would show the arguments and environment of every process of the user.
_SYSCTLS = (
    "hw.activecpu",
    "hw.busfrequency_compat",
    "hw.byteorder",
    "hw.cacheconfig",
    "hw.cachelinesize_compat",
    "hw.cpufamily",
    "hw.cpufrequency",
    "hw.cpufrequency_compat",
    "hw.cputype",
    "hw.l1dcachesize_compat",
    "hw.l1icachesize_compat",
    "hw.l2cachesize_compat",
    "hw.l3cachesize_compat",
    "hw.logicalcpu",
    "hw.logicalcpu_max",
    "hw.machine",
    "hw.memsize",
    "hw.model",
    "hw.ncpu",
    "hw.nperflevels",
    "hw.packages",
    "hw.pagesize",
    "hw.pagesize_compat",
    "hw.physicalcpu",
    "hw.physicalcpu_max",
    "hw.tbfrequency_compat",
    "hw.vectorunit",
    "kern.argmax",
    "kern.hostname",
    "kern.maxfilesperproc",
    "kern.maxproc",
    "kern.osproductversion",
    "kern.osrelease",
    "kern.ostype",
    "kern.osvariant_status",
    "kern.osversion",
    "kern.secure_kernel",
    "kern.usrstack64",
    "kern.version",
    "machdep.cpu.brand_string",
    "sysctl.proc_cputype",
    "vm.loadavg",
)
_SYSCTL_PREFIXES = ("hw.optional.", "hw.perflevel", "kern.proc.pgrp.", "kern.proc.pid.", "machdep.cpu.")
_MACH_SERVICES = (
    "com.apple.system.opendirectoryd.libinfo",  # user and group lookups (pwd, grp, getpass)
    "com.apple.system.opendirectoryd.membership",
    "com.apple.system.notification_center",  # libnotify: time zone changes for localtime()
    "com.apple.logd",  # os_log, which system libraries write to
    "com.apple.system.logger",
)
# Devices a process writes to. /dev/fd/N reopens a descriptor the process already holds, so allowing it
# grants nothing the descriptor does not.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/tty", "/dev/dtracehelper")
_FD_DEVICE = sbpl.regex("^/dev/fd/[0-9]+$")

# Runs in the sandbox before the command: makes the process's own temp dir under BASE, the one directory
# outside the workspace the profile lets it write, and points TMPDIR and IPython's and Matplotlib's
# config dirs there (the host's are not writable). `exec` keeps the pid, so signals reach the command.
_LAUNCHER = """\
base=$1 workdir=$2
shift 2
cd -- "$workdir" || exit 1
/bin/mkdir -m 700 -- "$base" 2>/dev/null || [ -d "$base" ] || exit 1
TMPDIR=$(/usr/bin/mktemp -d "$base/XXXXXXXX") || exit 1
export TMPDIR IPYTHONDIR="$TMPDIR/.ipython" MPLCONFIGDIR="$TMPDIR/.matplotlib"
exec "$@"
"""
_PLACEHOLDER = re.compile(r"\{[A-Za-z0-9_]+\}")

_BASE_RULES = [
    "(version 1)",
    "(deny default)",
    "",
    "; Processes: the command and what it starts, all in this sandbox (children inherit it)",
    "(allow process-exec)",
    "(allow process-fork)",
    "(allow process-info* (target same-sandbox))",
    "(allow signal (target same-sandbox))",
    # dyld maps libraries and Python's extension modules executable: an operation apart from file-read*.
    "(allow file-map-executable)",
    *sbpl.rule(
        "allow",
        "sysctl-read",
        [
            *(f"(sysctl-name {sbpl.string(name)})" for name in _SYSCTLS),
            *(f"(sysctl-name-prefix {sbpl.string(prefix)})" for prefix in _SYSCTL_PREFIXES),
        ],
    ),
    *sbpl.rule("allow", "mach-lookup", (f"(global-name {sbpl.string(name)})" for name in _MACH_SERVICES)),
    # Named semaphores back multiprocessing's locks and queues. POSIX shared memory is not allowed: its
    # names are shared with every process of the user.
    "(allow ipc-posix-sem)",
    *sbpl.rule("allow", "file-ioctl", (sbpl.literal(device) for device in _DEVICES)),
]


@functools.cache
def check_seatbelt() -> str:
    """Check once per process that `sandbox-exec` can apply ipybox's profile here.

    The probe runs `/usr/bin/true` under a profile of the default policy, so a profile this macOS
    can't compile fails here, with the reason, rather than at the first kernel start.

    Returns:
        The `sandbox-exec` executable.

    Raises:
        SandboxUnavailableError: Not on macOS, `sandbox-exec` is missing, or it can't sandbox this process.
    """
    if platform.system() != "Darwin":
        raise SandboxUnavailableError(f"sandbox-exec needs macOS (this is {platform.system()})")
    if not os.access(SANDBOX_EXEC, os.X_OK):
        raise SandboxUnavailableError(
            f"sandbox=True on macOS needs {SANDBOX_EXEC}, which is part of macOS but missing here: "
            "run with sandbox=False, or in a Linux VM or container"
        )
    with tempfile.TemporaryDirectory(prefix="ipybox-seatbelt-") as probe_dir:
        runtime = Path(_PROBE_PLACEHOLDER)
        profile = seatbelt_profile(
            SandboxPolicy(),
            Path(probe_dir),
            temp_dir=runtime / "tmp",
            writable=[runtime / "ipc"],
            sockets=[Path(probe_dir)],
            placeholder=_PROBE_PLACEHOLDER,
        )
        probe = [SANDBOX_EXEC, "-D", f"{RUNTIME_PARAM}={probe_dir}", "-p", profile, "/usr/bin/true"]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SandboxUnavailableError(f"sandbox-exec ({SANDBOX_EXEC}) could not be run: {e}") from None
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        raise SandboxUnavailableError(
            f"sandbox-exec cannot apply ipybox's profile here ({reason}). A process that is already "
            "sandboxed (e.g. inside another tool's sandbox) cannot start a nested one: run ipybox outside "
            "it; `ipybox doctor` shows what this machine supports"
        )
    return SANDBOX_EXEC


def seatbelt_profile(
    policy: SandboxPolicy,
    workspace: Path,
    *,
    temp_dir: Path,
    writable: Sequence[Path] = (),
    sockets: Sequence[Path] = (),
    home: Path | None = None,
    placeholder: str | None = None,
) -> str:
    """The Seatbelt profile (SBPL) that confines a process by `policy`.

    Directories in `temp_dir`, `writable` and `sockets` may start with `placeholder`; the profile then
    reads the directory it stands for from the `IPYBOX_RUNTIME_DIR` parameter.

    Args:
        policy: The sandbox policy.
        workspace: The working directory, writable.
        temp_dir: Where the process's own temp dir is made, writable.
        writable: More writable directories, where the process may also bind Unix sockets.
        sockets: Directories of host Unix sockets the process may connect to (the tool server's).
        home: What `~` in the policy stands for (default: the current user's home).
        placeholder: Text that stands for a directory known only later (see `seatbelt_command`).

    Raises:
        SandboxUnavailableError: A path has a character no profile can hold.
    """
    home = home or Path.home()
    real_workspace = workspace.resolve()
    own_dirs = [temp_dir, *writable]
    # Seatbelt matches the resolved path of a file (/tmp/x is /private/tmp/x); a hidden path is named
    # both ways, so a rule holds however the path is spelled.
    deny_read = _with_defaults(
        policy.deny_read_paths(real_workspace, home),
        (*DEFAULT_DENY_READ, *policy.filesystem.deny_read),
        real_workspace,
        home,
    )
    deny_write = _with_defaults(
        policy.deny_write_paths(real_workspace, home),
        (*DEFAULT_DENY_WRITE, *policy.filesystem.deny_write),
        real_workspace,
        home,
    )
    workspaces = list(dict.fromkeys([Path(os.path.abspath(workspace)), real_workspace]))

    lines = [
        *_BASE_RULES,
        "",
        "; Read everything but the hidden paths (denied at the end)",
        "(allow file-read*)",
    ]
    lines += ["", "; Write only the workspace, allowWrite, the process's own dirs and devices"]
    lines += sbpl.rule(
        "allow",
        "file-write*",
        [
            *(
                sbpl.subpath(os.path.realpath(path))
                for path in policy.allow_write_paths(real_workspace, home)
            ),
            *(item for directory in own_dirs for item in _dir_filters(directory, placeholder)),
            *(sbpl.literal(device) for device in _DEVICES),
            _FD_DEVICE,
        ],
    )
    # In SBPL the last rule that matches an operation decides it: Anthropic's sandbox-runtime builds its
    # macOS profiles on that ("Seatbelt is last-match-wins"). Every deny here comes after the allows it
    # narrows, so it also holds where sandbox-runtime found a specific earlier deny beating a later
    # wildcard allow.
    lines += ["", "; Read-only inside the writable dirs: what the host would act on later"]
    lines += sbpl.rule("deny", "file-write*", (item for path in deny_write for item in _path_filters(path)))
    lines += ["", "; Hidden: .env files in the workspace and its parents, credential stores, denyRead"]
    lines += sbpl.rule(
        "deny",
        "file-read* file-write*",
        [
            *(item for path in deny_read for item in _path_filters(path)),
            *(item for directory in _with_parents(workspaces) for item in _dotenv_filters(directory)),
        ],
    )
    # A protected path would be moved out of its rule's reach with its directory (`mv .git g`, edit
    # g/config, `mv g .git`): the directories above protected paths can't be renamed or removed.
    protected = [*deny_read, *deny_write, *(workspace / ".env" for workspace in workspaces)]
    lines += ["", "; The directories above protected paths stay where they are"]
    lines += sbpl.rule("deny", "file-write-unlink", (sbpl.literal(str(d)) for d in _ancestors(protected)))
    lines += ["", *_network_rules(own_dirs, sockets, placeholder)]
    # Hard links and clones (file-link, file-clone) would give a hidden file a second, unhidden name:
    # nothing above allows them, so `deny default` refuses them.
    return "\n".join(lines) + "\n"


def seatbelt_command(
    command: Sequence[str],
    policy: SandboxPolicy,
    workspace: Path,
    *,
    temp_dir: Path,
    writable: Sequence[Path] = (),
    sockets: Sequence[Path] = (),
    home: Path | None = None,
    placeholder: str | None = None,
) -> list[str]:
    """The command line that runs `command` under `sandbox-exec`, confined by `policy`.

    Args:
        command: What to run in the sandbox.
        policy: The sandbox policy; `network.allowedDomains` is not supported on macOS.
        workspace: The working directory (writable).
        temp_dir: Where the process's own temp dir (TMPDIR) is made; it must outlive the process, and
            whoever made it removes it.
        writable: More writable directories.
        sockets: Directories of host Unix sockets the process may connect to.
        home: What `~` in the policy stands for.
        placeholder: Text at the start of directories above that stands for a directory known only
            when the command runs, and is replaced by it in every argument of the command line before
            then (as Jupyter fills in a kernelspec). The profile reads that directory from a parameter
            whose value on the command line is this text, so it is filled in with the rest.

    Raises:
        SandboxUnavailableError: The policy allows domains, or `sandbox-exec` can't sandbox here.
    """
    if policy.network.allowed_domains:
        raise SandboxUnavailableError(
            "network.allowedDomains is not supported by ipybox's macOS sandbox yet (its filtering proxy "
            "reaches Linux sandboxes only): remove it from the policy for no network, or run on Linux"
        )
    sandbox_exec = check_seatbelt()
    profile = seatbelt_profile(
        policy,
        workspace,
        temp_dir=temp_dir,
        writable=writable,
        sockets=sockets,
        home=home,
        placeholder=placeholder,
    )
    params = []
    if any(_starts_with(directory, placeholder) for directory in (temp_dir, *writable, *sockets)):
        params = ["-D", f"{RUNTIME_PARAM}={placeholder}"]
    # sandbox-exec applies the profile to itself (sandbox_init(3): "places the current process into a
    # sandbox") and then executes the command in its place (sandbox-exec(1): "enters a sandbox ... and
    # executes command"; sandbox(7): "New processes inherit the sandbox of their parent"). That is what
    # the man pages say; it has not been observed here.
    launcher = ["/bin/sh", "-c", _LAUNCHER, "ipybox-sandbox", str(temp_dir), str(workspace.resolve())]
    return [sandbox_exec, *params, "-p", profile, *launcher, *command]


def seatbelt_kernel_launch(
    kernel_argv: Sequence[str],
    policy: SandboxPolicy,
    workspace: Path,
    *,
    ipc_dir: Path,
    temp_dir: Path,
    placeholder: str | None = None,
    tool_server_dir: Path | None = None,
    home: Path | None = None,
) -> SandboxedKernelLaunch:
    """How to start the kernel `kernel_argv` under `sandbox-exec`, confined by `policy`.

    Args:
        kernel_argv: The kernel's command line, with Jupyter's `{connection_file}`.
        policy: The sandbox policy; `network.allowedDomains` is not supported on macOS.
        workspace: The kernels' working directory (writable).
        ipc_dir: Where the kernels create their ZMQ `ipc` sockets, writable.
        temp_dir: Where each kernel makes its own temp dir; it must outlive the kernels.
        placeholder: Text at the start of `ipc_dir` and `temp_dir` that is filled in when a kernel
            starts (see `seatbelt_command`).
        tool_server_dir: The directory of the tool server's Unix sockets, made reachable.
        home: What `~` in the policy stands for.

    Raises:
        SandboxUnavailableError: The policy allows domains, `sandbox-exec` can't sandbox here, or a
            protected path's name would be taken for a placeholder.
    """
    argv = seatbelt_command(
        kernel_argv,
        policy,
        workspace,
        temp_dir=temp_dir,
        writable=[ipc_dir],
        sockets=[tool_server_dir] if tool_server_dir is not None else [],
        home=home,
        placeholder=placeholder,
    )
    # Jupyter replaces `{name}` in every argument, and the caller its placeholder, the profile included: a
    # path spelled like either would come out as another path, and its rule would protect nothing.
    profile = argv[argv.index("-p") + 1]
    rewritten = [match.group() for match in _PLACEHOLDER.finditer(profile)]
    if placeholder and placeholder in profile:
        rewritten.append(placeholder)
    if rewritten:
        raise SandboxUnavailableError(
            f"the macOS sandbox cannot protect a path containing {rewritten[0]!r} (it would be "
            "replaced when the kernel starts): rename it, or run with sandbox=False"
        )
    # sandbox-exec and the launcher both exec in place, so the pid the kernel manager started is the
    # kernel's and SIGINT reaches it (bubblewrap forks, which is why Linux kernels interrupt by message).
    return SandboxedKernelLaunch(tuple(argv), interrupt_mode="signal")


def _network_rules(own_dirs: Sequence[Path], sockets: Sequence[Path], placeholder: str | None) -> list[str]:
    own = [item for directory in own_dirs for item in _dir_filters(directory, placeholder)]
    remote = [*own, *(item for directory in sockets for item in _dir_filters(directory, placeholder))]
    lines = ["; Network: none, loopback included; Unix sockets only in the process's own dirs and to"]
    lines += ["; the host sockets named (the tool server's)", "(deny network*)"]
    # socket(AF_UNIX) is `system-socket`; the address is checked on bind() and connect().
    lines.append("(allow system-socket (socket-domain AF_UNIX))")
    lines += [f"(allow network-bind network-inbound (local unix-socket {item}))" for item in own]
    lines += [f"(allow network-outbound (remote unix-socket {item}))" for item in dict.fromkeys(remote)]
    return lines


def _with_defaults(found: list[Path], entries: Iterable[str], workspace: Path, home: Path) -> list[Path]:
    """The existing paths the policy found, and the paths its entries name that don't exist (yet)."""
    return list(
        dict.fromkeys([*found, *(path for entry in entries for path in _named(entry, workspace, home))])
    )


def _named(entry: str, workspace: Path, home: Path) -> list[Path]:
    """The paths a policy entry names. Only the entry is a pattern: `*`, `?` or `[` in the workspace's or
    home's own path are characters (read as a glob, `a[b]/.git/hooks` would name `ab/.git/hooks`)."""
    base, rest = (home, entry[2:]) if entry == "~" or entry.startswith("~/") else (workspace, entry)
    if not any(char in rest for char in "*?["):
        return [base / rest]
    if Path(rest).is_absolute():
        return sorted(Path("/").glob(rest.lstrip("/")))
    return sorted(base.glob(rest))


def _path_filters(path: Path) -> list[str]:
    """Filters for a protected path under each of its spellings: exactly a file, or a directory's subtree
    (also for a path that doesn't exist yet, which may become either)."""
    # os.path.isfile: False, not PermissionError, behind a directory this user can't enter.
    kind = sbpl.literal if os.path.isfile(path) else sbpl.subpath
    return [kind(spelling) for spelling in dict.fromkeys([os.path.abspath(path), os.path.realpath(path)])]


def _starts_with(directory: Path, placeholder: str | None) -> bool:
    return placeholder is not None and str(directory).startswith(placeholder)


def _dir_filters(directory: Path, placeholder: str | None) -> list[str]:
    """Filters for a directory the process writes or reaches sockets in."""
    text = str(directory)
    if placeholder is None or not _starts_with(directory, placeholder):
        return [sbpl.subpath(os.path.realpath(text))]
    # The directory the placeholder stands for is spelled as its maker made it, typically in the temp
    # dir, whose /var is a symlink to /private/var on macOS: allow both spellings (the /private one is
    # nothing for a path that has no symlink, and can't be created there).
    runtime = f"(param {sbpl.string(RUNTIME_PARAM)})"
    rest = sbpl.string(text[len(placeholder) :])
    return [
        f"(subpath (string-append {runtime} {rest}))",
        f'(subpath (string-append "/private" {runtime} {rest}))',
    ]


def _dotenv_filters(directory: Path) -> list[str]:
    """`.env*` in `directory`, whether or not such a file exists yet (and everything under it)."""
    prefix = sbpl.regex_literal(str(directory).rstrip("/"))
    return [sbpl.regex(f"^{prefix}/\\.env[^/]*(/.*)?$")]


def _with_parents(directories: Sequence[Path]) -> list[Path]:
    return list(dict.fromkeys(path for directory in directories for path in (directory, *directory.parents)))


def _ancestors(paths: Iterable[Path]) -> list[Path]:
    spellings = {
        Path(spelling) for path in paths for spelling in (os.path.abspath(path), os.path.realpath(path))
    }
    root = Path("/")
    return sorted({parent for path in spellings for parent in path.parents if parent != root})
