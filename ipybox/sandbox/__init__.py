"""Running kernels (and everything they start) in a sandbox: bubblewrap on Linux.

`SandboxPolicy` says what a sandboxed kernel may read, write and reach; `sandboxed_kernel_spec` turns it
into the command line the kernel gateway launches kernels with; `check_sandbox` fails closed, with the
remedy, when the machine can't sandbox.
"""

from ipybox.sandbox.bwrap import check_sandbox, sandboxed_kernel_spec
from ipybox.sandbox.errors import SandboxUnavailableError
from ipybox.sandbox.policy import SandboxPolicy

__all__ = ["SandboxPolicy", "SandboxUnavailableError", "check_sandbox", "sandboxed_kernel_spec"]
