"""The sandbox of this platform: bubblewrap on Linux, Seatbelt (`sandbox-exec`) on macOS.

The functions here have the signatures of the bubblewrap ones and hand over to the module of the platform
the process runs on; elsewhere they raise `SandboxUnavailableError`, and nothing runs unsandboxed.

A size for the private `/tmp` (`tmp_size`) exists only on Linux: macOS's sandbox has no private `/tmp`, so
there a size is refused (`ValueError`) rather than dropped; callers that check limits first (ipybox's
enforcement check) never get that far.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path

from ipybox.sandbox import bwrap, seatbelt
from ipybox.sandbox.errors import SandboxUnavailableError
from ipybox.sandbox.kernel_launch import SandboxedKernelLaunch
from ipybox.sandbox.policy import SandboxPolicy


def check_sandbox() -> str:
    """Check that this machine can sandbox a process.

    Returns:
        The sandboxing executable (`bwrap` or `sandbox-exec`).

    Raises:
        SandboxUnavailableError: It can't, with the reason and the remedy.
    """
    system = platform.system()
    if system == "Linux":
        return bwrap.check_sandbox()
    if system == "Darwin":
        return seatbelt.check_seatbelt()
    raise _unsupported(system)


def sandboxed_command(
    command: Sequence[str],
    policy: SandboxPolicy,
    workspace: Path,
    *,
    proxy_socket: Path | None = None,
    writable: Sequence[Path] = (),
    readable: Sequence[Path] = (),
    home: Path | None = None,
    temp_dir: Path | None = None,
    tmp_size: int | None = None,
) -> list[str]:
    """The command line that runs `command` in this platform's sandbox, confined by `policy`.

    Args:
        command: What to run in the sandbox.
        policy: The sandbox policy.
        workspace: The working directory (writable).
        proxy_socket: The [DomainProxy][ipybox.sandbox.proxy.DomainProxy] socket, when the policy allows
            domains (Linux only: macOS refuses such policies).
        writable: More writable directories.
        readable: Directories under `/tmp` to keep visible (Linux; on macOS all but hidden paths are).
        home: What `~` in the policy stands for.
        temp_dir: A directory for the process's temp files that outlives it; required on macOS, which
            has no private `/tmp` (Linux sandboxes get one and ignore this).
        tmp_size: The private `/tmp`'s size in bytes (Linux only; None: no limit of its own).

    Raises:
        SandboxUnavailableError: This machine can't sandbox, or (macOS) the policy allows domains.
        ValueError: The policy allows domains but no proxy socket was given (Linux), no `temp_dir`
            was given (macOS), or a `tmp_size` was (macOS) or is not a whole number of bytes above zero.
    """
    system = platform.system()
    if system == "Linux":
        return bwrap.sandboxed_command(
            command,
            policy,
            workspace,
            proxy_socket=proxy_socket,
            writable=writable,
            readable=readable,
            home=home,
            tmp_size=tmp_size,
        )
    if system == "Darwin":
        _refuse_tmp_size(tmp_size)
        if temp_dir is None:
            raise ValueError(
                "the macOS sandbox has no private /tmp: pass a temp_dir that outlives the process"
            )
        return seatbelt.seatbelt_command(
            command, policy, workspace, temp_dir=temp_dir, writable=writable, home=home
        )
    raise _unsupported(system)


def sandboxed_kernel_launch(
    kernel_argv: Sequence[str],
    policy: SandboxPolicy,
    workspace: Path,
    *,
    ipc_dir: Path,
    temp_dir: Path,
    placeholder: str | None = None,
    tool_server_dir: Path | None = None,
    tool_socket: Path | None = None,
    proxy_socket: Path | None = None,
    readable: Sequence[Path] = (),
    home: Path | None = None,
    tmp_size: int | None = None,
) -> SandboxedKernelLaunch:
    """How to start the kernel `kernel_argv` in this platform's sandbox, confined by `policy`.

    Args:
        kernel_argv: The kernel's command line, with Jupyter's `{connection_file}`.
        policy: The sandbox policy.
        workspace: The kernels' working directory (writable).
        ipc_dir: Where the kernels create their ZMQ `ipc` sockets (macOS makes it writable; Linux binds
            each kernel's own socket directory, named in its connection file, instead).
        temp_dir: Where each kernel makes its own temp dir (macOS, which has no private `/tmp`; it must
            outlive the kernels). Linux ignores it.
        placeholder: Text at the start of `ipc_dir` and `temp_dir` that stands for a directory known
            only when a kernel starts, and is filled in in every argument of `argv` by then (e.g. a
            kernelspec's runtime-dir placeholder).
        tool_server_dir: The directory of the tool server's Unix sockets, made reachable.
        tool_socket: The tool server's call socket (Linux: only it is made reachable, not its directory).
        proxy_socket: The [DomainProxy][ipybox.sandbox.proxy.DomainProxy] socket, when the policy allows
            domains (Linux only: macOS refuses such policies).
        readable: More paths under `/tmp` to keep visible, read-only (Linux; on macOS all but hidden paths
            are).
        home: What `~` in the policy stands for.
        tmp_size: Each kernel's private `/tmp` size in bytes (Linux only; None: no limit of its own).

    Raises:
        SandboxUnavailableError: This machine can't sandbox, or (macOS) the policy allows domains.
        ValueError: The policy allows domains but no proxy socket was given (Linux), or a `tmp_size` was
            given (macOS) or is not a whole number of bytes above zero.
    """
    system = platform.system()
    if system == "Linux":
        return bwrap.sandboxed_kernel_launch(
            kernel_argv,
            policy,
            workspace,
            tool_server_dir=tool_server_dir,
            tool_socket=tool_socket,
            proxy_socket=proxy_socket,
            readable=readable,
            home=home,
            tmp_size=tmp_size,
        )
    if system == "Darwin":
        _refuse_tmp_size(tmp_size)
        if tool_server_dir is None and tool_socket is not None:
            tool_server_dir = tool_socket.parent
        return seatbelt.seatbelt_kernel_launch(
            kernel_argv,
            policy,
            workspace,
            ipc_dir=ipc_dir,
            temp_dir=temp_dir,
            placeholder=placeholder,
            tool_server_dir=tool_server_dir,
            home=home,
        )
    raise _unsupported(system)


def sandbox_supported() -> bool:
    """Whether `check_sandbox()` passes (for reports; use `check_sandbox()` to get the reason)."""
    try:
        check_sandbox()
    except SandboxUnavailableError:
        return False
    return True


def _refuse_tmp_size(tmp_size: int | None) -> None:
    # A size that can't be applied is an error, never silently unlimited.
    if tmp_size is not None:
        raise ValueError(
            f"a size for the private /tmp ({tmp_size} bytes) needs Linux: the macOS sandbox has no "
            'private /tmp to limit; leave the tmp limit out (or set it to "unlimited") on macOS'
        )


def _unsupported(system: str) -> SandboxUnavailableError:
    return SandboxUnavailableError(
        f"sandbox=True needs Linux (bubblewrap) or macOS (sandbox-exec); this is {system}: "
        "run with sandbox=False, or run ipybox in a Linux container"
    )
