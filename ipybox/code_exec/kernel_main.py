"""Entry point of ipybox's IPython kernels: `python -m ipybox.code_exec.kernel_main -f CONNECTION_FILE`.

The stock `ipykernel_launcher`, minus the debugger: ipykernel imports debugpy at start when it is
installed, which costs about 190 ms of a 500 ms kernel start, and ipybox kernels are never attached to a
debugger. ipykernel treats a missing debugpy as "no debugger".
"""

from __future__ import annotations

import sys


def main() -> None:
    sys.modules.setdefault("debugpy", None)  # type: ignore[arg-type]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
