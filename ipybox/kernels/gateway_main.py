"""Entry point of the kernel gateway process that [KernelGateway][ipybox.kernels.gateway.KernelGateway]
starts: `python -m ipybox.kernels.gateway_main (--port N | --unix-socket PATH)`.

It runs the stock Jupyter Kernel Gateway with three changes that matter for latency and supervision:

- jsonschema's optional format-checker libraries are kept from importing: `rfc3987_syntax` alone builds a
  grammar at import time that costs about 2.3 s of the gateway's 3 s start, and the others about 0.2 s.
  jsonschema skips a format whose library is missing; the gateway only validates its own event schemas.
- Kernel websockets get TCP no-delay: jupyter_server never sets it after the upgrade, so every message
  waits for the peer's delayed ACK (a 48 ms round trip instead of about 5 ms).
- The listening socket is bound here (TCP port 0 or a Unix socket) and announced on stdout as
  `IPYBOX_GATEWAY_READY <address>` once it accepts connections, so the host needs neither a port race
  nor polling.

The auth token comes from the `KG_AUTH_TOKEN` environment variable (not argv, which `ps` shows to every
local user); everything else comes from the config file in `JUPYTER_CONFIG_DIR`.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import warnings
from typing import Any

READY_PREFIX = "IPYBOX_GATEWAY_READY"

_OPTIONAL_FORMAT_CHECKERS = (
    "rfc3987_syntax",
    "rfc3987",
    "rfc3986_validator",
    "rfc3339_validator",
    "isoduration",
    "webcolors",
    "uri_template",
    "fqdn",
    "jsonpointer",
)


def _die_with_parent() -> None:
    # If the host is killed outright (SIGKILL, OOM), the gateway must not outlive it; it then shuts down
    # its kernels on SIGTERM like on any other stop.
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass
        if os.getppid() == 1:
            sys.exit(0)


def _enable_websocket_nodelay() -> None:
    from jupyter_server.services.kernels.websocket import KernelWebsocketHandler

    original_open: Any = KernelWebsocketHandler.open

    async def open_with_nodelay(self: Any, *args: Any, **kwargs: Any) -> None:
        self.set_nodelay(True)
        await original_open(self, *args, **kwargs)

    # Patched on the base class: the gateway's handler is a subclass generated at import time.
    KernelWebsocketHandler.open = open_with_nodelay  # type: ignore[method-assign]


def _report_in_kernel_models() -> None:
    # Every kernel model the gateway serves (`GET /api/kernels`, `/api/kernels/{id}`) says what the kernel
    # may use and uses (`PrivateIpcKernelManager.ipybox_report`): `ipybox status` shows it, and a client
    # whose kernel died asks it why (its memory limit, and the peak).
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

    original: Any = MappingKernelManager.kernel_model

    def kernel_model(self: Any, kernel_id: str) -> dict[str, Any]:
        model: dict[str, Any] = original(self, kernel_id)
        report = getattr(self._kernels.get(kernel_id), "ipybox_report", None)
        if report is not None:
            try:
                model["ipybox"] = report()
            except Exception as e:  # a model without the report beats no model
                self.log.warning("could not report kernel %s's usage: %s", kernel_id, e)
        return model

    MappingKernelManager.kernel_model = kernel_model  # type: ignore[method-assign]


def _close_websockets_of_deleted_kernels() -> None:
    # jupyter_server shuts a deleted kernel down but leaves its websockets open (only their ZMQ channels
    # close), so a client connected to it sends its next execute into nothing and waits for its timeout.
    # Closing them tells every client at once (`KernelDied`: "the gateway closed the connection"), as a
    # gateway that exits does; the workspace's idle kernel reaper relies on it.
    from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

    original: Any = MappingKernelManager._async_shutdown_kernel

    async def shutdown_kernel(self: Any, kernel_id: str, now: bool = False, restart: bool = False) -> Any:
        if not restart:
            for connection in list(ZMQChannelsWebsocketConnection._open_sockets):
                if connection.kernel_id == kernel_id and connection.websocket_handler is not None:
                    connection.websocket_handler.close()
        return await original(self, kernel_id, now=now, restart=restart)

    MappingKernelManager._async_shutdown_kernel = shutdown_kernel  # type: ignore[method-assign]
    MappingKernelManager.shutdown_kernel = shutdown_kernel


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ipybox-gateway")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="TCP port on the configured ip (0: any free port)")
    where.add_argument("--unix-socket", help="path of a Unix socket to listen on instead of TCP")
    args = parser.parse_args(argv)

    _die_with_parent()
    # jupyter_server warns about any kernel manager class not derived from its own; ipybox's derives from
    # the kernel gateway's (as the gateway's default does), and the warning would fill every log excerpt.
    warnings.filterwarnings(
        "ignore", message="KernelManager class .* is not a subclass of 'ServerKernelManager'"
    )
    for name in _OPTIONAL_FORMAT_CHECKERS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    _enable_websocket_nodelay()
    _close_websockets_of_deleted_kernels()
    _report_in_kernel_models()

    from kernel_gateway.gatewayapp import KernelGatewayApp
    from tornado import httpserver, netutil

    token = os.environ.pop("KG_AUTH_TOKEN", "")
    app = KernelGatewayApp.instance()
    app.auth_token = token
    app.initialize([], new_httpserver=False)
    # Resolve the (lazily computed) kernelspec search path while JUPYTER_PATH is still set.
    _ = app.kernel_spec_manager.kernel_dirs, app.kernel_spec_manager.data_dir
    # Kernels inherit this process's environment: after initialisation the gateway needs none of its own
    # settings, and kernels must not learn where other kernels' connection files are.
    for key in [k for k in os.environ if k.startswith(("KG_", "JUPYTER_"))]:
        del os.environ[key]
    app.http_server = httpserver.HTTPServer(app.web_app, xheaders=app.trust_xheaders)
    if args.unix_socket is not None:
        app.http_server.add_socket(netutil.bind_unix_socket(args.unix_socket, mode=0o600))
        address = f"unix:{args.unix_socket}"
    else:
        sockets = netutil.bind_sockets(args.port, app.ip)
        app.http_server.add_sockets(sockets)
        app.port = sockets[0].getsockname()[1]
        address = f"{app.ip}:{app.port}"
    # The socket is listening: connections queue until the IO loop starts right below.
    print(f"{READY_PREFIX} {address}", flush=True)
    app.start()


if __name__ == "__main__":
    main()
