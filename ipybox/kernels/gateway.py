"""`KernelGateway`: starts and supervises a Jupyter Kernel Gateway process for ipybox's kernels."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import ssl
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self

from ipybox import process
from ipybox.errors import KernelError
from ipybox.kernels.gateway_main import READY_PREFIX
from ipybox.kernels.kernelspec import KERNEL_NAME, KernelSpec
from ipybox.lifecycle import Service
from ipybox.limits import Limiter, ResourceLimits

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger(__name__)

# What a kernel gets from the host when nothing else is asked for: enough to find programs, a home and a
# locale, and nothing that could be a secret.
_HOST_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "USER", "LOGNAME", "TZ", "TMPDIR", "SHELL")


LIMITS_PLAN_FILE = "limits.json"
"""In the gateway's runtime directory: the `Limiter` its kernel manager starts kernels under."""


class GatewayStartError(KernelError, RuntimeError):
    """The kernel gateway process could not be started."""


@dataclass(frozen=True)
class GatewayEndpoint:
    """Where a kernel gateway listens and how to authenticate to it.

    Attributes:
        url: Base URL, e.g. `http://127.0.0.1:8888`. For a Unix socket, `http://localhost` with `unix_socket`.
        token: The gateway's auth token (sent as `Authorization: token ...`); empty for none.
        unix_socket: Path of the gateway's Unix socket, if it listens on one.
        ca_file: A CA bundle to check an `https://` gateway's certificate against (default: the system's).
    """

    url: str
    token: str = ""
    unix_socket: Path | None = None
    ca_file: Path | None = None

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")

    def session(self, **options: Any) -> aiohttp.ClientSession:
        """An HTTP session to the gateway: over its Unix socket, or TCP (TLS checked against `ca_file` when
        given, else the system's CAs), with its token. `options` go to `aiohttp.ClientSession`."""
        import aiohttp

        connector: aiohttp.BaseConnector | None = None
        if self.unix_socket is not None:
            connector = aiohttp.UnixConnector(path=str(self.unix_socket))
        elif self.ca_file is not None:
            connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(self.ca_file)))
        headers = {"Authorization": f"token {self.token}"} if self.token else {}
        return aiohttp.ClientSession(connector=connector, headers=headers, **options)


