"""A real Jupyter Enterprise Gateway, and a kernelspec whose kernels cannot see the host's files.

Used by tests/remote (its conftest starts one gateway per test process) and by the bench
(bench/scenarios/remote_kernel_start.py); it needs only the standard library and `ipybox.process`.

`EnterpriseGateway(root)`: Enterprise Gateway from `.cache/eg-venv` (`bash scripts/setup --tests` installs it there, in
a venv of its own, as a deployment runs it) on a free 127.0.0.1 port, with an auth token (in a 0600 config
file, not on its command line), its own Jupyter runtime, data and config directories and HOME under `root`
(never the user's), and a minimal environment. `start()` returns once `GET /api/kernelspecs` answers with
the token; `restart()` brings it back on the same port with the same token (its kernels are lost, as when a
real gateway restarts; `arestart()` does it without blocking the caller's event loop); `stop()` ends it and
every process it started (kernels run in sessions of their own, so its process group is not enough).
The gateway offers exactly one kernelspec, `KERNEL_NAME`, also as its default, and starts kernels for any
`KERNEL_USERNAME` (by default EG refuses "root", the user it runs as here when no request names one).

`isolated_kernelspec(python)`: the kernel image of the tests. A kernel runs
`<python> -m ipykernel_launcher -f {connection_file}` inside bubblewrap, where it sees only:
- the system's `/usr` (with the `/bin`, `/lib*`, `/sbin` links or binds) and a few files of `/etc` that name
  resolution, time zones and TLS need; `/etc/passwd` and `/etc/group` are the kernelspec's own;
- read-only: the interpreter's base prefix, its venv, the directory of the `ipybox` package (not the
  checkout around it: with an editable install that is the repository), and its own connection file (not
  the gateway's runtime directory, which holds the other kernels' keys);
- its own `/proc` (a PID namespace: only its own processes), `/dev`, and empty private `/tmp` and HOME.
It shares the host's network namespace: the host is reachable over TCP, as from a pod, and nothing else
of the host is. Interrupts are messages (SIGINT to the process group would kill bubblewrap).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ipybox import process
from ipybox.sandbox.bwrap import NAMESPACE_ARGS

REPO_ROOT = Path(__file__).resolve().parents[2]
EG_VENV = REPO_ROOT / ".cache" / "eg-venv"
PROJECT_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
KERNEL_NAME = "ipybox-remote"

# Inside the sandbox: a home of its own (a tmpfs) and the working directory kernels start in.
KERNEL_HOME = "/home/kernel"
# What of /etc a Python kernel that dials TCP needs: name resolution, time zones, the dynamic linker's
# cache, the system's CA store (for a certificate the user's cluster signed). Missing ones are skipped.
_ETC = (
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/localtime",
    "/etc/ld.so.cache",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/mime.types",
)
_READY_TIMEOUT = 90.0  # seconds; ~10 s on an idle 2-core machine, much more while the suite runs
_STOP_GRACE = 10.0


class GatewayNotInstalledError(RuntimeError):
    """`.cache/eg-venv` has no Enterprise Gateway."""


@dataclass(frozen=True)
class KernelSpecFiles:
    """A kernelspec directory's files: `kernel.json` and the resources its argv names `{resource_dir}`.

    Attributes:
        spec: The `kernel.json` content.
        resources: More files (name -> text) of the kernelspec directory.
        binds: The host paths bound read-only into the sandbox (what a kernel can see of the host).
    """

    spec: dict[str, object]
    resources: dict[str, str]
    binds: tuple[Path, ...]

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "kernel.json").write_text(json.dumps(self.spec, indent=2) + "\n")
        for name, text in self.resources.items():
            (directory / name).write_text(text)
        return directory


def _interpreter_paths(python: Path) -> tuple[Path, Path, Path]:
    """The base prefix, the prefix (venv) and the `ipybox` package directory of `python`, asked of it."""
    probe = (
        "import importlib.util, json, sys; "
        "spec = importlib.util.find_spec('ipybox'); "
        "print(json.dumps([sys.base_prefix, sys.prefix, list(spec.submodule_search_locations)[0]]))"
    )
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{python} cannot import ipybox (the kernel image needs it): {done.stderr.strip()}"
        )
    base, prefix, package = json.loads(done.stdout)
    return Path(base).resolve(), Path(prefix), Path(package).resolve()


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():  # merged /usr (Debian 12): keep the link, it points into /usr
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    for etc in _ETC:
        args += ["--ro-bind-try", etc, etc]
    return args


def _passwd() -> tuple[str, str]:
    """`/etc/passwd` and `/etc/group` of the sandbox: root and the user the kernel runs as, at its home."""
    uid, gid = os.getuid(), os.getgid()
    users = {0: "root", uid: "kernel" if uid else "root"}
    passwd = "".join(
        f"{name}:x:{u}:{gid if u else 0}:{name}:{KERNEL_HOME}:/bin/sh\n" for u, name in users.items()
    )
    groups = {0: "root", gid: "kernel" if gid else "root"}
    group = "".join(f"{name}:x:{g}:\n" for g, name in groups.items())
    return passwd, group


def isolated_kernelspec(python: Path = PROJECT_PYTHON) -> KernelSpecFiles:
    """The kernelspec of a kernel on `python` (its venv has ipykernel and ipybox) that sees none of the
    host's files and shares the host's network (see the module docstring)."""
    base, prefix, package = _interpreter_paths(python)
    binds = tuple(dict.fromkeys((base, prefix, package)))  # a venv-less python has prefix == base
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RuntimeError(
            "bubblewrap is missing: run `bash scripts/setup` (or `apt-get install bubblewrap`)"
        )
    argv = [
        bwrap,
        # Every namespace but the network (ipybox's sandbox's own arguments): its own PIDs, IPC, UTS, mounts
        # and user, no capabilities, no nested user namespaces.
        *NAMESPACE_ARGS,
        "--share-net",
        *_system_args(),
        "--ro-bind",
        "{resource_dir}/passwd",
        "/etc/passwd",
        "--ro-bind",
        "{resource_dir}/group",
        "/etc/group",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        KERNEL_HOME,
        # After the tmpfs mounts: an interpreter or a checkout under /tmp stays visible.
        *(arg for path in binds for arg in ("--ro-bind", str(path), str(path))),
        # The kernel reads its ports and key here; the gateway's runtime directory (the other kernels'
        # files) stays hidden.
        "--ro-bind",
        "{connection_file}",
        "{connection_file}",
        # ipykernel exits once the pid in JPY_PARENT_PID (the gateway, outside the PID namespace) is gone.
        "--unsetenv",
        "JPY_PARENT_PID",
        "--setenv",
        "HOME",
        KERNEL_HOME,
        "--setenv",
        "TMPDIR",
        "/tmp",
        "--setenv",
        "PATH",
        f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
        "--chdir",
        KERNEL_HOME,
        str(python),
        "-m",
        "ipykernel_launcher",
        "-f",
        "{connection_file}",
    ]
    passwd, group = _passwd()
    spec: dict[str, object] = {
        "argv": argv,
        "display_name": "Python (ipybox, no host files)",
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {
            "process_proxy": {
                "class_name": "enterprise_gateway.services.processproxies.processproxy.LocalProcessProxy"
            }
        },
    }
    return KernelSpecFiles(spec, {"passwd": passwd, "group": group}, binds)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class EnterpriseGateway:
    """A real Enterprise Gateway under `root` (see the module docstring). Not thread-safe; `stop()` is
    idempotent."""

    root: Path
    kernelspec: KernelSpecFiles | None = None  # default: `isolated_kernelspec()`
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    port: int = 0  # 0: a free one, chosen by `start()` and kept by `restart()`
    kernel_name: str = KERNEL_NAME
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log_start: int = field(default=0, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "gateway.log"

    @property
    def runtime_dir(self) -> Path:
        return self.root / "runtime"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def start(self) -> None:
        """Start the gateway and wait until it answers.

        Raises:
            GatewayNotInstalledError: `bash scripts/setup --tests` has not installed it.
            RuntimeError: It exited or did not answer in time (with its log's end).
        """
        if self._process is not None:
            raise RuntimeError("the Enterprise Gateway is running already")
        executable = EG_VENV / "bin" / "jupyter-enterprisegateway"
        if not executable.exists():
            raise GatewayNotInstalledError(
                f"{executable} is missing: run `bash scripts/setup --tests` (it installs Jupyter Enterprise Gateway "
                f"into {EG_VENV})"
            )
        self._prepare()
        fixed = self.port != 0
        for attempt in range(1 if fixed else 3):
            if not fixed:
                self.port = free_port()
            try:
                self._launch(executable)
                return
            except _PortTaken:
                if fixed or attempt == 2:
                    raise RuntimeError(f"port {self.port} is taken: {self._log_tail()}") from None
                self.port = 0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """End the gateway and everything it started. `sig`: SIGKILL to crash it instead of shutting down."""
        proc, self._process = self._process, None
        if proc is None:
            return
        # Kernels run in sessions of their own: find them before the gateway, their parent, is gone.
        children = process.descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=_STOP_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        children = [pid for pid in [*children, *process.descendants(proc.pid)] if process.is_alive(pid)]
        process.kill_all(children)
        deadline = time.monotonic() + _STOP_GRACE
        while any(process.is_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """Stop the gateway (with `sig`: SIGKILL for a crash) and start it again on the same port and token."""
        self.stop(sig)
        self.start()

    async def arestart(self, sig: int = signal.SIGTERM) -> None:
        """`restart()` in a worker thread: the caller's event loop (an in-process supervisor) keeps running
        meanwhile and sees the gateway go away as a client of a real one would."""
        await asyncio.to_thread(self.restart, sig)

    async def astop(self, sig: int = signal.SIGTERM) -> None:
        """`stop()` in a worker thread (see `arestart`)."""
        await asyncio.to_thread(self.stop, sig)

    def kernel_pids(self) -> list[int]:
        """The live processes the gateway started (bubblewrap and the kernels in it)."""
        return [] if self._process is None else process.descendants(self._process.pid)

    def request(
        self, method: str, path: str, *, token: str | None = None, body: object = None
    ) -> tuple[int, object]:
        """One REST call (`token=None`: the gateway's; `""`: none); returns the status and the JSON body."""
        token = self.token if token is None else token
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        if token:
            request.add_header("Authorization", f"token {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def _prepare(self) -> None:
        for name in ("runtime", "data", "config", "home"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        spec = self.kernelspec or isolated_kernelspec()
        self.kernelspec = spec
        spec.write(self.root / "data" / "kernels" / self.kernel_name)

    def _environment(self) -> dict[str, str]:
        # Minimal, and nothing of the user's: a kernel may inherit what the gateway has.
        return {
            "PATH": f"{EG_VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": str(self.root / "home"),
            "JUPYTER_RUNTIME_DIR": str(self.runtime_dir),
            "JUPYTER_DATA_DIR": str(self.root / "data"),
            "JUPYTER_CONFIG_DIR": str(self.root / "config"),
            "JUPYTER_PATH": str(self.root / "data"),
            "JUPYTER_PLATFORM_DIRS": "1",
        }

    def _launch(self, executable: Path) -> None:
        # The settings go in a config file of mode 0600, so the token is not on a command line (`ps`).
        config = {
            "EnterpriseGatewayApp": {
                "ip": "127.0.0.1",
                "port": self.port,
                # Fail on a taken port instead of moving to another: clients must find it where it was.
                "port_retries": 0,
                "auth_token": self.token,
                "default_kernel_name": self.kernel_name,
                "list_kernels": True,
                # EG refuses kernels for KERNEL_USERNAME "root" by default (the gateway's own user when a
                # request names none); in a deployment it runs as a user of its own, here maybe as root.
                "unauthorized_users": [],
            },
            # Only the isolated kernelspec, nothing found elsewhere (jupyter_client 6 calls the list `whitelist`).
            "KernelSpecManager": {"ensure_native_kernel": False, "whitelist": [self.kernel_name]},
        }
        config_file = self.root / "config" / "enterprise_gateway_config.json"
        config_file.touch(mode=0o600)
        config_file.write_text(json.dumps(config, indent=2))
        command = [str(executable), f"--config={config_file}"]
        log = self.log_path.open("ab")
        self._log_start = log.tell()  # this run's log begins here (the file keeps earlier runs')
        try:
            self._process = subprocess.Popen(
                command,
                cwd=self.root,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                if "already in use" in self._log_tail(40, since=self._log_start):
                    raise _PortTaken()
                raise RuntimeError(f"the Enterprise Gateway exited ({code}): {self._log_tail()}")
            with contextlib.suppress(OSError):
                status, _ = self.request("GET", "/api/kernelspecs")
                if status == 200:
                    return
            time.sleep(0.1)
        self.stop(signal.SIGKILL)
        raise RuntimeError(
            f"the Enterprise Gateway did not answer within {_READY_TIMEOUT:g} s: {self._log_tail()}"
        )

    def _log_tail(self, lines: int = 15, since: int = 0) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(since)
                text = log.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:])


class _PortTaken(Exception):
    pass


if __name__ == "__main__":
    # `python -m tests.remote.eg DIR`: write the kernelspec to DIR (the example docs/scale-out.md shows).
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(KERNEL_NAME)
    print(isolated_kernelspec().write(target))
