"""Errors of the sandbox layer."""

from ipybox.errors import IpyboxError


class SandboxUnavailableError(IpyboxError, RuntimeError):
    """The sandbox was asked for but this machine can't provide it; the message says what to do.

    ipybox never falls back to running unsandboxed.
    """
