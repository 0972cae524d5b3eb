"""`ipybox up / status / down / logs / validate`: running a workspace from the command line.

`status` and `down` need only the run state and the control endpoint: they work whatever `ipybox.toml`
holds, or without one. The file names the state directory (`[workspace] state_dir`); when it can't be
loaded, `.ipybox` is assumed and a "not running" answer says so.

Exit statuses: `up -d` returns 0 once the workspace is up with every declared (enabled) server started,
and 1 when one failed to start: it prints the summary (each server with its state, a failed one with
why), then names the failed ones on standard error; the workspace keeps running without them (a fix of
`ipybox.toml` is applied live). `down` of a workspace that is not running says so and returns 0: after it,
the workspace is stopped either way. `status` returns 1 when nothing runs.

`status` prints aligned `label: value` lines (`state`, `control`, `mcp`, `console`, `gateway`, `kernels`,
`limits`, `servers`, ...) and one line per kernel and per server under them; `status --json` prints the
control endpoint's `WorkspaceStatus` as JSON (`{"running": true, ...}`), the form scripts should read.

`up` shows its progress on a terminal (`ipybox.cli.progress`): the foreground `up` passes the drawing
listener to `Supervisor.start`; a detached `up` starts its child with `IPYBOX_PROGRESS=ndjson`, which
makes the child write each event as a JSON line to its standard output (`logs/up.out`), and the waiting
command reads the new lines at each poll and draws them (other lines are the child's ordinary output,
kept for the failure message). The child takes the variable out of its environment before anything
starts, so no kernel, gateway or MCP server inherits it. Without a terminal, nothing of this happens: the
output is the endpoint summary alone, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ipybox.display_text import PrintableFormatter, printable
from ipybox.errors import IpyboxError

if TYPE_CHECKING:
    from ipybox.progress import Progress, ProgressEvent
    from ipybox.running.state import SupervisorState
    from ipybox.running.status import KernelsStatus, KernelStatus, MCPServerStatus, WorkspaceStatus

EXIT_ERROR = 1
PROGRESS_ENV = "IPYBOX_PROGRESS"
"""Set to `ndjson` for the child of a detached `up`: write the start's progress events to stdout."""


def _fail(message: str) -> int:
    print(f"ipybox: {printable(message, lines=True)}", file=sys.stderr)
    return EXIT_ERROR


def _say(line: str) -> None:
    """Print a line of `status` or the endpoint summary: names, errors and paths in it come from servers,
    parsers and kernels (`ipybox.display_text`)."""
    print(printable(line, lines=True))


def validate(workspace: Path) -> int:
    """Check `ipybox.toml`; errors as `file:line:column: reason`, one per line."""
    from ipybox.config import CONFIG_FILE, ConfigError, load_config

    try:
        config = load_config(workspace / CONFIG_FILE)
    except ConfigError as e:
        print(printable(str(e), lines=True), file=sys.stderr)
        return EXIT_ERROR
    servers = config.enabled_servers()
    print(
        f"{workspace / CONFIG_FILE}: ok ({len(servers)} server{'s' * (len(servers) != 1)}, "
        f"{len(config.approval.rules)} approval rules, sandbox {'on' if config.sandbox.enabled else 'off'})"
    )
    from ipybox.config.executables import workspace_warnings

    for line in workspace_warnings(config, workspace):  # code kernels could still change: not an error
        print(f"warning: {printable(line)}", file=sys.stderr)
    return 0


def up(workspace: Path, detach: bool) -> int:
    """Run the workspace in the foreground (until Ctrl-C / SIGTERM / `ipybox down`), or start it in the
    background and return once it is up."""
    from ipybox.running.state import NotRunningError, read_state

    # Taken out first: whatever this process starts next inherits its environment.
    as_ndjson = os.environ.pop(PROGRESS_ENV, None) == "ndjson"
    if (problem := validate_quietly(workspace)) is not None:
        print(printable(problem, lines=True), file=sys.stderr)
        return EXIT_ERROR
    try:
        state = read_state(workspace)
        return _fail(f"ipybox is already running in {workspace} (pid {state.pid}); `ipybox down` stops it")
    except NotRunningError:
        pass
    if detach:
        return _up_detached(workspace)
    try:
        return asyncio.run(_up(workspace, as_ndjson))
    except KeyboardInterrupt:
        return 130


