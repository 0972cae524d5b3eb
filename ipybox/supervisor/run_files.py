"""`RunFiles`: what a running supervisor writes for others into its state directory, and removes.

Contract: `write_state()` writes `state.json` (where the endpoints are, their tokens, whether the workspace
is ready; mode 0600, `ipybox.running.state`) and records the private directories the supervisor made
outside the state directory (`run.json`: its run directory, the gateway's runtime directory), so the next
`up` removes them should this one be killed (SIGKILL) first. `remove_leftovers()` is that removal, run
holding the lock (which proves that no other supervisor of the workspace is alive); `remove_state()`
removes `state.json` when the supervisor stops. Nothing here raises for a file that is already gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import datetime
from pathlib import Path

from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.remote_gateway import RemoteGateway
from ipybox.mcp_apigen.package import remove_stale_work_dirs
from ipybox.running.state import StatePaths, SupervisorState, record_run_dirs, remove_leftovers, write_state
from ipybox.supervisor.mcp_endpoint import MCPEndpoint

logger = logging.getLogger("ipybox.supervisor")


class RunFiles:
    """The state files of one supervisor; see the module docstring."""

    def __init__(self, paths: StatePaths, workspace: Path, started_at: datetime, control_token: str) -> None:
        self.paths = paths
        self.workspace = workspace
        self.started_at = started_at
        self.control_token = control_token
        self.run_dir: Path | None = None  # the supervisor's private directory, once made

    def write_state(
        self, gateway: KernelGateway | RemoteGateway | None, mcp: MCPEndpoint | None, *, ready: bool
    ) -> None:
        if gateway is None or self.run_dir is None:
            raise RuntimeError("state.json is written once the run directory and the kernel gateway exist")
        remote = isinstance(gateway, RemoteGateway)
        if not remote and gateway.unix_socket is None:
            raise RuntimeError("the workspace's kernel gateway listens on a Unix socket")
        ca_file = gateway.endpoint.ca_file if remote else None
        state = SupervisorState(
            pid=os.getpid(),
            workspace=str(self.workspace),
            started_at=self.started_at.isoformat(),
            control_socket=str(self.run_dir / "control.sock"),
            control_token=self.control_token,
            gateway_socket=str(gateway.unix_socket) if not remote else "",
            gateway_token=gateway.token,
            gateway_url=gateway.endpoint.url if remote else None,
            gateway_ca_file=str(ca_file) if ca_file is not None else None,
            log_file=str(self.paths.log),
            mcp_url=mcp.url if mcp is not None else None,
            mcp_token=mcp.token if mcp is not None and mcp.url else None,
            ready=ready,
        )
        write_state(self.paths, state)
        self.record_dirs(gateway)  # a new gateway has a new runtime directory

    def record_dirs(self, gateway: KernelGateway | RemoteGateway | None) -> None:
        gateway_dir = gateway.runtime_dir if gateway is not None else None
        dirs = [d for d in (self.run_dir, gateway_dir) if d is not None]
        record_run_dirs(self.paths, dirs)

    def remove_leftovers(self, mcptools: Path) -> None:
        """Remove what a killed supervisor of this workspace left behind: its private directories (as
        `run.json` names them), its `state.json`, and half-written tool packages in `mcptools`."""
        removed = remove_leftovers(self.paths)
        try:
            removed += [str(mcptools / name) for name in remove_stale_work_dirs(mcptools)]
        except OSError as e:  # a symlink planted there: generating refuses it, with the same message
            logger.warning("not cleaning %s: %s", mcptools, e)
        if removed:
            logger.info("removed what a supervisor killed before it could stop left: %s", ", ".join(removed))

    def remove_state(self) -> None:
        with contextlib.suppress(OSError):
            self.paths.state.unlink(missing_ok=True)
