"""The Jupyter kernelspec ipybox's gateway starts kernels from, plain or sandboxed.

A kernelspec is where a kernel's command line is decided, so it is also the seam where a sandbox wraps the
kernel (and, through it, everything the kernel starts). The sandbox describes the wrapping without knowing
the gateway ([SandboxedKernelLaunch][ipybox.sandbox.kernel_launch.SandboxedKernelLaunch]);
`sandboxed_kernel_spec` fills in what only the gateway knows: the kernel's command line and the layout of
the gateway's private runtime directory (`RUNTIME_DIR` until the kernelspec is written).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ipybox.sandbox.policy import SandboxPolicy

KERNEL_NAME = "ipybox"
# Stands for the gateway's private runtime directory in a kernelspec's argv; filled in by `write()`.
RUNTIME_DIR = "{ipybox_runtime_dir}"
# Under the runtime directory: the gateway's root of the kernels' ipc socket directories (see
# `KernelGateway`), and where kernels sandboxed on macOS, which has no private /tmp, make their temp dirs
# (removed with the runtime directory).
IPC_SUBDIR = "ipc"
SANDBOX_TEMP_SUBDIR = "tmp"


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
        sandboxed: Whether the kernels run in ipybox's sandbox.
        private_tmp: Whether that sandbox gives each kernel a private `/tmp` (whose size a limit can set).
    """

    argv: list[str] = field(default_factory=default_kernel_argv)
    interrupt_mode: Literal["signal", "message"] = "signal"
    env: dict[str, str] = field(default_factory=dict)
    display_name: str = "Python 3 (ipybox)"
    # Files written next to kernel.json (`{resource_dir}` in the argv names that directory).
    resources: dict[str, str] = field(default_factory=dict)
    sandboxed: bool = False
    private_tmp: bool = False

    def write(self, data_dir: Path, name: str = KERNEL_NAME, runtime_dir: Path | None = None) -> Path:
        """Write `kernels/<name>/kernel.json` under a Jupyter data dir and return its directory.

        `RUNTIME_DIR` in the argv is replaced by `runtime_dir`. Each file is replaced whole (written
        aside, then renamed), so a kernel starting while a running gateway's spec is rewritten reads the
        old file or the new one, never half of one.
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
        for file_name, content in {**self.resources, "kernel.json": json.dumps(spec, indent=2)}.items():
            partial = spec_dir / f".{file_name}.new"
            partial.write_text(content)
            os.replace(partial, spec_dir / file_name)
        return spec_dir


def sandboxed_kernel_spec(
    policy: SandboxPolicy,
    workspace: Path,
    *,
    tool_server_dir: Path | None = None,
    tool_socket: Path | None = None,
    proxy_socket: Path | None = None,
    readable: Sequence[Path] = (),
    home: Path | None = None,
    tmp_size: int | None = None,
) -> KernelSpec:
    """A kernelspec whose kernels run in this platform's sandbox, confined by `policy`.

    Args:
        policy: The sandbox policy.
        workspace: The kernels' working directory (writable).
        tool_server_dir: The directory of the tool server's Unix sockets, made reachable.
        tool_socket: The tool server's call socket (Linux: only it is made reachable, not its directory).
        proxy_socket: The [DomainProxy][ipybox.sandbox.proxy.DomainProxy] socket, when the policy allows
            domains (Linux only: macOS refuses such policies).
        readable: More paths kernels may read where they would not (under the private `/tmp`), e.g. the
            trust bundle of the proxy's interception CA.
        home: What `~` in the policy stands for.
        tmp_size: Each kernel's private `/tmp` size in bytes (Linux only; None: no limit of its own).

    Raises:
        SandboxUnavailableError: This machine can't sandbox, or (macOS) the policy allows domains.
        ValueError: The policy allows domains but no proxy socket was given (Linux), or a `tmp_size` was
            given (macOS) or is not a whole number of bytes above zero.
    """
    # Here, not at the top: the sandbox brings pydantic, which a gateway without a sandbox never needs.
    from ipybox.sandbox.platforms import sandboxed_kernel_launch

    runtime = Path(RUNTIME_DIR)
    launch = sandboxed_kernel_launch(
        default_kernel_argv(),
        policy,
        workspace,
        ipc_dir=runtime / IPC_SUBDIR,
        temp_dir=runtime / SANDBOX_TEMP_SUBDIR,
        placeholder=RUNTIME_DIR,
        tool_server_dir=tool_server_dir,
        tool_socket=tool_socket,
        proxy_socket=proxy_socket,
        readable=readable,
        home=home,
        tmp_size=tmp_size,
    )
    return KernelSpec(
        argv=list(launch.argv),
        interrupt_mode=launch.interrupt_mode,
        display_name="Python 3 (ipybox, sandboxed)",
        resources=dict(launch.resources),
        sandboxed=True,
        private_tmp=sys.platform.startswith("linux"),
    )
