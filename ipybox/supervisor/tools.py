"""`ToolsService`: a workspace's tool server (the MCP servers' host side, every call approved by the
workspace's approver), restarted when it dies.

Contract:

- `start()` starts a `ToolServer` on `socket` (a Unix socket in the supervisor's run directory) with the
  approver and the `prepare` hook (which protects what a server executes before it starts), and watches
  it: a tool server that stops while the service runs is stopped for good, a new one is started with the
  servers the workspace had enabled, `on_restart(server)` is awaited (the supervisor points the
  reconciler at the new server and recycles the kernels, which know the old socket and tokens), then
  `restarts` counts one more. A restart that fails is the service's failure (`Service.failure`).
- `server` is the tool server now (`None` before `start()` and after `aclose()`); `add_caller` and
  `remove_caller` issue and revoke a kernel's call token on it.
- `aclose()` stops watching first (the stop is never taken for a crash), then the tool server.

The diagram of the services and what calls what: `docs/design.md`, "Services".
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from ipybox.approval.rule_approver import WorkspaceApprover
from ipybox.codeact.layout import module_roots
from ipybox.config import WorkspaceConfig
from ipybox.config.addresses import split_host_port
from ipybox.lifecycle import Service
from ipybox.mcp_client.params import ServerParams
from ipybox.mcp_client.pool import MCPServers
from ipybox.reconcile.pins import ToolPins
from ipybox.rules.provenance import ProvenanceTracker
from ipybox.tool_server.remote_calls import RemoteCalls
from ipybox.tool_server.tls import load_certificate, workspace_certificate
from ipybox.tool_server.tool_server import ToolServer

logger = logging.getLogger("ipybox.supervisor")

WORKSPACE_ENV = "IPYBOX_WORKSPACE"
"""Set for the MCP servers (and their parameters' `${...}`): the workspace directory."""

Prepare = Callable[[str, ServerParams, bool], Awaitable[ServerParams]]
"""Called before an MCP server starts: its name, parameters and whether secrets are given to it."""


class ToolsService(Service):
    """The tool server, restarted when it dies; see the module docstring.

    Args:
        workspace: The workspace directory.
        socket: Where the tool server listens.
        config: The configuration in effect (read at each (re)start).
        approver: Decides every call.
        prepare: The servers' `prepare` hook.
        on_restart: Awaited with the new server after a restart.
        on_failure: Called when a restart fails.
        pins: The workspace's tool pins (`ipybox.lock`), told of every listing of the servers.
    """

    def __init__(
        self,
        workspace: Path,
        socket: Path,
        *,
        config: Callable[[], WorkspaceConfig],
        approver: WorkspaceApprover,
        prepare: Prepare,
        on_restart: Callable[[ToolServer], Awaitable[None]],
        on_failure: Callable[[BaseException], None] | None = None,
        pins: ToolPins | None = None,
    ) -> None:
        super().__init__("tool server", on_failure=on_failure)
        self.pins = pins
        self.workspace = workspace
        self.socket = socket
        self.config = config
        self.approver = approver
        self.prepare = prepare
        self.on_restart = on_restart
        self.server: ToolServer | None = None
        self.restarts = 0
        # Outlives a restarted tool server: a restart must clear no session's taint.
        self.provenance = ProvenanceTracker()  # configured by the reconciler (`provenance_changed`)

    @property
    def calls_address(self) -> str:
        """Where kernels send their tool calls."""
        return self.running_server().calls_address

    def add_caller(self, caller: str) -> str:
        """A new call token for `caller` (a kernel)."""
        return self.running_server().add_caller(caller)

    def remove_caller(self, token: str) -> None:
        if self.server is not None:
            self.server.remove_caller(token)

    def running_server(self) -> ToolServer:
        """The tool server now.

        Raises:
            RuntimeError: The service is not running (before `start()`, after `aclose()`).
        """
        if self.server is None:
            raise RuntimeError(f"the tool server is {self.state.value}")
        return self.server

    async def _startup(self) -> None:
        self.server = await self._new_server(restart=False)
        self.spawn(self._watch(), name="ipybox-tool-server-watch")

    async def _shutdown(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            with contextlib.suppress(Exception):
                await server.stop()

    async def _new_server(self, *, restart: bool) -> ToolServer:
        config = self.config()
        servers = MCPServers(
            # Server parameters may say where the workspace is, e.g. a data file's absolute path.
            environ={**os.environ, WORKSPACE_ENV: str(self.workspace)},
            dotenv_path=self.workspace / ".env",
            prepare=self.prepare,
        )
        if self.pins is not None:  # every listing, also of a server restarted by a call, meets its pins
            servers.on_listed = self.pins.on_listed
            servers.tool_gate = self.pins.gate
        remote = config.kernel.gateway is not None
        server = ToolServer(
            servers=servers,
            unix_socket=self.socket,
            media_dir=config.resolve(config.workspace.images_dir),
            max_image_bytes=config.kernel.max_image_bytes,
            approver=self.approver,
            # Kernels of a remote gateway share no files: they call over TLS and import from here.
            module_roots=module_roots(config.resolve(config.workspace.mcptools_dir)) if remote else None,
            remote=self._remote_calls(config) if remote else None,
            provenance=self.provenance,
        )
        if restart:  # the servers the reconciler registered on the one that died
            for name in config.enabled_servers():
                server.servers.register(name, config.server_params(name))
        await server.start()
        return server

    def _remote_calls(self, config: WorkspaceConfig) -> RemoteCalls:
        """Where remote kernels' calls are listened for (`[endpoints.calls]`), with the user's certificate
        or the workspace's own (in the state directory, made for the advertised host)."""
        calls = config.endpoints.calls
        if calls.cert is not None and calls.key is not None:
            certificate = load_certificate(config.resolve(calls.cert), config.resolve(calls.key))
        else:
            host = split_host_port(calls.advertise or calls.bind, "[endpoints.calls]")[0]
            tls_dir = config.resolve(config.workspace.state_dir) / "tls"
            certificate = workspace_certificate(tls_dir, host)
        return RemoteCalls(certificate=certificate, bind=calls.bind, advertise=calls.advertise)

    def remote_address(self) -> str:
        """Where kernels of a remote gateway send their tool calls (`tls://HOST:PORT`)."""
        return self.running_server().remote_address

    def remote_certificate_pem(self) -> str:
        """The certificate kernels of a remote gateway pin."""
        return self.running_server().remote_certificate_pem

    async def _watch(self) -> None:
        while True:
            server = self.running_server()
            await server.join()
            logger.error("the tool server stopped: restarting it")
            with contextlib.suppress(Exception):
                await server.stop()
            self.server = await self._new_server(restart=True)
            await self.on_restart(self.server)
            self.restarts += 1
