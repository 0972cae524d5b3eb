"""Entry point of ipybox's IPython kernels: `python -m ipybox.in_kernel.kernel_main -f CONNECTION_FILE`.

The stock `ipykernel_launcher`, minus the debugger: ipykernel imports debugpy at start when it is
installed, which costs about 190 ms of a 500 ms kernel start, and ipybox kernels are never attached to a
debugger. ipykernel treats a missing debugpy as "no debugger".

When `IPYBOX_MCPTOOLS_DIR` is set, the kernel also loads the `mcptools_refresh` extension, so packages
generated under that directory after the kernel started are imported fresh by the next cell. In a
sandbox (`IPYBOX_SANDBOX_WORKSPACE` set) it loads `sandbox_hint`, which explains writes the sandbox refuses.
"""

from __future__ import annotations

import os
import sys

from ipybox.in_kernel import sandbox_hint
from ipybox.in_kernel.mcptools_refresh import EXTENSION, MCPTOOLS_DIR_ENV


def main() -> None:
    sys.modules.setdefault("debugpy", None)  # type: ignore[arg-type]
    from ipykernel import kernelapp

    argv = sys.argv[1:]
    if os.environ.get(MCPTOOLS_DIR_ENV):
        # `extra_extensions` is IPython's list for extensions added on the command line: it is loaded once
        # the shell exists, next to (not instead of) the `extensions` of the user's profile.
        argv.append(f"--IPKernelApp.extra_extensions={EXTENSION}")
    if os.environ.get(sandbox_hint.SANDBOX_WORKSPACE_ENV):
        argv.append(f"--IPKernelApp.extra_extensions={sandbox_hint.EXTENSION}")
    kernelapp.launch_new_instance(argv)


if __name__ == "__main__":
    main()
