"""Errors of the sandbox layer."""


class SandboxUnavailableError(RuntimeError):
    """The sandbox was asked for but this machine can't provide it; the message says what to do.

    ipybox never falls back to running unsandboxed.
    """
