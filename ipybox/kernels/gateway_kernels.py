"""`PrivateIpcKernelManager`: the gateway's kernel manager, with every kernel's ZMQ sockets in a
directory of its own.

jupyter_client names a kernel's ipc sockets `<ip>-<n>` and picks each `n` as the first one without a
file yet. With one shared `ip` prefix, two kernels starting together (a spare and a replacement) could be
given the same names before either had bound them, and a dead kernel's clean-up removed files that a new
kernel was using by then. A directory per kernel (0700, random name, removed at shutdown) makes names
private to one kernel, and lets a sandbox bind exactly that kernel's sockets and nothing of the others'.

It also starts sandboxed kernels without a process in between: a kernelspec of
[sandboxed_kernel_spec][ipybox.kernels.kernelspec.sandboxed_kernel_spec] on Linux runs the
[launch][ipybox.sandbox.launch] module, which builds the sandbox for that kernel and execs bubblewrap;
here the same command line is built in the gateway's own process, which saves a Python start (about
40 ms) per kernel.

Imported only inside the gateway process (the gateway's config names this class).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from kernel_gateway.services.kernels.manager import KernelGatewayIOLoopKernelManager
from traitlets import Unicode

from ipybox.sandbox.launch import LAUNCH_MODULE, command_line


class PrivateIpcKernelManager(KernelGatewayIOLoopKernelManager):  # type: ignore[misc]
    """A kernel manager whose ipc sockets live in `<ipc_root>/<random>/`."""

    ipc_root = Unicode("", config=True, help="Directory under which each kernel gets its socket directory.")

    _ipc_dir: str | None = None

    async def _async_pre_start_kernel(self, **kwargs: Any) -> Any:
        # A restart reuses the directory (and the connection file naming it).
        if self.transport == "ipc" and self.ipc_root and self._ipc_dir is None:
            self._ipc_dir = tempfile.mkdtemp(prefix="k-", dir=self.ipc_root)
            self.ip = os.path.join(self._ipc_dir, "s")
        return await super()._async_pre_start_kernel(**kwargs)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart and self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd: list[str] = super().format_kernel_cmd(extra_arguments)
        # [python, -m, ipybox.sandbox.launch, PLAN, CONNECTION_FILE, --, kernel argv...]
        if cmd[1:3] == ["-m", LAUNCH_MODULE] and len(cmd) > 5 and cmd[5] == "--":
            with open(cmd[3]) as f:
                plan = json.load(f)
            return command_line(plan, cmd[4], cmd[6:])
        return cmd
