"""`ipybox.kernel_mgr.client`: ipybox 0.9's kernel client, `KernelClient`, `ExecutionResult` and
`ExecutionError`, on ipybox's own [KernelClient][ipybox.kernels.kernel_client.KernelClient].

Same construction and methods as 0.9: `KernelClient(host, port, working_dir, images_dir, ping_interval,
approve_shell_cmds, require_shell_escape, tool_server_host, tool_server_port, kernel_init_timeout)`;
`connect(retries, retry_interval, kernel_init_timeout)`, `disconnect()`, `reset()`, `kernel_id`,
`execute(code, timeout)`, `stream(code, timeout)` (`str` chunks, then the `ExecutionResult`),
`interrupt()`, `async with`. `ExecutionResult` is ipybox's `CodeExecutionResult` and `ExecutionError` its
`CodeExecutionError`, the very classes, so `except` and `isinstance` work with either name.

The gateway's auth token: ipybox's gateway requires one, which a 0.9 client was never given. This client
reads it from the file that [KernelGateway][ipybox.kernel_mgr.server.KernelGateway] publishes for its
user ([token_file][ipybox.kernel_mgr.token_file]); `token=` passes one explicitly. For a gateway that
publishes none (someone else's), it sends none, and a gateway that wants one refuses with a `GatewayError`
(a `RuntimeError`) that says so.

`connect()` retries only while the gateway does not accept connections (it may be starting); a gateway
that answers and refuses fails at once. After the last attempt it raises `GatewayUnreachableError` (a
`RuntimeError`) naming the URL it tried.

A new kernel (`connect()`, `reset()`) must become ready and be set up within `kernel_init_timeout` seconds,
or `TimeoutError` is raised and the kernel shut down, as in 0.9.2, whose setup code ran on every new kernel
(a tiny timeout fails also when there is nothing to set up). The client sets a kernel up when asked to:

- `working_dir`: the kernel starts in it, and each cell starts in it again, saying so
  (`[ipybox] cwd reset to <dir>`) when the previous one changed directory.
- `approve_shell_cmds`: `!cmd`, `x = !cmd` and the `%%bash`/`%%sh` cell magics ask the tool server
  before they run; `require_shell_escape` also blocks starting processes other than through them (a
  guard, not a security boundary: the sandbox is one). The kernel asks the tool server its environment
  names (`IPYBOX_TOOL_SERVER`, `IPYBOX_TOOL_TOKEN`: start the gateway with `env=tool_server.kernel_env`),
  or the one given as `calls_address`/`call_token` (`ToolServer.calls_address`, `ToolServer.call_token`).
  0.9's `tool_server_host`/`tool_server_port` are accepted and not used: they name the tool server's HTTP
  port, and ipybox's kernels send calls to its call channel instead.

A setup that fails leaves no kernel behind: the client disconnects and raises (shell approval fails
closed: a kernel that could not install it is never used).

Differences from 0.9, on purpose: the client keeps no spare kernel (one kernel per client, as 0.9);
`ping_interval` is accepted, the websocket is kept alive by ipybox's own heartbeat; a kernel that dies
under an execution raises `KernelDiedError` (an `ExecutionError`) and is replaced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Self

from ipybox.kernel_mgr import token_file
from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.kernels.kernel_client import ExecutionError, ExecutionResult
from ipybox.kernels.kernel_client import KernelClient as _KernelClient
from ipybox.kernels.kernel_connection import GatewayError, GatewayUnreachableError
from ipybox.kernels.result import CodeExecutionChunk, CodeExecutionError, CodeExecutionResult

__all__ = ["ExecutionError", "ExecutionResult", "KernelClient"]

logger = logging.getLogger(__name__)


class KernelClient:
    """Client for executing code in an IPython kernel on a kernel gateway (ipybox 0.9's API; see the module
    for the token, the kernel setup and what differs).

    Args:
        host: Host of the kernel gateway.
        port: Port of the kernel gateway.
        working_dir: Each cell starts in this directory (`None`: the kernel's directory is left alone).
        images_dir: Where displayed images are saved (default: `images` in the current directory).
        ping_interval: Accepted for 0.9 compatibility (ipybox's websocket heartbeat is used).
        approve_shell_cmds: Ask the tool server before shell commands (`!cmd`, `%%bash`, ...) run.
        require_shell_escape: Also block `subprocess`, `os.system`, `os.exec*`, `os.spawn*`,
            `os.posix_spawn*` and `pty.spawn` from cell code. Requires `approve_shell_cmds`.
        tool_server_host: Accepted for 0.9 compatibility (see the module).
        tool_server_port: Accepted for 0.9 compatibility (see the module).
        kernel_init_timeout: Seconds a new kernel may take to become ready and be set up (`connect()` can
            override it).
        token: The gateway's auth token (default: the one its `KernelGateway` published, if any).
        calls_address: The tool server's call channel for shell approvals (default: the kernel's
            `IPYBOX_TOOL_SERVER`).
        call_token: The call token for `calls_address` (default: the kernel's `IPYBOX_TOOL_TOKEN`).

    Raises:
        ValueError: `require_shell_escape` without `approve_shell_cmds`, or a timeout that is not positive.

    Example:
        ```python
        async with KernelClient(host="localhost", port=8888) as client:
            result = await client.execute("print('hello')")
            async for item in client.stream("print('hello')"):
                match item:
                    case str():
                        print(f"Chunk: {item}")
                    case ExecutionResult():
                        print(f"Result: {item}")
        ```
    """

    def __init__(
        self,
        host: str = "localhost",
        port: int = 8888,
        working_dir: Path | None = None,
        images_dir: Path | None = None,
        ping_interval: float = 10,
        approve_shell_cmds: bool = False,
        require_shell_escape: bool = False,
        tool_server_host: str = "localhost",
        tool_server_port: int = 0,
        kernel_init_timeout: float = 10,
        *,
        token: str | None = None,
        calls_address: str | None = None,
        call_token: str | None = None,
    ) -> None:
        if require_shell_escape and not approve_shell_cmds:
            raise ValueError(
                "require_shell_escape=True needs approve_shell_cmds=True: the `!` form it leaves open must ask "
                "for approval"
            )
        _check_timeout("kernel_init_timeout", kernel_init_timeout)
        self.host = host
        self.port = port
        self.working_dir = working_dir.resolve() if working_dir is not None else None
        self.images_dir = images_dir or Path("images")
        self.ping_interval = ping_interval
        self.approve_shell_cmds = approve_shell_cmds
        self.require_shell_escape = require_shell_escape
        self.tool_server_host = tool_server_host
        self.tool_server_port = tool_server_port
        self.kernel_init_timeout = kernel_init_timeout
        self.token = token
        self.calls_address = calls_address
        self.call_token = call_token
        self._client: _KernelClient | None = None

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.disconnect()

    @property
    def url(self) -> str:
        """The gateway's base URL, `http://host:port`."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.port}"

    @property
    def kernel_id(self) -> str:
        """The ID of the running kernel.

        Raises:
            RuntimeError: Not connected to a kernel.
        """
        if self._client is None:
            raise RuntimeError("Not connected to kernel")
        return self._client.kernel_id

    async def connect(
        self, retries: int = 10, retry_interval: float = 1.0, kernel_init_timeout: float | None = None
    ) -> None:
        """Create a kernel on the gateway, connect to it and set it up.

        Args:
            retries: Attempts while the gateway does not accept connections.
            retry_interval: Seconds between two attempts.
            kernel_init_timeout: Seconds the kernel may take to become ready and be set up (default: the
                constructor's).

        Raises:
            RuntimeError: Already connected.
            GatewayUnreachableError: The gateway did not accept connections in `retries` attempts (a
                `RuntimeError`; the message names the URL).
            GatewayError: The gateway refused (a `RuntimeError`; the message says why, e.g. a missing token).
            TimeoutError: The kernel was not ready and set up within `kernel_init_timeout`.
        """
        if self._client is not None:
            raise RuntimeError("already connected: call disconnect() first")
        if retries < 1:
            raise ValueError(f"retries must be at least 1, not {retries}")
        timeout = kernel_init_timeout if kernel_init_timeout is not None else self.kernel_init_timeout
        _check_timeout("kernel_init_timeout", timeout)
        last: GatewayUnreachableError | None = None
        for attempt in range(retries):
            if attempt:
                await asyncio.sleep(retry_interval)
            # Read on every attempt: the gateway may be starting, and publishes its token once it listens.
            # The kernel's start and its setup share `timeout`, as 0.9.2's init code (run on the kernel as
            # soon as it was created) did: a tiny one raises TimeoutError, also with nothing to set up.
            started = time.monotonic()
            client = _KernelClient(
                self._endpoint(),
                images_dir=self.images_dir,
                spare_kernel=False,
                ready_timeout=self.kernel_init_timeout,
            )
            try:
                await client.connect(kernel_init_timeout=timeout)
            except GatewayUnreachableError as e:
                last = e
                continue
            except GatewayError as e:
                raise self._refused(e) from None
            self._client = client
            break
        else:
            raise GatewayUnreachableError(
                f"could not create a kernel on the kernel gateway at {self.url} in {retries} attempt(s), "
                f"{retry_interval:g} s apart: {last}"
            )
        await self._setup(None if timeout is None else timeout - (time.monotonic() - started))

    def _endpoint(self) -> GatewayEndpoint:
        token = self.token
        if token is None:
            published = token_file.read(self.host, self.port)
            token = published.token if published is not None else ""
        return GatewayEndpoint(self.url, token)

    def _refused(self, error: GatewayError) -> GatewayError:
        if self.token is None and any(f"HTTP {status}" in str(error) for status in (401, 403)):
            path = token_file.token_path(self.host, self.port)
            reason = str(error).removeprefix("the kernel gateway could not start a kernel: ")
            return GatewayError(
                f"the kernel gateway at {self.url} refused to start a kernel ({reason}): it requires an auth token, "
                f"and none is published for it at {path} (an ipybox KernelGateway of this user publishes one "
                "there while it runs); pass token=... for a gateway started otherwise"
            )
        return error

    async def _setup(self, timeout: float | None) -> None:
        code = setup_code(
            self.working_dir,
            shell_mode=("escape" if self.require_shell_escape else "ask")
            if self.approve_shell_cmds
            else None,
            address=self.calls_address,
            token=self.call_token,
        )
        if code is None:
            return
        client = self._connected()
        if timeout is not None and timeout <= 0:
            await self.disconnect()
            raise TimeoutError(
                "the kernel was not set up within kernel_init_timeout: raise it (None: no limit)"
            )
        try:
            await client.execute(code, timeout=timeout)
        except CodeExecutionError as e:
            await self.disconnect()
            raise CodeExecutionError(
                f"setting up the new kernel failed ({e.ename}: {e.evalue}); it was shut down\n{e}",
                ename=e.ename,
                evalue=e.evalue,
                result=e.result,
            ) from None
        except BaseException:
            await self.disconnect()
            raise

    def _connected(self) -> _KernelClient:
        if self._client is None:
            raise RuntimeError("Not connected to kernel")
        return self._client

    async def disconnect(self) -> None:
        """Shut down the kernel and close the connection."""
        client, self._client = self._client, None
        if client is not None:
            await client.disconnect()

    async def reset(self) -> None:
        """Replace the kernel with a fresh one (all state is gone), set up as after `connect()`."""
        await self._connected().reset()
        await self._setup(self.kernel_init_timeout)

    async def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        """Execute code and return its result.

        Args:
            code: Python code (IPython syntax).
            timeout: Seconds it may run (`None`: no limit); then it is interrupted.

        Raises:
            ExecutionError: The code raised an exception (`str(e)` is its traceback).
            TimeoutError: The code ran past `timeout` (`ExecutionTimeoutError`).
        """
        _check_timeout("timeout", timeout)
        return await self._connected().execute(code, timeout)

    async def stream(self, code: str, timeout: float | None = None) -> AsyncIterator[str | ExecutionResult]:
        """Execute code, yielding output text as it arrives and the `ExecutionResult` last.

        Raises:
            ExecutionError: The code raised an exception.
            TimeoutError: The code ran past `timeout` (`None`: no limit).
        """
        _check_timeout("timeout", timeout)
        async for item in self._connected().stream(code, timeout):
            if isinstance(item, CodeExecutionChunk):
                yield item.text
            elif isinstance(item, CodeExecutionResult):
                yield item

    async def interrupt(self) -> None:
        """Interrupt the running execution (it fails with KeyboardInterrupt)."""
        await self._connected().interrupt()


def setup_code(
    working_dir: Path | None, *, shell_mode: str | None, address: str | None, token: str | None
) -> str | None:
    """The cell that sets up a new kernel (`None` when there is nothing to set up)."""
    lines: list[str] = []
    if working_dir is not None:
        directory = str(working_dir)
        lines += [  # changes to it now, and back after each cell that left it
            "from ipybox.in_kernel import working_dir as _ipybox_wd",
            f"_ipybox_wd.install(get_ipython(), {directory!r})",
            "del _ipybox_wd",
        ]
    if shell_mode is not None:
        lines += [
            "from ipybox.in_kernel import shell_approval as _ipybox_sa",
            f"_ipybox_sa.install(get_ipython(), {shell_mode!r}, address={address!r}, token={token!r})",
            "del _ipybox_sa",
        ]
    return "\n".join(lines) if lines else None


def _check_timeout(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None (no limit), not {value!r}")