def describe_exit(returncode: int) -> str:
    """How a process ended, from its return code: `signal 9 (SIGKILL)` or `exit code 1`."""
    if returncode < 0:
        try:
            return f"signal {-returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def kernel_base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a kernel: a minimal, secret-free subset of the host's plus `extra`.

    The interpreter's own `bin` directory goes first on PATH, so `!pip install` in a cell installs into
    the environment the kernel runs on.
    """
    env = {key: os.environ[key] for key in _HOST_ENV_KEYS if key in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    if "HOME" not in env:
        env["HOME"] = str(Path.home())
    bin_dir = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != bin_dir]
    env["PATH"] = os.pathsep.join([bin_dir, *path])
    env.update(extra or {})
    return env


class KernelGateway:
    """Runs a Jupyter Kernel Gateway bound to loopback (or a Unix socket) with a random auth token.

    The gateway gets a private runtime directory, a kernelspec of ipybox's, a minimal environment (which
    its kernels inherit: host secrets never reach a kernel) and TCP no-delay on kernel websockets. It is
    ready when it says so on its stdout, with no fixed sleeps, and is stopped together with all its kernels,
    also when this process dies.

    Args:
        host: Address to bind to. Only loopback addresses are accepted.
        port: TCP port; `None` picks a free one (race-free: the gateway binds port 0 and reports it).
        unix_socket: Listen on this Unix socket instead of TCP.
        env: Environment variables for the kernels, on top of the minimal host subset.
        working_dir: Working directory of the kernels (default: the current directory).
        kernel_spec: How kernels are launched (default: plain IPython on this interpreter).
        log_level: Log level of the gateway process.
        log_to_stderr: Send the gateway's log to this process's stderr instead of a private log file.
        startup_timeout: Seconds to wait for the gateway to listen.
        request_env: Variables a kernel start request may set for its kernel (e.g. a per-kernel token);
            kernels keep the environment above either way.
        token: The auth token (default: a new random one), e.g. to keep clients working across a restart.
        limits: What each kernel (with everything it starts) may use; checked against the machine by
            `start()` (`LimitUnavailableError` for one it can't enforce). The gateway itself runs outside them.
        limits_source: Where `limits` were set, for that error's message (e.g. `[kernel.limits]`).

    Example:
        ```python
        async with KernelGateway() as gateway:
            async with KernelClient(gateway.endpoint) as client:
                result = await client.execute("print(1 + 1)")
        ```
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        unix_socket: Path | None = None,
        env: Mapping[str, str] | None = None,
        working_dir: Path | None = None,
        kernel_spec: KernelSpec | None = None,
        log_level: str = "WARNING",
        log_to_stderr: bool = False,
        startup_timeout: float = 60,
        request_env: Sequence[str] = (),
        token: str | None = None,
        limits: ResourceLimits | None = None,
        limits_source: str = "limits",
    ) -> None:
        if host == "localhost":
            host = "127.0.0.1"
        if unix_socket is None and host not in ("127.0.0.1", "::1"):
            raise ValueError(f"KernelGateway binds to loopback only (127.0.0.1 or ::1), not {host!r}")
        self.host = host
        self.port = port
        self.unix_socket = unix_socket
        self.env = dict(env or {})
        self.working_dir = (working_dir or Path.cwd()).resolve()
        self.kernel_spec = kernel_spec or KernelSpec()
        self.log_level = log_level.upper()
        self.log_to_stderr = log_to_stderr
        self.startup_timeout = startup_timeout
        self.request_env = list(request_env)
        self.token = token or secrets.token_urlsafe(32)
        self.limits = limits or ResourceLimits()
        self.limits_source = limits_source
        self._limiter: Limiter | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._runtime_dir: Path | None = None
        self._log_file: IO[bytes] | None = None
        self._endpoint: GatewayEndpoint | None = None
        # What reads the gateway's stdout once it is ready, from `start()` to `stop()`.
        self._tasks: Service | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def endpoint(self) -> GatewayEndpoint:
        """How clients reach this gateway. Raises RuntimeError before `start()`."""
        if self._endpoint is None:
            raise RuntimeError("the kernel gateway is not running")
        return self._endpoint

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def exited(self, timeout: float) -> str | None:
        """How the gateway process ended (`describe_exit`), waiting up to `timeout` seconds for it to be
        seen exiting; `None` while it runs (or when it was never started).

        For the error of a kernel whose connection closed: the connection closes as the process dies, a
        moment before the process is reaped. Polled, like the supervisor's watch: `Process.wait()` (and
        `join()`) return only once the gateway's stdout is closed too, which its kernels keep open until
        they notice it is gone (a second or more later).
        """
        process = self._process
        if process is None:
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while process.returncode is None:  # noqa: ASYNC110 (no event for it: see above)
                    await asyncio.sleep(0.02)
        return describe_exit(process.returncode) if process.returncode is not None else None

    @property
    def runtime_dir(self) -> Path | None:
        """The gateway's private directory (its config, kernelspec, kernel sockets and log), made by
        `start()` and removed by `stop()`; `None` when not started."""
        return self._runtime_dir

    @property
    def log_path(self) -> Path | None:
        """The gateway's log file (None when logging to stderr or not started)."""
        if self._runtime_dir is None or self.log_to_stderr:
            return None
        return self._runtime_dir / "gateway.log"

    async def start(self) -> None:
        """Start the gateway and return once it accepts connections.

        Raises:
            RuntimeError: The gateway is already running.
            LimitUnavailableError: `limits` asks for a limit this machine can't enforce.
            GatewayStartError: It exited or did not listen within `startup_timeout`; the message carries the
                end of its log.
        """
        if self._process is not None:
            raise RuntimeError("the kernel gateway is already running")
        self._limiter = Limiter.open(
            self.limits,
            sandboxed=self.kernel_spec.sandboxed,
            private_tmp=self.kernel_spec.private_tmp,
            source=self.limits_source,
            workspace=self.working_dir,
        )
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="ipybox-gateway-"))
        self._tasks = Service("kernel gateway")
        try:
            await self._tasks.start()
            await self._spawn()
            address = await self._wait_ready()
        except BaseException:
            await self.stop()
            raise
        if address.startswith("unix:"):
            self._endpoint = GatewayEndpoint("http://localhost", self.token, Path(address[5:]))
        else:
            host, _, port = address.rpartition(":")
            self.port = int(port)
            shown = f"[{host}]" if ":" in host else host
            self._endpoint = GatewayEndpoint(f"http://{shown}:{port}", self.token)
        logger.debug("kernel gateway %s listening on %s", self.pid, address)

    def update_kernel_spec(self, kernel_spec: KernelSpec) -> None:
        """Start kernels from `kernel_spec` from now on; running kernels keep what they were started with.

        For a sandbox whose policy changed while the gateway runs (`ipybox up` protects the code of a
        server added since). Whether kernels are sandboxed, and have a private `/tmp`, is fixed when the
        gateway starts (its limits are set up for it).

        Raises:
            RuntimeError: The gateway is not running.
            ValueError: `kernel_spec` is sandboxed, or has a private `/tmp`, where the running one is not,
                or the other way round.
        """
        if self._runtime_dir is None or self._process is None:
            raise RuntimeError("the kernel gateway is not running: give the kernel spec to a new one")
        fixed = (kernel_spec.sandboxed, kernel_spec.private_tmp)
        if fixed != (self.kernel_spec.sandboxed, self.kernel_spec.private_tmp):
            raise ValueError(
                "a running gateway's kernels stay sandboxed (or unsandboxed) as they started: start a new "
                "gateway to change that"
            )
        kernel_spec.write(self._runtime_dir / "data", runtime_dir=self._runtime_dir)
        self.kernel_spec = kernel_spec

    async def _spawn(self) -> None:
        assert self._runtime_dir is not None
        config_dir = self._runtime_dir / "config"
        data_dir = self._runtime_dir / "data"
        config_dir.mkdir()
        (self._runtime_dir / "ipc").mkdir(mode=0o700)
        self.kernel_spec.write(data_dir, runtime_dir=self._runtime_dir)
        env = kernel_base_env(self.env)
        limits_plan = ""
        if self._limiter is not None:
            plan_path = self._runtime_dir / LIMITS_PLAN_FILE
            plan_path.write_text(json.dumps(self._limiter.as_json()))
            limits_plan = str(plan_path)
        config = {
            "KernelGatewayApp": {
                "ip": self.host,
                "port_retries": 0,
                "default_kernel_name": KERNEL_NAME,
                # traitlets spells it WARN; logging accepts both.
                "log_level": "WARN" if self.log_level == "WARNING" else self.log_level,
                # A start request that sets variables would otherwise replace this whole environment.
                "env_process_whitelist": sorted(env),
            },
            "JupyterWebsocketPersonality": {"list_kernels": True, "env_whitelist": self.request_env},
            # Output is bounded by ipybox itself (with the full text kept in a file), not dropped here.
            "ZMQChannelsWebsocketConnection": {"limit_rate": False, "iopub_data_rate_limit": 0.0},
            # Kernel sockets as files in the private runtime dir instead of loopback TCP ports that any
            # local user could connect to, in a directory per kernel (see gateway_kernels).
            "KernelManager": {"transport": "ipc"},
            "SeedingMappingKernelManager": {
                "kernel_manager_class": "ipybox.kernels.gateway_kernels.PrivateIpcKernelManager"
            },
            "PrivateIpcKernelManager": {
                "ipc_root": str(self._runtime_dir / "ipc"),
                "limits_plan": limits_plan,
            },
            # Notice a dead kernel in half a second instead of three, and restart it once: ipybox never
            # reuses a restarted kernel (its state is gone), so a kernel that cannot start is reported in
            # about a second instead of after five restarts.
            "KernelRestarter": {"time_to_dead": 0.5, "restart_limit": 1},
        }
        (config_dir / "jupyter_kernel_gateway_config.json").write_text(json.dumps(config))
        env.update(
            {
                "KG_AUTH_TOKEN": self.token,
                "JUPYTER_CONFIG_DIR": str(config_dir),
                "JUPYTER_DATA_DIR": str(data_dir),
                "JUPYTER_PATH": str(data_dir),
                "JUPYTER_RUNTIME_DIR": str(self._runtime_dir / "runtime"),
                "JUPYTER_PLATFORM_DIRS": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        where = (
            ["--unix-socket", str(self.unix_socket)] if self.unix_socket else ["--port", str(self.port or 0)]
        )
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
        stderr = self._open_log()
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            # -P: the working directory (the workspace, which kernels write) is not put on sys.path, so no
            # file there (a planted `tornado.py`, a project's `json.py`) is imported by the gateway instead.
            "-P",
            "-m",
            "ipybox.kernels.gateway_main",
            *where,
            cwd=self.working_dir,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            # Its own session: a Ctrl-C in the terminal reaches the host, which then stops the gateway in
            # order, instead of killing gateway and kernels under a running execution.
            start_new_session=True,
        )

    def _open_log(self) -> IO[bytes] | None:
        if self.log_to_stderr or self._runtime_dir is None:
            return None
        self._log_file = open(self._runtime_dir / "gateway.log", "wb")  # noqa: SIM115 (closed in stop())
        return self._log_file

    async def _wait_ready(self) -> str:
        assert self._process is not None and self._process.stdout is not None
        stdout = self._process.stdout
        try:
            async with asyncio.timeout(self.startup_timeout):
                while True:
                    line = await stdout.readline()
                    if not line:
                        await self._process.wait()
                        raise GatewayStartError(
                            f"the kernel gateway exited with code {self._process.returncode} before it was "
                            f"ready{self._log_tail()}"
                        )
                    text = line.decode(errors="replace").strip()
                    if text.startswith(READY_PREFIX):
                        assert self._tasks is not None  # started by `start()`
                        self._tasks.spawn(self._drain_stdout(stdout), name="ipybox-gateway-stdout")
                        return text[len(READY_PREFIX) :].strip()
                    logger.debug("kernel gateway: %s", text)
        except TimeoutError:
            raise GatewayStartError(
                f"the kernel gateway did not start listening within {self.startup_timeout:g} s{self._log_tail()}"
            ) from None

    @staticmethod
    async def _drain_stdout(stdout: asyncio.StreamReader) -> None:
        # Never let a full pipe block the gateway; anything printed there goes to our log.
        while line := await stdout.readline():
            logger.debug("kernel gateway: %s", line.decode(errors="replace").rstrip())

    def _log_tail(self, lines: int = 15) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return ""
        tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
        return (":\n" + "\n".join(tail)) if tail else ""

    async def join(self) -> int | None:
        """Wait for the gateway process to exit and return its exit code."""
        if self._process is None:
            return None
        return await self._process.wait()

    async def stop(self, timeout: float = 10) -> None:
        """Stop the gateway and every kernel it started.

        The gateway gets SIGTERM and shuts its kernels down; whatever is left after `timeout` seconds
        (the gateway, its kernels and their children) is killed.
        """
        proc, self._process = self._process, None
        if proc is not None:
            tree = process.descendants(proc.pid)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), timeout)
                except TimeoutError:
                    logger.warning("kernel gateway %s did not stop in %g s: killing it", proc.pid, timeout)
                    process.kill_all([proc.pid])
                    await proc.wait()
            survivors = [pid for pid in tree + process.descendants(proc.pid) if process.is_alive(pid)]
            if survivors:
                logger.debug("killing leftover gateway processes %s", survivors)
                process.kill_all(survivors)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = None
        if self._limiter is not None:
            # Last: what a kernel started outside its process tree (setsid, a double fork) is still in its
            # group, and ends here.
            self._limiter.close()
            self._limiter = None
        self._endpoint = None
        # After the rest, as the one await left: a caller cancelled here sees its cancellation, nothing undone.
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            await tasks.aclose()
