"""`ipybox.kernel_mgr.server.KernelGateway`: ipybox 0.9's kernel gateway class, on ipybox's own
[KernelGateway][ipybox.kernels.gateway.KernelGateway].

Same construction and methods as 0.9 (`host`, `port`, `working_dir`, `sandbox`, `sandbox_config`,
`log_level`, `log_to_stderr`, `env`; `start()`, `stop(timeout)`, `join()`, `async with`). What differs, on
purpose:

- It binds loopback only (`localhost`, `127.0.0.1`, `::1`): any other host is a `ValueError` at
  construction. A gateway runs code as its user for whoever connects to it.
- It requires a random auth token. Its 0.9-style clients know only host and port, so the token is
  published to a file only this user can read and removed on `stop()`
  ([token_file][ipybox.kernel_mgr.token_file] says where and how);
  [KernelClient][ipybox.kernel_mgr.client.KernelClient] reads it from there. ipybox's own client takes
  `gateway.endpoint` (URL and token) instead.
- `sandbox=True` runs each kernel in ipybox's sandbox (bubblewrap on Linux) under the policy in
  `sandbox_config` (a JSON file in sandbox-runtime's format, read by
  [SandboxPolicy.from_file][ipybox.sandbox.policy.SandboxPolicy.from_file]; default: the default policy),
  not the whole gateway under sandbox-runtime. A machine that can't sandbox fails `start()` with
  `SandboxUnavailableError`; nothing ever runs unsandboxed instead. A policy that allows domains gets its
  filtering proxy, started and stopped with the gateway; it has no `[secrets]` (they belong to a
  workspace's `ipybox.toml`, which this gateway has none of) and no interception CA, so a host with
  method or path rules (`readOnly`) is refused over HTTPS. When `env` points kernels at a tool server on a
  Unix socket (`IPYBOX_TOOL_SERVER=unix:...`, as `ToolServer.kernel_env` does), sandboxed kernels can reach
  that socket; a sandboxed kernel has no network, so a TCP tool server is out of its reach.
- Kernels get `env` on top of a small, secret-free part of the host's environment (`PATH`, `HOME`,
  `LANG`, ...), as ipybox's gateway gives every kernel; 0.9 gave them `PATH` and `env`.
- Its log goes to a private file unless `log_to_stderr`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from ipybox.in_kernel.tool_runner import SERVER_ENV
from ipybox.kernel_mgr import token_file
from ipybox.kernels.gateway import GatewayEndpoint, GatewayStartError
from ipybox.kernels.gateway import KernelGateway as _Gateway
from ipybox.kernels.kernelspec import KernelSpec, sandboxed_kernel_spec

if TYPE_CHECKING:
    from ipybox.sandbox import DomainProxy

__all__ = ["KernelGateway"]

logger = logging.getLogger(__name__)

_LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")


class KernelGateway:
    """Manages a Jupyter Kernel Gateway process (ipybox 0.9's API; see the module for what differs).

    Use [KernelClient][ipybox.kernel_mgr.client.KernelClient] to create a kernel on it and execute code.

    Args:
        host: Loopback address to bind to (`localhost`, `127.0.0.1` or `::1`).
        port: Port to listen on (0: any free port, readable from `port` after `start()`).
        working_dir: Working directory of the kernels (default: the current directory).
        sandbox: Run each kernel in ipybox's sandbox.
        sandbox_config: Sandbox policy file (JSON, sandbox-runtime format) extending the default policy.
        log_level: Log level of the gateway process.
        log_to_stderr: Send the gateway's log to stderr instead of a private log file.
        env: Environment variables for the kernels.

    Example:
        ```python
        async with KernelGateway(host="localhost", port=8888) as gateway:
            async with KernelClient(host="localhost", port=8888) as client:
                print((await client.execute("print(1 + 1)")).text)
        ```
    """

    def __init__(
        self,
        host: str = "localhost",
        port: int = 8888,
        working_dir: Path | None = None,
        sandbox: bool = False,
        sandbox_config: Path | None = None,
        log_level: str = "INFO",
        log_to_stderr: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        if host not in _LOOPBACK:
            raise ValueError(
                f"KernelGateway binds to loopback only (localhost, 127.0.0.1 or ::1), not {host!r}: a gateway "
                "runs code as this user for whoever connects to it"
            )
        self.host = host
        self.port = port
        self.working_dir = working_dir.resolve() if working_dir is not None else None
        self.sandbox = sandbox
        self.sandbox_config = sandbox_config
        self.log_level = log_level
        self.log_to_stderr = log_to_stderr
        self.env: dict[str, str] = dict(env or {})
        self._gateway: _Gateway | None = None
        self._proxy: DomainProxy | None = None
        self._token_file: Path | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def endpoint(self) -> GatewayEndpoint:
        """URL and token, for ipybox's own `ipybox.kernels.kernel_client.KernelClient`. RuntimeError before
        `start()`."""
        if self._gateway is None:
            raise RuntimeError("the kernel gateway is not running")
        return self._gateway.endpoint

    @property
    def token_file(self) -> Path | None:
        """Where the auth token is published while the gateway runs (`None` when it does not)."""
        return self._token_file

    async def start(self) -> None:
        """Start the gateway and return once it accepts connections.

        Raises:
            RuntimeError: The gateway is already running.
            SandboxUnavailableError: `sandbox=True` and this machine can't sandbox.
            SandboxPolicyError: `sandbox_config` is missing or not a valid policy (a `ValueError`).
            GatewayStartError: The gateway did not start (the message has the end of its log), or its token
                could not be published.
        """
        if self._gateway is not None:
            raise RuntimeError("Kernel gateway is already running")
        try:
            spec = await self._kernel_spec()
            gateway = self._gateway = _Gateway(
                host=token_file.normalize_host(self.host),
                port=self.port,
                env=self.env,
                working_dir=self.working_dir,
                kernel_spec=spec,
                log_level=self.log_level,
                log_to_stderr=self.log_to_stderr,
            )
            await gateway.start()
            assert gateway.port is not None and gateway.pid is not None
            self.port = gateway.port
            try:
                self._token_file = token_file.publish(
                    self.host, gateway.port, gateway.endpoint.url, gateway.token, gateway.pid
                )
            except OSError as e:
                raise GatewayStartError(f"could not publish the kernel gateway's auth token: {e}") from None
        except BaseException:
            await self.stop()
            raise

    async def _kernel_spec(self) -> KernelSpec | None:
        if not self.sandbox:
            return None
        from ipybox.sandbox import DomainProxy, SandboxPolicy

        policy = SandboxPolicy.from_file(self.sandbox_config) if self.sandbox_config else SandboxPolicy()
        tool_address = self.env.get(SERVER_ENV, "")
        tool_socket = Path(tool_address.removeprefix("unix:")) if tool_address.startswith("unix:") else None
        proxy_socket = None
        if policy.network.allowed_domains:
            self._proxy = DomainProxy(
                policy.network.allowed_domains,
                policy.network.denied_domains,
                read_only=policy.network.read_only,
            )
            proxy_socket = await self._proxy.start()
        return sandboxed_kernel_spec(
            policy,
            self.working_dir or Path.cwd().resolve(),
            tool_socket=tool_socket,
            proxy_socket=proxy_socket,
        )

    async def stop(self, timeout: float = 10) -> None:
        """Stop the gateway and all its kernels (killed if they have not stopped after `timeout` seconds),
        and remove the published token."""
        gateway, self._gateway = self._gateway, None
        proxy, self._proxy = self._proxy, None
        published, self._token_file = self._token_file, None
        try:
            if gateway is not None:
                if published is not None and gateway.port is not None:
                    token_file.remove(self.host, gateway.port, gateway.token, published.parent)
                await gateway.stop(timeout)
        finally:
            if proxy is not None:
                await proxy.stop()

    async def join(self) -> None:
        """Wait for the gateway process to exit."""
        if self._gateway is not None:
            await self._gateway.join()
