"""The bubblewrap command line a sandboxed kernel is started with, and the check that it can run here.

The kernel gateway stays on the host and drives the kernel over ZMQ `ipc://` sockets in a directory
bind-mounted into the sandbox; the kernel reaches the tool server through its Unix socket, also
bind-mounted. Everything else on the network is gone: the kernel gets its own network namespace, which
has only a loopback interface, and its own PID namespace, so it can neither see nor signal host processes.
Because the sandbox wraps the kernel process, `!` commands and subprocesses are inside it too.

With `network.allowedDomains`, the host's [DomainProxy][ipybox.sandbox.proxy.DomainProxy] socket is
bind-mounted too and the process starts under [netbridge][ipybox.sandbox.netbridge], which makes that
proxy the sandbox's `HTTP(S)_PROXY`: the only way out, and only to those domains.

`tmp_size` bounds the private `/tmp` (and `/dev/shm`) in bytes: see [view][ipybox.sandbox.view]. A kernel's
size travels in its launch plan, so the gateway's in-process command line and the launcher agree.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ipybox.in_kernel.sandbox_hint import SANDBOX_WORKSPACE_ENV
from ipybox.sandbox.container import container_remedy, detect_container
from ipybox.sandbox.errors import SandboxUnavailableError
from ipybox.sandbox.kernel_launch import SandboxedKernelLaunch
from ipybox.sandbox.launch import LAUNCH_MODULE, PLAN_FILE, make_plan
from ipybox.sandbox.policy import SandboxPolicy
from ipybox.sandbox.view import View, mount_args

# Set inside the sandbox (the host's values point to places that are read-only or hidden there).
_SANDBOX_ENV = {"TMPDIR": "/tmp", "IPYTHONDIR": "/tmp/.ipython", "MPLCONFIGDIR": "/tmp/.matplotlib"}


BWRAP_SYSTEM_DIRS = ("/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/sbin")
"""Where distributions install bubblewrap: looked in after `PATH`, which an MCP client or a service manager
may have cut down to a few directories (the sandbox should not depend on who started ipybox)."""


def bwrap_path() -> str:
    """The bubblewrap executable: the first `bwrap` on `PATH`, else in `BWRAP_SYSTEM_DIRS`. The one lookup
    of it: the sandbox and `ipybox doctor` both call this.

    Raises:
        SandboxUnavailableError: Not on Linux, or bubblewrap is not installed.
    """
    if platform.system() != "Linux":
        raise SandboxUnavailableError(
            f"sandbox=True uses bubblewrap, which needs Linux (this is {platform.system()}); "
            "run with sandbox=False, or run ipybox in a Linux container"
        )
    found = shutil.which("bwrap") or shutil.which("bwrap", path=os.pathsep.join(BWRAP_SYSTEM_DIRS))
    if found is None:
        raise SandboxUnavailableError(
            f"sandbox=True needs bubblewrap, which is not installed (looked on PATH and in "
            f"{', '.join(BWRAP_SYSTEM_DIRS)}): install it "
            "(Debian/Ubuntu: 'sudo apt-get install bubblewrap'; Fedora: 'sudo dnf install bubblewrap')"
        )
    return found


@functools.cache
def check_sandbox() -> str:
    """Check once per process that bubblewrap can create the namespaces a kernel sandbox needs.

    Returns:
        The bubblewrap executable.

    Raises:
        SandboxUnavailableError: It can't, with the reason and the remedy.
    """
    bwrap = bwrap_path()
    probe = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    probe += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--cap-drop", "ALL", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailableError(f"bubblewrap ({bwrap}) could not be run: {e}") from None
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        if "disable-userns" in reason:
            raise SandboxUnavailableError(
                f"bubblewrap ({bwrap}) is too old: ipybox needs 0.8 or newer (--disable-userns keeps code in "
                "the sandbox from creating user namespaces of its own); install a newer bubblewrap"
            )
        if (container := detect_container()) is not None:
            raise SandboxUnavailableError(
                f"bubblewrap cannot create a sandbox here ({reason}): {container_remedy(container)}"
            )
        raise SandboxUnavailableError(
            f"bubblewrap cannot create a sandbox here ({reason}). Unprivileged user namespaces are "
            "probably disabled: allow them (e.g. 'sudo sysctl kernel.unprivileged_userns_clone=1', or on "
            "Ubuntu 23.10+ 'sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0'), or in a container "
            "run it with user namespaces allowed; `ipybox doctor` shows what this machine supports"
        )
    return bwrap


def bwrap_args(
    policy: SandboxPolicy,
    workspace: Path,
    *,
    writable: Sequence[Path] = (),
    readable: Sequence[Path] = (),
    home: Path | None = None,
    tmp_size: int | None = None,
) -> list[str]:
    """bubblewrap options (without the executable and the command) for a process confined by `policy`.

    Args:
        policy: The sandbox policy.
        workspace: The working directory, writable (but for its protected names).
        writable: More paths to bind read-write at the same path (e.g. the kernel's ipc dir).
        readable: Paths under `/tmp` to bind read-only (the private `/tmp` hides them otherwise).
        home: The home directory `~` in the policy stands for (default: the current user's).
        tmp_size: The private `/tmp`'s size in bytes (None: no limit of its own).

    Raises:
        ValueError: `tmp_size` is not a whole number of bytes above zero.
    """
    view = bwrap_view(policy, workspace, writable=writable, readable=readable, home=home, tmp_size=tmp_size)
    return [*NAMESPACE_ARGS, *mount_args(view), *environment_args(workspace)]


# --disable-userns (bubblewrap >= 0.8): for a non-root user, code inside could otherwise make nested user
# namespaces (`unshare -r`) and be root in them.
NAMESPACE_ARGS = (
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
)


def bwrap_view(
    policy: SandboxPolicy,
    workspace: Path,
    *,
    writable: Sequence[Path] = (),
    readable: Sequence[Path] = (),
    home: Path | None = None,
    tmp_size: int | None = None,
) -> View:
    """The filesystem view of a process confined by `policy` (mounted by [view][ipybox.sandbox.view]),
    with a private `/tmp` of `tmp_size` bytes (None: no limit of its own).

    Raises:
        ValueError: `tmp_size` is not a whole number of bytes above zero.
    """
    # The private /tmp would hide an interpreter or a checkout that lives under /tmp: keep them visible.
    readable = [*_python_dirs_under_tmp(), *readable]
    view = policy.view(workspace, home or Path.home(), writable=writable, readable=readable)
    view.tmp_size = tmp_size
    return view


def environment_args(workspace: Path) -> list[str]:
    """The environment and working directory inside the sandbox."""
    # ipykernel exits when the pid in JPY_PARENT_PID (the gateway, outside the PID namespace) is gone.
    args = ["--unsetenv", "JPY_PARENT_PID"]
    for key, value in {**_SANDBOX_ENV, SANDBOX_WORKSPACE_ENV: str(workspace)}.items():
        args += ["--setenv", key, value]
    return [*args, "--chdir", str(workspace)]


def _python_dirs_under_tmp() -> list[Path]:
    candidates = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent}
    candidates.update(Path(entry) for entry in sys.path if entry)
    tmp = Path("/tmp")
    # Strictly below /tmp: a script run from /tmp itself puts /tmp on sys.path, and the sandbox's /tmp
    # must stay its own.
    found = {
        path.resolve()
        for path in candidates
        if path.is_dir() and path.resolve().is_relative_to(tmp) and path.resolve() != tmp
    }
    # Outermost first, and only those not inside another one.
    ordered = sorted(found, key=lambda path: len(path.parts))
    return [path for i, path in enumerate(ordered) if not any(path.is_relative_to(p) for p in ordered[:i])]


def sandboxed_command(
    command: Sequence[str],
    policy: SandboxPolicy,
    workspace: Path,
    *,
    proxy_socket: Path | None = None,
    writable: Sequence[Path] = (),
    readable: Sequence[Path] = (),
    home: Path | None = None,
    tmp_size: int | None = None,
) -> list[str]:
    """The command line that runs `command` inside bubblewrap, confined by `policy`.

    Args:
        command: What to run in the sandbox.
        policy: The sandbox policy.
        workspace: The working directory (writable).
        proxy_socket: The Unix socket of the [DomainProxy][ipybox.sandbox.proxy.DomainProxy] serving
            `policy.network`; required when the policy allows domains.
        writable: More directories to bind read-write.
        readable: More directories under `/tmp` to keep visible, read-only.
        home: What `~` in the policy stands for.
        tmp_size: The private `/tmp`'s size in bytes (None: no limit of its own).

    Raises:
        SandboxUnavailableError: bubblewrap is missing or can't create namespaces here.
        ValueError: The policy allows domains but no proxy socket was given, or `tmp_size` is not a
            whole number of bytes above zero.
    """
    bwrap = check_sandbox()
    readable = list(readable)
    prefix: list[str] = []
    # `unknown = "ask"` without domains needs the proxy only where one asks (a workspace's kernels): without
    # its socket, the sandbox has no network, as with "deny".
    if policy.network.allowed_domains or (policy.network.unknown == "ask" and proxy_socket is not None):
        if proxy_socket is None:
            raise ValueError("network.allowedDomains needs a DomainProxy: pass its proxy_socket")
        readable.append(proxy_socket.parent)
        prefix = [sys.executable, "-m", "ipybox.sandbox.netbridge", str(proxy_socket), "--"]
    args = bwrap_args(
        policy, workspace.resolve(), readable=readable, writable=writable, home=home, tmp_size=tmp_size
    )
    return [bwrap, *args, "--", *prefix, *command]


def sandboxed_kernel_launch(
    kernel_argv: Sequence[str],
    policy: SandboxPolicy,
    workspace: Path,
    *,
    tool_server_dir: Path | None = None,
    tool_socket: Path | None = None,
    proxy_socket: Path | None = None,
    readable: Sequence[Path] = (),
    home: Path | None = None,
    tmp_size: int | None = None,
) -> SandboxedKernelLaunch:
    """How to start the kernel `kernel_argv` inside bubblewrap, confined by `policy`.

    Each kernel starts through [launch][ipybox.sandbox.launch], which builds the sandbox's filesystem
    when that kernel starts (so a `.env` created since is hidden too) and binds only that kernel's own
    connection file and ipc sockets (named in the connection file): the host's other files stay out.

    Args:
        kernel_argv: The kernel's command line, with Jupyter's `{connection_file}`.
        policy: The sandbox policy.
        workspace: The kernels' working directory (writable but for its protected names).
        tool_server_dir: The tool server's socket directory: its call sockets (`*.calls.sock`) are made
            reachable, nothing else in it.
        tool_socket: The tool server's call socket, made reachable (instead of `tool_server_dir`).
        proxy_socket: The [DomainProxy][ipybox.sandbox.proxy.DomainProxy] socket, when the policy allows
            domains.
        readable: More paths under `/tmp` to keep visible, read-only (the proxy's trust bundle).
        home: What `~` in the policy stands for.
        tmp_size: Each kernel's private `/tmp` size in bytes (None: no limit of its own); it is part of
            the plan.

    Raises:
        SandboxUnavailableError: bubblewrap is missing or can't create namespaces here.
        ValueError: The policy allows domains but no proxy socket was given, or `tmp_size` is not a
            whole number of bytes above zero.
    """
    bwrap = check_sandbox()
    readable = list(readable)
    if tool_socket is not None:
        readable.append(tool_socket)
    if tool_server_dir is not None:
        readable += sorted(tool_server_dir.glob("*.calls.sock"))
    prefix: list[str] = []
    # `unknown = "ask"` without domains needs the proxy only where one asks (a workspace's kernels): without
    # its socket, the sandbox has no network, as with "deny".
    if policy.network.allowed_domains or (policy.network.unknown == "ask" and proxy_socket is not None):
        if proxy_socket is None:
            raise ValueError("network.allowedDomains needs a DomainProxy: pass its proxy_socket")
        readable.append(proxy_socket.parent)
        prefix = [sys.executable, "-m", "ipybox.sandbox.netbridge", str(proxy_socket), "--"]
    workspace = workspace.resolve()
    view = bwrap_view(policy, workspace, readable=readable, home=home, tmp_size=tmp_size)
    plan = make_plan(bwrap, list(NAMESPACE_ARGS), view, environment_args(workspace), prefix)
    argv = (
        sys.executable,
        "-P",  # runs on the host, in the workspace: nothing there may shadow its imports
        "-m",
        LAUNCH_MODULE,
        f"{{resource_dir}}/{PLAN_FILE}",
        "{connection_file}",
        "--",
        *kernel_argv,
    )
    # The default SIGINT would reach bwrap, not the kernel: interrupt with a control message instead.
    return SandboxedKernelLaunch(argv, interrupt_mode="message", resources={PLAN_FILE: plan})


def sandbox_supported() -> bool:
    """Whether `check_sandbox()` passes (for reports; use `check_sandbox()` to get the reason)."""
    try:
        check_sandbox()
    except SandboxUnavailableError:
        return False
    return True
