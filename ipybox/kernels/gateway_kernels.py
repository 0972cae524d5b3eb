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

It starts each kernel inside its limits when the gateway has some (`limits_plan`, written by
[KernelGateway][ipybox.kernels.gateway.KernelGateway]): the kernel's own control group is made before
it starts and its command line joins it ([Limited][ipybox.limits.limiter.Limited]); when the kernel is
shut down, whatever is left in its group is killed and the group removed. `ipybox_report()` is what the
gateway's kernel models tell about the kernel (`"ipybox"`: mechanism, limits, usage; see
[gateway_main][ipybox.kernels.gateway_main]).

Imported only inside the gateway process (the gateway's config names this class).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any

from kernel_gateway.services.kernels.manager import KernelGatewayIOLoopKernelManager
from traitlets import Unicode

from ipybox.limits.limiter import Limited, Limiter
from ipybox.limits.usage import tree_usage
from ipybox.sandbox.launch import LAUNCH_MODULE, command_line

# Usage read from /proc (kernels without a control group) walks every process: about 5 ms with 90
# processes. Models are asked for often (a starting kernel's client polls its model), so it is kept this long.
_TREE_USAGE_TTL = 2.0
_limiters: dict[str, Limiter] = {}


def _limiter(plan: str) -> Limiter:
    if plan not in _limiters:
        with open(plan) as f:
            _limiters[plan] = Limiter.from_json(json.load(f))
    return _limiters[plan]


class PrivateIpcKernelManager(KernelGatewayIOLoopKernelManager):  # type: ignore[misc]
    """A kernel manager whose ipc sockets live in `<ipc_root>/<random>/`."""

    ipc_root = Unicode("", config=True, help="Directory under which each kernel gets its socket directory.")
    limits_plan = Unicode("", config=True, help="The Limiter (JSON) kernels start under; empty: none.")

    _ipc_dir: str | None = None
    _limited: Limited | None = None
    _usage_cache: tuple[float, dict[str, Any]] | None = None

    async def _async_pre_start_kernel(self, **kwargs: Any) -> Any:
        # A restart reuses the directory (and the connection file naming it).
        if self.transport == "ipc" and self.ipc_root and self._ipc_dir is None:
            self._ipc_dir = tempfile.mkdtemp(prefix="k-", dir=self.ipc_root)
            self.ip = os.path.join(self._ipc_dir, "s")
        if self.limits_plan and self._limited is None:
            # Also kept across a restart: the group's counters say why the kernel died.
            self._limited = _limiter(self.limits_plan).start(
                self.kernel_id or os.path.basename(self._ipc_dir or "k")
            )
        return await super()._async_pre_start_kernel(**kwargs)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart and self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None
        if not restart and self._limited is not None:
            self._limited.release()
            self._limited = None

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd: list[str] = super().format_kernel_cmd(extra_arguments)
        # [python, -P, -m, ipybox.sandbox.launch, PLAN, CONNECTION_FILE, --, kernel argv...]
        if cmd[1:4] == ["-P", "-m", LAUNCH_MODULE] and len(cmd) > 6 and cmd[6] == "--":
            with open(cmd[4]) as f:
                plan = json.load(f)
            kernel = cmd[7:]
            if self._limited is not None:
                kernel = self._limited.limiter.sandbox_argv(kernel)
            cmd = command_line(plan, cmd[5], kernel)
            sandboxed = True
        else:
            sandboxed = False
        if self._limited is not None:
            cmd = self._limited.argv(cmd, sandboxed=sandboxed)
        return cmd

    def ipybox_report(self) -> dict[str, Any]:
        """What this kernel may use and uses: `{"mechanism", "limits", "usage"}` (`Limited.report`; without
        limits, `mechanism` is `None` and usage comes from the process tree)."""
        pid = getattr(getattr(self.provisioner, "process", None), "pid", None)
        if self._limited is not None:
            return self._limited.report(pid)
        now = time.monotonic()
        if self._usage_cache is None or now - self._usage_cache[0] > _TREE_USAGE_TTL:
            usage = tree_usage(pid).as_json() if pid is not None else {}
            self._usage_cache = (now, {"mechanism": None, "limits": {}, "usage": usage})
        return self._usage_cache[1]