def validate_quietly(workspace: Path) -> str | None:
    from ipybox.config import CONFIG_FILE, ConfigError, load_config

    try:
        load_config(workspace / CONFIG_FILE)
    except ConfigError as e:
        return str(e)
    return None


async def _up(workspace: Path, as_ndjson: bool = False) -> int:
    from ipybox.supervisor import Supervisor

    # Only IpyboxErrors are the user's to fix (a bad ipybox.toml, already running, no sandbox here);
    # anything else is a bug, which `main` prints with its traceback.
    try:
        supervisor = Supervisor(workspace)
    except IpyboxError as e:
        return _fail(str(e))
    with supervisor.handle_signals():
        try:
            with _start_progress(as_ndjson) as progress:
                await supervisor.start(progress=progress)
        except IpyboxError as e:
            return _fail(str(e))
        try:
            login = supervisor.console_login() if supervisor.console_url is not None else None
            _print_endpoints(supervisor.status(), supervisor.paths.log, login)
            print("Ctrl-C or `ipybox down` stops it.", flush=True)
            await supervisor.wait()
        finally:
            await supervisor.stop()
    return 0


@contextlib.contextmanager
def _start_progress(as_ndjson: bool) -> Iterator[Progress | None]:
    """Where a foreground `up` reports its start: JSON lines on stdout for the detached `up` waiting on
    it, else drawn on the terminal (if stderr is one)."""
    from ipybox.cli.progress import progress_on_terminal

    if as_ndjson:
        yield _ndjson_line
        return
    with progress_on_terminal() as progress:
        yield progress
    if progress is not None:
        _log_to_terminal()


def _log_to_terminal() -> None:
    """The log on standard error once the drawing is done, as a foreground `up` has always shown it. The
    drawing kept the MCP SDK's `logging.basicConfig` (a rich handler at INFO) from taking effect: this
    plain handler stands in for it."""
    import logging

    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.setLevel(logging.INFO)
        root.addHandler(handler)


def _ndjson_line(event: ProgressEvent) -> None:
    sys.stdout.write(event.to_json() + "\n")
    sys.stdout.flush()


