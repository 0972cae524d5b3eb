"""Which kernel a connection to the workspace's network proxy comes from, to route an ask about an unknown
host as that kernel's tool-call asks are (`WorkspaceApprover.ask_host`).

A sandboxed kernel reaches the proxy through its bridge (`python -m ipybox.sandbox.netbridge SOCKET --
kernel...`), a process started with the kernel's environment, which holds the kernel's tool-call token
(`TOKEN_ENV`, one per kernel: `KernelsService`). The proxy reads the connecting process's id from the
socket's peer credentials (`HostQuestion.client_pid`); `caller_of_client` reads that process's environment
(`/proc/<pid>/environ`: same user, so readable) and maps the token to its caller, when a lease holds the
caller's kernel.

Contract: attribution selects who is asked, never whether, and never grants anything. Code in a sandbox
can connect to the socket directly and rewrite its own environment, but it holds only its own kernel's
token: a token the table doesn't know, a process that is gone or unreadable, or a caller no lease holds,
gives `None` (the people are asked), and a kernel can at most route its asks to its own application.
"""

from __future__ import annotations

from pathlib import Path

from ipybox.in_kernel.call_protocol import TOKEN_ENV
from ipybox.supervisor.leases import LeaseTable

__all__ = ["caller_of_client", "environ_token"]

_ENVIRON_LIMIT = 1024 * 1024  # a process's environment is at most a few hundred KiB (ARG_MAX)


def environ_token(pid: int, proc: Path = Path("/proc")) -> str | None:
    """`TOKEN_ENV`'s value in the environment process `pid` was started with, or `None` (no such variable,
    no such process, not readable)."""
    try:
        with open(proc / str(pid) / "environ", "rb") as f:
            data = f.read(_ENVIRON_LIMIT)
    except OSError:
        return None
    prefix = TOKEN_ENV.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            try:
                return entry[len(prefix) :].decode("ascii")
            except UnicodeDecodeError:
                return None
    return None


def caller_of_client(leases: LeaseTable, pid: int) -> str | None:
    """The caller of the kernel whose process `pid` connected to the proxy, when a lease holds it; else
    `None` (see the module's contract)."""
    token = environ_token(pid)
    if not token:
        return None
    caller = leases.caller_of_token(token)
    if caller is None or leases.lease_of(caller) is None:
        return None
    return caller
