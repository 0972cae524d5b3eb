"""Running kernels (and everything they start) in a sandbox: bubblewrap on Linux, Seatbelt on macOS.

`SandboxPolicy` says what a sandboxed kernel may read, write and reach; `sandboxed_kernel_spec` turns it
into the command line the kernel gateway launches kernels with (`sandboxed_command` does it for any
command, e.g. an MCP server); `DomainProxy` is the way out to the allowed domains; `check_sandbox` fails
closed, with the remedy, when the machine can't sandbox. Each picks the platform's sandbox
([bwrap][ipybox.sandbox.bwrap] or [seatbelt][ipybox.sandbox.seatbelt], which is untested on macOS and
does not support `network.allowedDomains`).
"""

from ipybox.sandbox.errors import SandboxUnavailableError
from ipybox.sandbox.platforms import check_sandbox, sandboxed_command, sandboxed_kernel_spec
from ipybox.sandbox.policy import SandboxPolicy
from ipybox.sandbox.proxy import DomainProxy

__all__ = [
    "DomainProxy",
    "SandboxPolicy",
    "SandboxUnavailableError",
    "check_sandbox",
    "sandboxed_command",
    "sandboxed_kernel_spec",
]
