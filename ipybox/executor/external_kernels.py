"""Kernels of a gateway an embedded `CodeExecutor` does not run (`ExternalGateway`, `kernel_gateway_url=`),
which need share no file with this machine: what the executor adds for them to its own tool server and
kernel client.

- Before anything starts, `check()` asks the gateway whether it answers with the token and offers the
  kernel spec (`RemoteGateway`): one clear error naming `kernel_gateway_url` / `kernel_gateway_token` /
  `ExternalGateway.kernelspec` instead of a failed kernel start later.
- `remote_calls()`: where the tool server also listens for the kernels' calls, TCP with TLS
  (`ipybox.tool_server.remote_calls`), with the user's certificate or one made for the advertised host in
  a private directory (mode 0700) this object owns; `close()` removes it (idempotent).
- `bind(tool_server)`, once the tool server listens: what every kernel is told when it is set up
  (`ipybox.kernels.remote_setup`): the `tls://` address, the pinned certificate, the tool server's call
  token, the generated packages' host paths (imported over the channel) and the kernel environment, less
  what names a host path (kernels import the packages from the tool server and start where the gateway
  starts them).
- A kernel whose Python has no ipybox still runs code (as with ipybox 0.9, whose gateway kernels needed
  ipybox only for tool calls): its set-up's `missing_ipybox` failure is logged once, not raised. Any other
  set-up failure deletes the kernel.
- `request_env`: what a kernel start request carries: the `KERNEL_*` variables of the environment only
  (Enterprise Gateway passes those to its kernel templates), never the call token (a gateway may log its
  requests or write them into a pod spec).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ipybox.codeact.layout import module_roots
from ipybox.executor.kernel_setup import KernelSetup
from ipybox.executor.options import ExternalGateway
from ipybox.in_kernel.call_protocol import SERVER_ENV, TOKEN_ENV
from ipybox.in_kernel.mcptools_refresh import MCPTOOLS_DIR_ENV
from ipybox.in_kernel.working_dir import CWD_RESET_ENV
from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.kernels.kernel_connection import KernelConnection
from ipybox.kernels.remote_gateway import RemoteGateway
from ipybox.kernels.remote_setup import KernelSetupError, RemoteKernelSetup, set_up
from ipybox.tool_server.remote_calls import RemoteCalls, split_host_port
from ipybox.tool_server.tls import load_certificate, workspace_certificate
from ipybox.tool_server.tool_server import ToolServer

__all__ = ["ExternalKernels", "request_env"]

logger = logging.getLogger(__name__)

REQUEST_ENV_PREFIX = "KERNEL_"
# Host paths, meaningless in a kernel that shares no file with this machine, and what the set-up sets.
_HOST_ONLY = (MCPTOOLS_DIR_ENV, CWD_RESET_ENV, SERVER_ENV, TOKEN_ENV)


def request_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` a kernel start request carries: those named `KERNEL_*`."""
    return {name: value for name, value in env.items() if name.startswith(REQUEST_ENV_PREFIX)}


class ExternalKernels:
    """What an embedded executor adds for the kernels of `gateway` (see the module docstring)."""

    def __init__(self, gateway: ExternalGateway, mcptools_dir: Path) -> None:
        self.gateway = gateway
        self.mcptools_dir = mcptools_dir
        self.endpoint = GatewayEndpoint(gateway.url.rstrip("/"), gateway.token, ca_file=gateway.ca_file)
        self.remote = RemoteGateway(
            self.endpoint,
            gateway.kernelspec,
            token_setting="kernel_gateway_token (ExternalGateway.token)",
            kernelspec_setting="ExternalGateway(kernelspec=...) to one it offers",
        )
        self._cert_dir: Path | None = None
        self._setup: RemoteKernelSetup | None = None
        self._token: str | None = None
        self._warned = False  # about kernels without ipybox

    async def check(self) -> None:
        """Check that the gateway answers with the token and offers the kernel spec.

        Raises:
            GatewayStartError: It does not, saying what to change.
        """
        await self.remote.start()

    def remote_calls(self) -> RemoteCalls:
        """Where and with which certificate the tool server listens for the kernels' calls.

        Raises:
            CertificateError: The user's certificate or key can't be used (naming the file).
        """
        g = self.gateway
        if g.calls_cert is not None and g.calls_key is not None:
            certificate = load_certificate(g.calls_cert, g.calls_key)
        else:
            host = split_host_port(g.calls_advertise or g.calls_bind, "calls_advertise")[0]
            if self._cert_dir is None:
                self._cert_dir = Path(tempfile.mkdtemp(prefix="ipybox-calls-tls-"))  # mode 0700
            certificate = workspace_certificate(self._cert_dir, host)
        return RemoteCalls(certificate=certificate, bind=g.calls_bind, advertise=g.calls_advertise)

    def tool_server_roots(self) -> dict[str, Path]:
        """The generated packages the tool server serves to the kernels, by top-level name."""
        return module_roots(self.mcptools_dir)

    def bind(self, tool_server: ToolServer, setup: KernelSetup) -> None:
        """Tell kernels set up from now on about the running `tool_server`, with `setup`'s environment.

        Raises:
            RuntimeError: The tool server does not run, or has no `remote`.
        """
        env = setup.kernel_env(tool_server.calls_address)
        for name in _HOST_ONLY:
            env.pop(name, None)
        self._setup = RemoteKernelSetup(
            calls_address=tool_server.remote_address,
            certificate_pem=tool_server.remote_certificate_pem,
            module_roots={name: str(path) for name, path in self.tool_server_roots().items()},
            env=env,
        )
        self._token = tool_server.call_token

    async def set_up(self, kernel: KernelConnection) -> None:
        """Set `kernel` up (`ipybox.kernels.remote_setup.set_up`) with the tool server's call token.

        Raises:
            KernelSetupError: It could not be set up (e.g. ipybox is not installed in its image).
        """
        if self._setup is None or self._token is None:
            raise RuntimeError("ExternalKernels.bind() was not called")
        try:
            await set_up(kernel, self._setup, self._token)
        except KernelSetupError as e:
            if not e.missing_ipybox:
                raise
            # As with ipybox 0.9: a gateway's kernel without ipybox runs code; only its tool calls and
            # generated-package imports fail (in the cell, saying ipybox is missing). Said once.
            if not self._warned:
                self._warned = True
                logger.warning(
                    "kernels of the gateway at %s have no ipybox: code runs there, but generated tools "
                    "can't be imported or called; install ipybox in the kernel image",
                    self.endpoint.url,
                )

    def close(self) -> None:
        """Remove the certificate directory made for the call channel (if any). Idempotent."""
        cert_dir, self._cert_dir = self._cert_dir, None
        if cert_dir is not None:
            shutil.rmtree(cert_dir, ignore_errors=True)
