"""The Jupyter kernelspec ipybox's gateway starts kernels from.

A kernelspec is where a kernel's command line is decided, so it is also the seam where a sandbox wraps the
kernel (and, through it, everything the kernel starts).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

KERNEL_NAME = "ipybox"
# Stands for the gateway's private runtime directory in a kernelspec's argv; filled in by `write()`.
RUNTIME_DIR = "{ipybox_runtime_dir}"


def default_kernel_argv(python: str | None = None) -> list[str]:
    """The command line of a plain IPython kernel running on `python` (default: this interpreter)."""
    return [
        python or sys.executable,
        "-m",
        "ipybox.in_kernel.kernel_main",
        "-f",
        "{connection_file}",
        # Output is read by programs: no ANSI colours in tracebacks.
        "--InteractiveShell.colors=nocolor",
        # Kernels come and go (warm spares, resets); an on-disk history would make them contend for one
        # SQLite file in ~/.ipython.
        "--HistoryManager.hist_file=:memory:",
    ]


@dataclass(frozen=True)
class KernelSpec:
    """How the gateway launches a kernel.

    Attributes:
        argv: The kernel's command line, with `{connection_file}` where the connection file goes.
        interrupt_mode: `signal` (SIGINT to the kernel) or `message` (an interrupt request on the control
            channel, needed when the kernel runs under a process that must not receive SIGINT).
        env: Extra environment variables, merged by jupyter_client into the kernel's environment.
        display_name: The name Jupyter shows for it.
        resources: Files to write next to `kernel.json` (`{resource_dir}` in `argv` names that directory).
    """

    argv: list[str] = field(default_factory=default_kernel_argv)
    interrupt_mode: Literal["signal", "message"] = "signal"
    env: dict[str, str] = field(default_factory=dict)
    display_name: str = "Python 3 (ipybox)"
    # Files written next to kernel.json (`{resource_dir}` in the argv names that directory).
    resources: dict[str, str] = field(default_factory=dict)

    def write(self, data_dir: Path, name: str = KERNEL_NAME, runtime_dir: Path | None = None) -> Path:
        """Write `kernels/<name>/kernel.json` under a Jupyter data dir and return its directory.

        `RUNTIME_DIR` in the argv is replaced by `runtime_dir`.
        """
        spec_dir = data_dir / "kernels" / name
        spec_dir.mkdir(parents=True, exist_ok=True)
        argv = self.argv
        if runtime_dir is not None:
            argv = [arg.replace(RUNTIME_DIR, str(runtime_dir)) for arg in argv]
        spec = {
            "argv": argv,
            "display_name": self.display_name,
            "language": "python",
            "interrupt_mode": self.interrupt_mode,
            "env": self.env,
            "metadata": {"debugger": False},
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=2))
        for file_name, content in self.resources.items():
            (spec_dir / file_name).write_text(content)
        return spec_dir
