"""Running kernels (and everything they start) in a sandbox: bubblewrap on Linux, Seatbelt on macOS.

`SandboxPolicy` says what a sandboxed kernel may read, write and reach; `sandboxed_kernel_launch` turns
it into a `SandboxedKernelLaunch`, a command line wrapping the kernel command line it is given (the
kernels layer makes the gateway's kernelspec of it: `ipybox.kernels.kernelspec.sandboxed_kernel_spec`);
`sandboxed_command` does the same for any command, e.g. an MCP server; `DomainProxy` is the way out to
the allowed domains; `check_sandbox` fails closed, with the remedy, when the machine can't sandbox. Each picks the platform's sandbox
([bwrap][ipybox.sandbox.bwrap] or [seatbelt][ipybox.sandbox.seatbelt], which is untested on macOS and
does not support `network.allowedDomains`).
"""

from __future__ import annotations

import importlib

# Not `from typing import ...`: processes that need a small part of the package (the kernel launcher runs
# for every kernel start) would pay for importing typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ipybox.sandbox.errors import SandboxUnavailableError
    from ipybox.sandbox.kernel_launch import SandboxedKernelLaunch
    from ipybox.sandbox.platforms import check_sandbox, sandboxed_command, sandboxed_kernel_launch
    from ipybox.sandbox.policy import SandboxPolicy
    from ipybox.sandbox.proxy import DomainProxy

# Imported on first use: the kernel launcher and the network bridge run `python -m ipybox.sandbox.<x>` for
# every kernel and must not pay for pydantic and the proxy.
_EXPORTS = {
    "DomainProxy": "ipybox.sandbox.proxy",
    "SandboxPolicy": "ipybox.sandbox.policy",
    "SandboxUnavailableError": "ipybox.sandbox.errors",
    "SandboxedKernelLaunch": "ipybox.sandbox.kernel_launch",
    "check_sandbox": "ipybox.sandbox.platforms",
    "sandboxed_command": "ipybox.sandbox.platforms",
    "sandboxed_kernel_launch": "ipybox.sandbox.platforms",
}

__all__ = [
    "DomainProxy",
    "SandboxPolicy",
    "SandboxUnavailableError",
    "SandboxedKernelLaunch",
    "check_sandbox",
    "sandboxed_command",
    "sandboxed_kernel_launch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ipybox.sandbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
