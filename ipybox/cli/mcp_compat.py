"""ipybox 0.9's MCP server entry points: the `ipybox.mcp_server.MCPServer` class and the options of
`python -m ipybox.mcp_server` / `ipybox --workspace DIR`.

`MCPServer(...).run()` serves ipybox's MCP server over stdio for the current directory as workspace, as
`ipybox mcp` does ([serve_stdio][ipybox.supervisor.mcp_stdio.serve_stdio]): the same four tools, backed by
the workspace's kernels, tool server and approval rules. It lives here, in the command-line layer, because
it runs a whole workspace; `ipybox.mcp_server` re-exports it lazily.

What maps to what:

- `kernel_env`: variables for the workspace's kernels. They are passed the way the workspace passes
  `KERNEL_ENV_X` variables of the environment and `.env` (as `X`), for as long as `run()` runs; never
  written to a file. When `ipybox up` already runs the workspace, this process attaches to its kernels,
  which keep their own environment (a warning says so).
- `sandbox`, `sandbox_config`: the workspace's `[sandbox]` when it has no `ipybox.toml` yet (one is created
  from them); an existing `ipybox.toml` decides.
- `tool_server_host/port`, `kernel_gateway_host/port`: accepted and unused. ipybox serves its tool server
  and kernel gateway on private Unix sockets (only this user can connect), never on TCP ports.
- `log_level`: the level of this process's log on stderr (`configure_logging`); stdout carries MCP only.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ipybox.display_text import PrintableFormatter

__all__ = ["LOG_LEVELS", "MCPServer", "configure_logging", "unused_endpoint_options"]

logger = logging.getLogger(__name__)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_handler: logging.Handler | None = None

_UNUSED = (
    "ipybox serves its tool server and kernel gateway on private Unix sockets, not on host/port addresses"
)


def configure_logging(level: str) -> None:
    """Log this process's records from `level` up to stderr (for the command line, an application).

    Raises:
        ValueError: `level` is not one of `LOG_LEVELS`.
    """
    name = level.upper()
    if name not in LOG_LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    global _handler
    root = logging.getLogger()
    if _handler is not None:  # configured before: replaced, not doubled
        root.removeHandler(_handler)
    handler = _handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # On the handler too: the supervisor lowers the `ipybox` logger to INFO for its log file, which must
    # not put INFO records on stderr when WARNING was asked for.
    handler.setLevel(name)
    root.addHandler(handler)
    root.setLevel(name)


def unused_endpoint_options(
    tool_server_host: str | None,
    tool_server_port: int | None,
    kernel_gateway_host: str | None,
    kernel_gateway_port: int | None,
) -> str | None:
    """One line saying that the 0.9 host/port options given are not used, or `None` when none was given."""
    given = {
        "--tool-server-host": tool_server_host,
        "--tool-server-port": tool_server_port,
        "--kernel-gateway-host": kernel_gateway_host,
        "--kernel-gateway-port": kernel_gateway_port,
    }
    named = [f"{option} {value}" for option, value in given.items() if value is not None]
    if not named:
        return None
    return f"ipybox: ignoring {', '.join(named)}: {_UNUSED}"


class MCPServer:
    """ipybox's MCP server over stdio for the current directory (ipybox 0.9's class; see the module).

    Args:
        tool_server_host: Accepted, not used (private Unix sockets).
        tool_server_port: Accepted, not used.
        kernel_gateway_host: Accepted, not used.
        kernel_gateway_port: Accepted, not used.
        kernel_env: Environment variables for the workspace's kernels.
        sandbox: Sandbox the kernels (for a workspace without `ipybox.toml`).
        sandbox_config: Sandbox policy file (JSON, sandbox-runtime format).
        log_level: Level of this process's log on stderr.
        workspace: The workspace (default: the current directory when `run()` is called).

    Example:
        ```python
        os.chdir("/path/to/workspace")
        await MCPServer(kernel_env={"API_KEY": "..."}).run()
        ```
    """

    def __init__(
        self,
        tool_server_host: str = "localhost",
        tool_server_port: int | None = None,
        kernel_gateway_host: str = "localhost",
        kernel_gateway_port: int | None = None,
        kernel_env: dict[str, str] | None = None,
        sandbox: bool = False,
        sandbox_config: Path | None = None,
        log_level: str = "INFO",
        *,
        workspace: Path | None = None,
    ) -> None:
        if log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level {log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        self.tool_server_host = tool_server_host
        self.tool_server_port = tool_server_port
        self.kernel_gateway_host = kernel_gateway_host
        self.kernel_gateway_port = kernel_gateway_port
        self.kernel_env: dict[str, str] = dict(kernel_env or {})
        self.sandbox = sandbox
        self.sandbox_config = sandbox_config
        self.log_level = log_level.upper()
        self.workspace = workspace

    async def run(self) -> None:
        """Serve MCP on stdin/stdout until the client closes them."""
        # Here: importing this module (the command line does, for LOG_LEVELS) must stay cheap.
        from ipybox.executor.kernel_setup import KERNEL_ENV_PREFIX
        from ipybox.running.state import NotRunningError, read_state
        from ipybox.supervisor.mcp_stdio import serve_stdio

        configure_logging(self.log_level)
        workspace = (self.workspace or Path.cwd()).resolve()
        if self.tool_server_port is not None or self.kernel_gateway_port is not None:
            logger.info("%s: the tool server and kernel gateway ports given are not used", _UNUSED)
        if self.kernel_env:
            try:
                read_state(workspace)
                logger.warning(
                    "ipybox up already runs %s: its kernels keep their environment, kernel_env is not applied",
                    workspace,
                )
            except NotRunningError:
                pass
        previous = {key: os.environ.get(KERNEL_ENV_PREFIX + key) for key in self.kernel_env}
        os.environ.update({KERNEL_ENV_PREFIX + key: value for key, value in self.kernel_env.items()})
        try:
            await serve_stdio(workspace, self.sandbox, self.sandbox_config)
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(KERNEL_ENV_PREFIX + key, None)
                else:
                    os.environ[KERNEL_ENV_PREFIX + key] = value
