"""Entry point of ipybox's IPython kernels: `python -m ipybox.in_kernel.kernel_main -f CONNECTION_FILE`.

The stock `ipykernel_launcher`, minus the debugger: ipykernel imports debugpy at start when it is
installed, which costs about 190 ms of a 500 ms kernel start, and ipybox kernels are never attached to a
debugger. ipykernel treats a missing debugpy as "no debugger".

When `IPYBOX_MCPTOOLS_DIR` is set, the kernel also loads the `mcptools_refresh` extension, so packages
generated under that directory after the kernel started are imported fresh by the next cell. In a
sandbox (`IPYBOX_SANDBOX_WORKSPACE` set) it loads `sandbox_hint`, which explains writes the sandbox refuses.
With `IPYBOX_SHELL_APPROVAL` set it loads `shell_approval` (shell commands ask first) and makes any extension
that fails to load stop the kernel: a kernel whose shell commands were to be approved must not start
without that guard (fail closed). With `IPYBOX_CWD_RESET` set it loads `working_dir` (each cell starts in
that directory). Without these variables nothing more is imported than before (the modules read here are
standard-library-only and tiny).
"""

from __future__ import annotations

import os
import sys

from ipybox.in_kernel import sandbox_hint, shell_approval, working_dir
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
    if os.environ.get(working_dir.CWD_RESET_ENV):
        argv.append(f"--IPKernelApp.extra_extensions={working_dir.EXTENSION}")
    if os.environ.get(shell_approval.SHELL_APPROVAL_ENV):
        # IPython logs a failed extension and carries on by default; this one must not be skipped.
        argv.append(f"--IPKernelApp.extra_extensions={shell_approval.EXTENSION}")
        argv.append("--IPKernelApp.reraise_ipython_extension_failures=True")
    kernelapp.launch_new_instance(argv)


if __name__ == "__main__":
    main()
