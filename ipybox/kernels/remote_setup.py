"""Setting up a kernel of a remote gateway before it is handed out: the host tells it where its tool calls
go and how to import the workspace's generated packages.

A kernel of a remote gateway (Jupyter Enterprise Gateway) shares no files with this machine and starts from
a kernel spec that is not ipybox's: nothing of ipybox runs in it until the host says so. Right after it
answers, `set_up()` runs one *silent* execution in it (no execution count, no history, nothing in the
user's namespace): `ipybox.in_kernel.remote.install(<json>)`, which

- sets the call channel's address (`tls://HOST:PORT`), the certificate the kernel pins, and the kernel's own
  call token in its environment (the token never travels in the kernel start request, which the gateway
  may log or write into a pod spec);
- installs the import hook that loads `mcptools` / `gentools` / `mcpparse` from the tool server;
- loads the shell-approval extension when the workspace approves shell commands, and moves to the working
  directory;
- sets `[kernel] env` (placeholders filled on this machine).

Contract: a kernel whose set-up fails is never handed out (the caller deletes it; fail closed: a kernel
whose shell commands were to be approved must not run without that guard). The error says what the kernel
answered, e.g. that ipybox is not installed in its image.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from ipybox.in_kernel.remote import PROTOCOL
from ipybox.kernels.kernel_connection import KernelConnection, KernelStartError
from ipybox.kernels.warm_up import silent_execution

SETUP_TIMEOUT = 30.0
"""Seconds the set-up may take (it imports a few standard-library modules and ipybox's in-kernel part)."""


class KernelSetupError(KernelStartError):
    """A remote kernel could not be set up (see `set_up`); it is not handed out.

    Attributes:
        missing_ipybox: The kernel's Python has no ipybox (its image lacks it), rather than a set-up that
            failed.
    """

    def __init__(self, message: str, *, missing_ipybox: bool = False) -> None:
        super().__init__(message)
        self.missing_ipybox = missing_ipybox


@dataclass(frozen=True)
class RemoteKernelSetup:
    """What every remote kernel of a workspace (or executor) is told, but its token.

    Attributes:
        calls_address: Where it sends tool calls: `tls://HOST:PORT` (the advertised address).
        certificate_pem: The call channel's certificate, which the kernel pins.
        module_roots: The host paths of the generated packages it imports from the tool server, by top-level
            name (`mcptools`, `gentools`, `mcpparse`).
        env: `[kernel] env`, placeholders filled.
        shell_approval: Load the shell-approval extension (`!cmd` asks first).
        working_dir: The directory each cell starts in, inside the kernel (`None`: where it started).
    """

    calls_address: str
    certificate_pem: str
    module_roots: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    shell_approval: bool = False
    working_dir: str | None = None

    def payload(self, token: str) -> str:
        """The JSON `ipybox.in_kernel.remote.install()` takes, with the kernel's call `token`."""
        return json.dumps(
            {
                "protocol": PROTOCOL,
                "ipybox": _version(),  # named by the kernel's error when its protocol differs
                "server": self.calls_address,
                "token": token,
                "cert": self.certificate_pem,
                "roots": dict(self.module_roots),
                "env": dict(self.env),
                "extensions": {"shell_approval": self.shell_approval, "cwd": self.working_dir},
            }
        )


def _version() -> str:
    # The installed distribution's (importing the `ipybox` package from this layer would be a cycle).
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ipybox")
    except PackageNotFoundError:
        return "unknown"


# `exec` in a namespace of its own: the user's namespace gets no name.
_INSTALL = "exec('import ipybox.in_kernel.remote as _r\\n_r.install(_payload)', {{'_payload': {payload!r}}})"


async def set_up(kernel: KernelConnection, setup: RemoteKernelSetup, token: str) -> None:
    """Set `kernel` up (see the module docstring) as the kernel whose call token is `token`.

    Raises:
        KernelSetupError: The kernel answered with an error (ipybox missing or of another protocol in its
            image, the shell-approval guard not loading), or not within `SETUP_TIMEOUT`.
        KernelDied: It died meanwhile.
    """
    content = silent_execution(_INSTALL.format(payload=setup.payload(token)))
    try:
        reply = await kernel.request("execute_request", content, timeout=SETUP_TIMEOUT)
    except TimeoutError:
        raise KernelSetupError(
            f"the remote kernel did not finish setting up ipybox within {SETUP_TIMEOUT:g} s"
        ) from None
    if reply.get("status") != "ok":
        name, value = reply.get("ename", "error"), reply.get("evalue", "")
        missing = name in ("ModuleNotFoundError", "ImportError") and "ipybox" in str(value)
        hint = ": install ipybox in the kernel image (its kernel spec's Python), the same version as here"
        raise KernelSetupError(
            f"the remote kernel could not set up ipybox ({name}: {value}){hint if missing else ''}",
            missing_ipybox=missing,
        )