def _up_detached(workspace: Path) -> int:
    from ipybox.cli.progress import progress_on_terminal
    from ipybox.running.state import StateDirError, StatePaths, open_state_file, prepare_state_dir

    paths = StatePaths.of(workspace)
    try:  # never through a symlink a kernel planted in the state directory
        prepare_state_dir(paths)
        fd = open_state_file(paths, "logs/up.out", os.O_RDWR | os.O_APPEND | os.O_CREAT)
    except StateDirError as e:
        return _fail(str(e))
    with os.fdopen(fd, "r+b") as out:
        out.truncate(0)
        # The drawing ends (its last lines stay) before the summary or the failure is printed.
        with progress_on_terminal() as progress:
            env = {**os.environ, PROGRESS_ENV: "ndjson"} if progress is not None else None
            process = subprocess.Popen(
                # -P: nothing in the current directory (often the workspace) shadows ipybox's imports.
                [sys.executable, "-P", "-m", "ipybox.cli", "up", str(workspace)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
            result = _wait_until_up(workspace, process, _ChildOutput(out, progress))
    if isinstance(result, str):
        return _fail(result)
    _print_endpoints(result.status, Path(result.state.log_file), result.console_login)
    print("`ipybox down` stops it.")
    if failed := failed_servers(result.status):
        # A script running `up -d` learns that not everything it declared is up. The workspace keeps
        # running (a fix of ipybox.toml is applied live), as the message says.
        names = ", ".join(name for name, _ in failed)
        why = "".join(f"\n  {name}: {_server_line(server)}" for name, server in failed)
        total = len(result.status.reconciler.servers)
        return _fail(
            f"{len(failed)} of {total} declared server{'s' * (total != 1)} failed to start ({names}); the "
            f"workspace runs without {'it' if len(failed) == 1 else 'them'}:{why}\n"
            "fix ipybox.toml (applied while the workspace runs; `ipybox status` shows each server), or "
            "`ipybox down` stops it"
        )
    return 0


def failed_servers(status: WorkspaceStatus) -> list[tuple[str, MCPServerStatus]]:
    """The declared (enabled) servers that could not be started, by name."""
    return [
        (name, server)
        for name, server in sorted(status.reconciler.servers.items())
        if server.state == "failed"
    ]


@dataclass(frozen=True)
class _Up:
    state: SupervisorState
    status: WorkspaceStatus
    console_login: str | None


def _wait_until_up(workspace: Path, process: subprocess.Popen[bytes], output: _ChildOutput) -> _Up | str:
    """The running workspace, once it is up, or why it is not."""
    from ipybox.running.state import NotRunningError, read_state

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        output.read()
        if process.poll() is not None:
            output.read()
            # The child's own error line already says `ipybox: `.
            last = (output.last_line() or "").removeprefix("ipybox: ")
            return f"ipybox up failed: {last if last else f'exit {process.returncode}'}"
        try:
            state = read_state(workspace)
        except NotRunningError:
            time.sleep(0.1)
            continue
        status = _reachable(workspace) if state.pid == process.pid and state.ready else None
        if status is not None:
            output.read()
            return _Up(state, status, _console_login(workspace, status))
        time.sleep(0.1)
    process.terminate()
    return "ipybox up did not come up within 300 s"


class _ChildOutput:
    """What the child of a detached `up` wrote to `logs/up.out` so far: its progress events (JSON lines,
    passed to `progress` as they are read) and its ordinary output (kept)."""

    def __init__(self, out: IO[bytes], progress: Progress | None) -> None:
        self.out = out
        self.progress = progress
        self._offset = 0
        self._partial = b""  # a line the child is still writing
        self._lines: list[str] = []

    def read(self) -> None:
        """Take in what was written since the last read."""
        self.out.seek(self._offset)
        data = self.out.read()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self._take(line)

    def last_line(self) -> str:
        """The last non-empty line of ordinary output (the line still being written included)."""
        lines = [*self._lines, self._partial.decode(errors="replace")]
        return next((line.strip() for line in reversed(lines) if line.strip()), "")

    def _take(self, line: bytes) -> None:
        from pydantic import ValidationError

        from ipybox.progress import ProgressEvent, emit_to

        if line.startswith(b'{"kind":"progress"'):
            try:
                event = ProgressEvent.from_json(line)
            except ValidationError:
                pass
            else:
                emit_to(self.progress, event)
                return
        self._lines.append(line.decode(errors="replace"))


def _reachable(workspace: Path) -> WorkspaceStatus | None:
    """The running supervisor's status, or `None` while it can't answer yet."""
    try:
        return asyncio.run(_status(workspace))
    except Exception:
        return None


async def _status(workspace: Path) -> WorkspaceStatus:
    from ipybox.supervisor import ControlClient

    async with ControlClient.of(workspace) as control:
        return await control.status()


def _console_login(workspace: Path, status: WorkspaceStatus) -> str | None:
    """A one-time login link for the web console of the running workspace, if it serves one."""
    if status.console is None:
        return None

    async def login() -> str:
        from ipybox.supervisor import ControlClient

        async with ControlClient.of(workspace) as control:
            return (await control.console_login()).url

    try:
        return asyncio.run(login())
    except Exception:  # printed without a link then; `ipybox console` gets one
        return None


def _print_endpoints(status: WorkspaceStatus, log: Path, console_login: str | None = None) -> None:
    from ipybox.running.state import read_state

    state = read_state(Path(status.workspace))
    _say(f"ipybox is up in {status.workspace} (pid {status.pid})")
    _say(f"  control:  unix:{state.control_socket}  (token in {Path(status.state_dir) / 'state.json'})")
    if state.gateway_url is not None:
        _say(f"  gateway:  {state.gateway_url}  (remote: kernels run there; {status.gateway.kernelspec})")
    else:
        _say(f"  gateway:  unix:{state.gateway_socket}")
    if state.mcp_url:
        _say(f"  mcp:      {state.mcp_url}  (streamable HTTP, bearer token)")
    if status.console is not None:
        link = console_login or status.console
        _say(f"  console:  {link}  (one-time login link; `ipybox console` prints a new one)")
    if status.gateway.url is not None:
        _say(f"  kernels:  warm pool of {status.pool.size}, isolated by {status.gateway.isolation}")
    else:
        _say(f"  kernels:  warm pool of {status.pool.size}, sandbox {'on' if status.sandbox else 'off'}")
    servers = status.reconciler.servers
    if servers:
        _say(f"  servers:  {_servers_summary(status)}")
        _print_servers(status, indent="    ")
    _say(f"  log:      {log}")
    _say(f"  connect:  {connect_hint(Path(status.workspace))}")


def connect_hint(workspace: Path) -> str:
    """The `ipybox connect` line of `up` and `status`: how to hand the workspace to an agent."""
    where = "" if workspace == Path.cwd() else f" -w {shlex.quote(str(workspace))}"
    return f"`ipybox connect CLIENT{where}` prints the entry for an agent (claude, codex, cursor, vscode, desktop)"


def _servers_summary(status: WorkspaceStatus) -> str:
    """`2 (1 ready, 1 failed)`."""
    servers = status.reconciler.servers
    states = [server.state for server in servers.values()]
    order = {"ready": 0, "starting": 1, "failed": 2}
    shown = sorted(set(states), key=lambda state: (order.get(state, len(order)), state))
    counts = ", ".join(f"{states.count(state)} {state}" for state in shown)
    return f"{len(servers)} ({counts})"


def _print_servers(status: WorkspaceStatus, indent: str) -> None:
    """One aligned line per server (`edge   ready, 3 tools`), its parser errors below it."""
    servers = status.reconciler.servers
    width = max((len(name) for name in servers), default=0)
    for name, server in sorted(servers.items()):
        _say(f"{indent}{name:<{width}}  {_server_line(server)}")
        for problem in server.parser_errors:
            _say(f"{indent}  parser error: {problem}")


def is_running(workspace: Path) -> bool:
    """Whether a supervisor runs for `workspace` (whatever its `ipybox.toml` holds)."""
    from ipybox.running.state import NotRunningError, read_state

    try:
        read_state(workspace)
    except NotRunningError:
        return False
    return True


def _not_running(workspace: Path, error: Exception) -> str:
    """Why nothing was found running, and, when `ipybox.toml` can't be loaded, where it was looked for."""
    problem = validate_quietly(workspace)
    if problem is None:
        return str(error)
    return (
        f"{error}; ipybox.toml can't be loaded, so its [workspace] state_dir is not known and only .ipybox "
        "was looked in (`ipybox validate` shows why)"
    )


def status(workspace: Path, as_json: bool) -> int:
    """Print what runs in the workspace; exit 1 when nothing does."""
    from ipybox.supervisor import NotRunningError

    try:
        info = asyncio.run(_status(workspace))
    except NotRunningError as e:
        reason = _not_running(workspace, e)
        if as_json:
            print(json.dumps({"running": False, "workspace": str(workspace), "reason": reason}, indent=2))
            return EXIT_ERROR
        return _fail(reason)
    if as_json:
        print(json.dumps({"running": True, **info.model_dump(mode="json")}, indent=2))
        return 0
    _say(f"ipybox is running in {info.workspace}")
    _field(
        "state",
        f"up {_span(info.uptime_s)} (since {_when(info.started_at)}), pid {info.pid}, {_sandbox(info)}",
    )
    _print_endpoint_lines(info)
    gateway = info.gateway
    gateway_state = "running" if gateway.running else "DOWN"
    if gateway.problem and not gateway.running:
        gateway_state += f" ({gateway.problem})"
    restarts = ", ".join(f"{part} {count}" for part, count in sorted(info.restarts.items()) if count)
    if gateway.url is not None:
        _field("gateway", f"remote, {gateway.url} (kernel spec {gateway.kernelspec}): {gateway_state}")
        _field("isolation", str(gateway.isolation))
        requested = ", ".join(f"{k}={v}" for k, v in gateway.requested_limits.items()) or "none"
        _field(
            "limits",
            f"requested of the gateway's kernel template: {requested} (enforced there, not by ipybox)",
        )
    else:
        pid = f" (pid {gateway.pid})" if gateway.pid is not None else ""
        _field("gateway", f"{gateway_state}{pid}")
    if restarts:
        _field("restarts", restarts)
    pool = info.pool
    leases = f"{info.leases} lease{'s' * (info.leases != 1)}"
    _field("kernels", f"{pool.idle} idle of {pool.size} in the warm pool, {pool.leased} leased ({leases})")
    if info.kernels is not None:
        _print_kernels(info.kernels)
    if info.pending_asks or info.console is not None:
        answer = (
            "the console or `ipybox approve` answers them"
            if info.console
            else "`ipybox approve` answers them"
        )
        _field("asks", f"{info.pending_asks} pending ({answer})")
    if info.reconciler.servers:
        _field("servers", _servers_summary(info))
        _print_servers(info, indent="    ")
    else:
        _field("servers", "none")
    if info.actions:
        _field("actions", str(len(info.actions)))
        width = max(len(action.name) for action in info.actions)
        for action in info.actions:
            stale = " (api.py changed since it was saved)" if action.stale else ""
            _say(f"    {action.name:<{width}}  MCP tool {action.tool}, may call {action.calls}{stale}")
    _print_policy(info)
    if info.config_error:
        _say(
            f"  ipybox.toml has an error (the last good configuration keeps running):\n    {info.config_error}"
        )
    return 0


_LABEL = 11  # "  isolation: " and the values after it line up


def _field(label: str, value: str) -> None:
    """One line of `status`: `  label:     value`, values aligned."""
    _say(f"  {label + ':':<{_LABEL}}{value}")


def _when(iso: str) -> str:
    """`2026-11-24 07:00:00 UTC` for an ISO 8601 time (as given when it is not one)."""
    from datetime import UTC, datetime

    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return iso


def _sandbox(info: WorkspaceStatus) -> str:
    if info.gateway.url is not None:
        return "kernels on a remote gateway"
    return "kernels sandboxed" if info.sandbox else "kernels NOT sandboxed"


def _print_endpoint_lines(info: WorkspaceStatus) -> None:
    """Where to reach the workspace: control socket (from `state.json`, when it can be read), MCP, console."""
    from ipybox.running.state import NotRunningError, read_state

    try:
        state = read_state(Path(info.workspace))
    except NotRunningError:  # it stopped since it answered: the rest of the status is still worth showing
        state = None
    if state is not None:
        _field("control", f"unix:{state.control_socket}  (token in {Path(info.state_dir) / 'state.json'})")
    if info.mcp:
        _field("mcp", f"{info.mcp}  (streamable HTTP, bearer token: `ipybox connect --http` prints it)")
    if info.console is not None:
        _field("console", f"{info.console}  (`ipybox console` prints a login link)")
    _field("connect", connect_hint(Path(info.workspace)))


def _print_policy(info: WorkspaceStatus) -> None:
    """The admin tiers, the rules that don't fit the live tools, and the tools that differ from their pins."""
    policy = info.policy
    for tier in policy.tiers:
        _say(f"  admin policy {tier}")
    for warning in policy.warnings:
        _say(f"  warning: {warning}")
    lint = info.reconciler.lint
    if lint:
        what = "refused on edit" if policy.lint == "error" else "warnings"
        _say(f"  approval rules that don't fit the live tools ([approval] lint = {policy.lint!r}: {what}):")
        for line in lint:
            _say(f"    {line}")
    if policy.pins_error:
        _say(f"  ipybox.lock: {policy.pins_error}")
    for server, lines in policy.pins.items():
        _say(
            f"  server {server} differs from ipybox.lock (its changed and new tools are decided "
            f"{policy.changed_tools!r}; `ipybox lock accept -w {info.workspace} {server}` accepts it):"
        )
        for line in lines:
            _say(f"    {line}")


def _print_kernels(health: KernelsStatus) -> None:
    """The limits once, what happens to idle kernels, then one line per kernel (leased ones first)."""
    from ipybox.limits import describe_limit, format_bytes

    if not health.reported:
        _field("usage", f"not known ({health.error})")
        return
    limits = ", ".join(describe_limit(name, value) for name, value in health.limits.items()) or "none"
    enforced = f" ({health.mechanism})" if health.mechanism else ""
    idle = f"deleted after {_span(health.max_idle)} idle" if health.max_idle is not None else "kept"
    if health.recycle_rss is not None:
        idle += f", recycled past {format_bytes(health.recycle_rss)}"
    if health.reaped or health.recycled:
        idle += f" ({health.reaped} deleted, {health.recycled} recycled so far)"
    _field("limits", f"{limits} per kernel{enforced}; idle leased kernels {idle}")
    for kernel in health.kernels:
        _say(f"    {_kernel_line(kernel, format_bytes)}")


def _kernel_line(kernel: KernelStatus, size: Callable[[float], str]) -> str:
    held = {"leased": f"lease {(kernel.lease or '')[:8]}", "pool": "warm pool"}.get(kernel.role, kernel.role)
    state = kernel.execution_state or "unknown"
    if kernel.idle_s is not None:
        state += f" {_span(kernel.idle_s)}"
    usage = kernel.usage
    if usage is None:
        return f"kernel {kernel.kernel_id[:8]}  {held:<14}  {state:<12}  usage not reported"
    parts = [
        f"RSS {size(usage.memory)}" if usage.memory is not None else "RSS ?",
        f"peak {size(usage.memory_peak)}" if usage.memory_peak is not None else "peak ?",
        f"CPU {usage.cpu_seconds:.2f} s" if usage.cpu_seconds is not None else "CPU ?",
        f"{usage.processes} processes" if usage.processes is not None else "processes ?",
    ]
    if usage.oom_kills:
        parts.append(f"{usage.oom_kills} killed for memory")
    return f"kernel {kernel.kernel_id[:8]}  {held:<14}  {state:<12}  {'  '.join(parts)}"


def _span(seconds: float) -> str:
    """`0.5 s`, `42 s`, `31 min`, `2.5 h`."""
    if seconds < 10:
        return f"{round(seconds, 1):g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _server_line(server: MCPServerStatus) -> str:
    """`ready, 3 tools`, `starting`, `failed (ipybox.toml:12:1): why`, and what else is known of it."""
    if server.error:
        where = f" ({server.location})" if server.location else ""
        return f"{server.state}{where}: {server.error}"
    line: str = server.state
    if server.tools is not None:
        line += f", {server.tools} tool{'s' * (server.tools != 1)}"
    line += f", parsers {', '.join(server.parsers)}" if server.parsers else ""
    line += f" (checking {', '.join(server.checking)})" if server.checking else ""
    return line + (f"; not running: {server.stopped}" if server.stopped else "")


def down(workspace: Path) -> int:
    """Stop the workspace's supervisor and wait until it is gone."""
    from ipybox.supervisor import ControlClient, NotRunningError, read_state

    try:
        state = read_state(workspace)
    except NotRunningError:
        # Nothing to stop is not a failure: after `ipybox down` the workspace is stopped, either way.
        _say(f"ipybox is not running in {workspace}: nothing to stop")
        if (workspace / "ipybox.toml").is_file() and validate_quietly(workspace) is not None:
            print(
                "ipybox: ipybox.toml can't be loaded, so its [workspace] state_dir is not known and only .ipybox "
                "was looked in (`ipybox validate` shows why)",
                file=sys.stderr,
            )
        return 0

    async def shutdown() -> None:
        async with ControlClient(state) as control:
            await control.shutdown()

    try:
        asyncio.run(shutdown())
    except Exception:
        os.kill(state.pid, 15)  # the control endpoint is unreachable: SIGTERM does the same
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(state.pid, 0)
        except ProcessLookupError:
            print(f"ipybox in {workspace} is down")
            return 0
        time.sleep(0.05)
    return _fail(f"the supervisor (pid {state.pid}) did not stop within 60 s")


def logs(workspace: Path, follow: bool) -> int:
    """Print the supervisor's log (and keep printing new lines with `follow`)."""
    from ipybox.running.state import StateDirError, StatePaths, open_state_file

    paths = StatePaths.of(workspace)
    try:  # never through a symlink a kernel planted in the state directory
        fd = open_state_file(paths, "logs/supervisor.log", os.O_RDONLY)
    except FileNotFoundError:
        return _fail(f"no log yet in {paths.log} (start the workspace with `ipybox up`)")
    except StateDirError as e:
        return _fail(str(e))
    # What servers wrote to their stderr is in the log, and the file is in a directory a kernel can't
    # reach but was written by older versions without escaping: every line is shown escaped.
    with os.fdopen(fd, errors="replace") as file:
        sys.stdout.write(printable(file.read(), lines=True))
        sys.stdout.flush()
        try:
            while follow:
                line = file.readline()
                if line:
                    sys.stdout.write(printable(line, lines=True))
                    sys.stdout.flush()
                else:
                    time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    return 0
