"""Soak: one running workspace (`ipybox up`, sandbox on) with a real MCP server, many sessions, many tool
calls, and one hostile kernel flooding the call channel. Ours only: ipybox 0.9.2 has no workspace that
sessions share, so there is nothing of the peer's to run it against.

`ipybox up` runs as a subprocess (the supervisor alone in its process, so its RSS and descriptors are its
own), with our edge-case MCP server (tests/servers/edge_server.py) as `edge`. Then:

1. Warm-up: `--warmup` sessions (not counted); the first call starts the server.
2. Quiet phase: `--runs` sessions (`CodeExecutor(workspace=...)` attach, one cell, detach), `--workers`
   at a time; each cell makes `--calls` calls of `edge.echo` through the generated API and times each in
   the kernel (`perf_counter` around `run()`), checking every answer.
3. Flood phase: a hostile session attaches and runs, in its kernel as agent code would (threads, raw
   sockets to `IPYBOX_TOOL_SERVER` with `IPYBOX_TOOL_TOKEN`), until told to stop:
   - `--idle` idle connections, held open and reopened when the server closes them;
   - `--oversized-rounds` rounds (default 4; 0: all phase long) of `--oversized-conns` request lines of
     `--oversized-mib` MiB without a newline, each held open a second (the default is bounded because
     today's supervisor keeps most of what it is sent: 21 rounds took it to 11 GiB);
   - garbage lines (not JSON, not an object, a wrong token, an unknown op), one per `--garbage-ms`;
   - `{"op": "reset"}` with its valid token, one per `--reset-ms`.
   Meanwhile another `--runs` sessions run exactly as in the quiet phase.

Every wait is bounded (`--phase-s` per phase, a deadline per cell enforced in the kernel), so a
supervisor that hangs under the flood ends the run with errors counted instead of hanging it.
The flood's rates are paced (`--garbage-ms`, `--reset-ms`) so that it measures how the supervisor copes
with abuse, not how two cores are shared with a kernel spinning in a loop (a CPU quota's business).

The script exits 1, after reporting everything, when the run misses the issue's bar: any error seen by
a well-behaved session or any of their calls not made, a flood/quiet median above 2x, or the
supervisor's peak RSS (`VmHWM`) more than `--rss-bound-mib` above its start.

Metrics (one JSON line each, see _protocol.py):
- `soak.quiet.call`, `soak.flood.call`: per-call latency of the well-behaved sessions (successful calls);
  status: errors those sessions saw (attach, cell, call, hung call, wrong answer; must be 0), info: p99,
  flood/quiet ratios of median, p90, p99.
- `soak.{quiet,flood}.attach`: `CodeExecutor(workspace=...).start()` of those sessions.
- `soak.{quiet,flood}.status`: the control endpoint's `status()` round trip, polled during the phase
  (what `ipybox status` waits for).
- `soak.supervisor`: no samples; status and info: the supervisor's RSS (`VmRSS` of /proc/<pid>/status)
  at start, after the quiet phase, peak (sampled and `VmHWM`) and at the end (the hostile session gone),
  and its open descriptors at start, peak and end.
- `soak.hostile`: no samples; what the flood did and what it was answered.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import inspect
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _protocol import emit, log, parse_args

from ipybox import CodeExecutor
from ipybox.supervisor import ControlClient

EDGE = Path(__file__).resolve().parents[2] / "tests" / "servers" / "edge_server.py"
IPYBOX = Path(sys.executable).parent / "ipybox"

READY_TIMEOUT_S = 180.0  # `ipybox up` until the pool is warm and `edge` is generated
ATTACH_TIMEOUT_S = 60.0
DETACH_TIMEOUT_S = 60.0
CELL_DEADLINE_S = 60.0  # a well-behaved cell's calls, enforced in the kernel
STATUS_EVERY_S = 2.0
STATUS_TIMEOUT_S = 30.0
SETTLE_S = 3.0  # after the hostile session left, before the end RSS is read

# The well-behaved sessions' cell. The calls run in a thread the cell waits for with a deadline: a call
# that never returns (the tool runner has no timeout of its own) is reported as hung instead of hanging
# the cell, and the samples taken before it are kept.
CALLS_CELL = """
import json as _json, threading as _threading, time as _time
from mcptools.edge.echo import Params as _Params, run as _run
_soak = {{"samples": [], "errors": [], "done": False}}
def _soak_calls():
    for _i in range({calls}):
        _text = f"soak {session} {{_i}}"
        _t = _time.perf_counter()
        try:
            _answer = _run(_Params(text=_text))
        except Exception as _e:
            _soak["errors"].append(f"{{type(_e).__name__}}: {{_e}}"[:300])
            continue
        _ms = (_time.perf_counter() - _t) * 1000
        if _answer != _text:
            _soak["errors"].append(f"wrong answer: {{str(_answer)[:100]!r}}")
        else:
            _soak["samples"].append(_ms)
    _soak["done"] = True
_thread = _threading.Thread(target=_soak_calls, daemon=True)
_thread.start()
_thread.join({deadline})
if not _soak["done"]:
    _made = len(_soak["samples"]) + len(_soak["errors"])
    _soak["errors"].append(f"hung: call {{_made + 1}} of {calls} did not return within {deadline:.0f} s")
print(_json.dumps(_soak))
"""


class Flood:
    """The hostile kernel's flood of the call channel. Its source is sent to the kernel: standard library
    only, and everything it needs is imported in its methods."""

    def __init__(
        self,
        idle: int,
        oversized_mib: int,
        oversized_conns: int,
        oversized_rounds: int,
        garbage_s: float,
        reset_s: float,
        max_s: float,
    ) -> None:
        import collections
        import os
        import threading
        import time

        self.address = os.environ["IPYBOX_TOOL_SERVER"]
        self.token = os.environ["IPYBOX_TOOL_TOKEN"]
        self.idle, self.oversized_mib, self.oversized_conns = idle, oversized_mib, oversized_conns
        self.oversized_rounds = oversized_rounds
        self.garbage_s, self.reset_s = garbage_s, reset_s
        self.deadline = time.monotonic() + max_s  # stops by itself should nobody tell it to
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples: dict[str, list[str]] = {}
        self.idle_socks: list[Any] = []
        self.idle_peak = 0
        self.threads: list[threading.Thread] = []

    def stopped(self) -> bool:
        import time

        return self.stopping.is_set() or time.monotonic() > self.deadline

    def count(self, what: str, example: str = "") -> None:
        with self.lock:
            self.counts[what] += 1
            if example and len(self.samples.setdefault(what, [])) < 3:
                self.samples[what].append(example[:200])

    def connect(self, retry_s: float = 10.0) -> Any:
        """A new connection; a full accept queue (`EAGAIN` on a Unix socket) is retried for `retry_s`."""
        import time

        give_up = time.monotonic() + retry_s
        while True:
            try:
                return self.connect_once()
            except (BlockingIOError, TimeoutError):
                if time.monotonic() > give_up or self.stopped():
                    raise
                time.sleep(0.05)

    def connect_once(self, timeout: float = 2.0) -> Any:
        import socket

        if self.address.startswith("unix:"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = self.address[len("unix:") :]
        else:
            host, _, port = self.address[len("tcp://") :].rstrip("/").rpartition(":")
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            target = (host.strip("[]"), int(port))
        sock.settimeout(timeout)
        try:
            sock.connect(target)
        except OSError:
            sock.close()
            raise
        return sock

    def answer(self, sock: Any, timeout: float = 5.0) -> str:
        """The answer line, or what happened instead (`closed`, `no answer`, the error)."""
        sock.settimeout(timeout)
        data = b""
        try:
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    return "closed" if not data else f"closed mid-answer: {data[:100]!r}"
                data += chunk
        except TimeoutError:
            return "no answer"
        except OSError as e:
            return f"{type(e).__name__}"
        return data.decode(errors="replace").strip()

    def kind(self, answer: str) -> str:
        import json

        try:
            parsed = json.loads(answer)
        except ValueError:
            return answer[:60]
        if isinstance(parsed, dict) and "error" in parsed:
            return f"error {parsed['error'].get('type')}"
        return "ok " + ",".join(sorted(parsed)) if isinstance(parsed, dict) else "?"

    def start(self) -> None:
        import resource
        import threading

        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # as many sockets as the host allows
        for target in (self.hold_idle, self.oversized, self.garbage, self.resets):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.threads.append(thread)

    def hold_idle(self) -> None:
        """Opens `idle` connections that send nothing; reopens those the server closes."""
        import select
        import time

        failures = 0
        next_check = time.monotonic()
        while not self.stopped():
            if len(self.idle_socks) < self.idle:
                try:
                    self.idle_socks.append(self.connect_once())
                    self.count("idle opened")
                    failures = 0
                    self.idle_peak = max(self.idle_peak, len(self.idle_socks))
                except OSError as e:
                    self.count("idle connect failed", f"{type(e).__name__}: {e}")
                    failures += 1
                    if failures >= 20:
                        time.sleep(0.5)
                if time.monotonic() < next_check:
                    continue
            else:
                time.sleep(0.2)
            next_check = time.monotonic() + 1.0
            # Connections the server closed (an idle timeout, a cap) read as ready: reopen them.
            poller = select.poll()
            by_fd = {sock.fileno(): sock for sock in self.idle_socks}
            for fd in by_fd:
                poller.register(fd, select.POLLIN | select.POLLHUP)
            closed = {fd for fd, _ in poller.poll(0)}
            if closed:
                for fd in closed:
                    by_fd[fd].close()
                    self.count("idle closed by server")
                self.idle_socks = [sock for fd, sock in by_fd.items() if fd not in closed]

    def oversized(self) -> None:
        """`oversized_rounds` rounds (0: until stopped) of `oversized_conns` connections, each sending a line
        of `oversized_mib` MiB without a newline."""
        import threading
        import time

        chunk = b"x" * (1024 * 1024)

        def one() -> None:
            try:
                sock = self.connect()
            except OSError as e:
                self.count("oversized connect failed", f"{type(e).__name__}: {e}")
                return
            sent = 0
            outcome = "sent whole"
            try:
                sock.settimeout(10)
                while sent < self.oversized_mib and not self.stopped():
                    sock.sendall(chunk)
                    sent += 1
            except TimeoutError:
                outcome = "server stopped reading"
            except OSError as e:
                outcome = f"cut off ({type(e).__name__})"
            answer = self.answer(sock, timeout=0.5)
            with self.lock:
                self.counts["oversized MiB sent"] += sent
            self.count(f"oversized {outcome}, then: {self.kind(answer)}", f"after {sent} MiB")
            # Held open a while, like a client that is slow to finish its line.
            for _ in range(10):
                if self.stopped():
                    break
                time.sleep(0.1)
            sock.close()

        rounds = 0
        while not self.stopped() and (self.oversized_rounds == 0 or rounds < self.oversized_rounds):
            rounds += 1
            workers = [threading.Thread(target=one, daemon=True) for _ in range(self.oversized_conns)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            self.count("oversized rounds")

    def garbage(self) -> None:
        """Lines that are not valid requests, on a connection reopened whenever the server closes it."""
        import json
        import time

        lines = [
            b"\x00\xff garbage, not JSON \xfe\n",
            b"[1, 2, 3]\n",
            json.dumps({"op": "run", "token": "not-the-token", "server": "edge"}).encode() + b"\n",
            json.dumps({"op": "no-such-op", "token": self.token}).encode() + b"\n",
            b"\n",
        ]
        sock = None
        i = 0
        while not self.stopped():
            try:
                if sock is None:
                    sock = self.connect()
                sock.sendall(lines[i % len(lines)])
                answer = self.answer(sock)
            except OSError as e:
                answer = f"{type(e).__name__}"
            self.count(f"garbage -> {self.kind(answer)}")
            i += 1
            if not answer.startswith("{") or '"unauthorized"' in answer or '"bad_request"' in answer:
                if sock is not None:
                    sock.close()
                sock = None  # closed (or about to be) by the server: reconnect
            if self.garbage_s:
                time.sleep(self.garbage_s)
        if sock is not None:
            sock.close()

    def resets(self) -> None:
        """`{"op": "reset"}` with this kernel's valid token, again and again."""
        import json
        import time

        line = json.dumps({"op": "reset", "token": self.token}).encode() + b"\n"
        sock = None
        while not self.stopped():
            try:
                if sock is None:
                    sock = self.connect()
                sock.sendall(line)
                answer = self.answer(sock, timeout=30)
            except OSError as e:
                answer = f"{type(e).__name__}"
            self.count(f"reset -> {self.kind(answer)}")
            if not answer.startswith("{") and sock is not None:
                sock.close()
                sock = None
            time.sleep(self.reset_s)
        if sock is not None:
            sock.close()

    def stop(self) -> str:
        import json

        self.stopping.set()
        for thread in self.threads:
            thread.join(15)
        for sock in self.idle_socks:
            sock.close()
        alive = sum(thread.is_alive() for thread in self.threads)
        return json.dumps(
            {
                "counts": dict(self.counts),
                "examples": self.samples,
                "idle_peak": self.idle_peak,
                "threads_stuck": alive,
            }
        )


FLOOD_START = """
from typing import Any
{source}
_flood = Flood({idle}, {oversized_mib}, {oversized_conns}, {oversized_rounds}, {garbage_s}, {reset_s}, {max_s})
_flood.start()
import time as _time
_until = _time.monotonic() + 20  # let the idle connections pile up before the others are timed
while _flood.idle_peak < {idle} and _time.monotonic() < _until:
    _time.sleep(0.1)
print(_flood.idle_peak)
"""


@dataclass
class Monitor:
    """Samples the supervisor's RSS and open descriptors from a thread (the event loop may be busy)."""

    pid: int
    rss_kib: int = 0
    fds: int = 0
    peak_rss_kib: int = 0
    peak_fds: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def status_kib(self, key: str) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        return 0

    def sample(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.rss_kib = self.status_kib("VmRSS")
            self.fds = len(os.listdir(f"/proc/{self.pid}/fd"))
            self.peak_rss_kib = max(self.peak_rss_kib, self.rss_kib)
            self.peak_fds = max(self.peak_fds, self.fds)

    def start(self) -> None:
        def run() -> None:
            while not self._stop.wait(0.1):
                self.sample()

        self.sample()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def reset_peaks(self) -> None:
        self.sample()
        self.peak_rss_kib, self.peak_fds = self.rss_kib, self.fds

    def now(self) -> dict[str, float]:
        self.sample()
        return {"rss_mib": round(self.rss_kib / 1024, 1), "fds": self.fds}


@dataclass
class Phase:
    name: str
    calls_ms: list[float] = field(default_factory=list)
    attach_ms: list[float] = field(default_factory=list)
    status_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # seen by the well-behaved sessions
    status_errors: list[str] = field(default_factory=list)
    sessions_done: int = 0
    sessions_skipped: int = 0


async def wait_ready(workspace: Path, supervisor: subprocess.Popen[bytes], warm_pool: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if supervisor.poll() is not None:
            raise RuntimeError(f"ipybox up exited with {supervisor.returncode} (see soak.supervisor.log)")
        with contextlib.suppress(Exception):
            async with ControlClient.of(workspace) as control:
                status = await control.status()
            edge = status.reconciler.servers.get("edge")
            if edge is not None and edge.state == "ready" and status.pool.idle >= warm_pool:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"ipybox up was not ready within {READY_TIMEOUT_S:.0f} s")


async def one_session(workspace: Path, index: int, calls: int, deadline: float, phase: Phase) -> None:
    executor = CodeExecutor(workspace=workspace)
    started = time.perf_counter()
    try:
        await asyncio.wait_for(executor.start(), ATTACH_TIMEOUT_S)
    except Exception as e:  # an error of this session's, whatever it is
        phase.errors.append(f"attach: {type(e).__name__}: {e}"[:300])
        with contextlib.suppress(Exception):
            await asyncio.wait_for(executor.stop(), DETACH_TIMEOUT_S)
        return
    phase.attach_ms.append((time.perf_counter() - started) * 1000)
    try:
        cell_deadline = max(5.0, min(CELL_DEADLINE_S, deadline - time.monotonic()))
        code = CALLS_CELL.format(calls=calls, session=index, deadline=cell_deadline)
        result = await executor.execute(code, timeout=cell_deadline + 30)
        report = json.loads((result.text or "").strip().splitlines()[-1])
        phase.calls_ms += report["samples"]
        phase.errors += report["errors"]
    except Exception as e:
        phase.errors.append(f"cell: {type(e).__name__}: {e}"[:300])
    finally:
        try:
            await asyncio.wait_for(executor.stop(), DETACH_TIMEOUT_S)
        except Exception as e:
            phase.errors.append(f"detach: {type(e).__name__}: {e}"[:300])
    phase.sessions_done += 1


async def poll_status(workspace: Path, phase: Phase, stop: asyncio.Event) -> None:
    """The control endpoint's `status()` round trip, every STATUS_EVERY_S, while the phase runs."""
    while not stop.is_set():
        started = time.perf_counter()
        try:
            async with ControlClient.of(workspace) as control:
                await asyncio.wait_for(control.status(), STATUS_TIMEOUT_S)
            phase.status_ms.append((time.perf_counter() - started) * 1000)
        except Exception as e:
            phase.status_errors.append(f"{type(e).__name__}: {e}"[:300])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), STATUS_EVERY_S)


async def run_phase(name: str, workspace: Path, first: int, sessions: int, args: argparse.Namespace) -> Phase:
    phase = Phase(name)
    deadline = time.monotonic() + args.phase_s
    queue = collections.deque(range(first, first + sessions))

    async def worker() -> None:
        while queue:
            index = queue.popleft()
            if time.monotonic() > deadline:
                phase.sessions_skipped += 1
                continue
            await one_session(workspace, index, args.calls, deadline, phase)

    stop = asyncio.Event()
    poller = asyncio.create_task(poll_status(workspace, phase, stop))
    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(args.workers)))
    stop.set()
    await poller
    log(
        f"{name}: {phase.sessions_done} sessions, {len(phase.calls_ms)} calls ok, {len(phase.errors)} errors, "
        f"{phase.sessions_skipped} sessions skipped (phase deadline), {time.monotonic() - started:.1f} s"
    )
    return phase


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def errors_status(phase: Phase, sessions: int, calls: int) -> str:
    made = len(phase.calls_ms)
    head = f"{made}/{sessions * calls} calls ok in {phase.sessions_done}/{sessions} sessions"
    if phase.sessions_skipped:
        head += f" ({phase.sessions_skipped} not started: phase deadline)"
    if not phase.errors:
        return f"{head}; 0 errors"
    kinds = collections.Counter(
        error.split(":")[0] + ": " + error.split(":", 2)[-1][:90] for error in phase.errors
    )
    listed = "; ".join(f"{count}x {kind.strip()}" for kind, count in kinds.most_common(4))
    return f"{head}; {len(phase.errors)} ERRORS: {listed}"


def emit_phase(phase: Phase, sessions: int, calls: int, quiet: Phase | None) -> None:
    info: dict[str, Any] = {
        "errors": len(phase.errors),
        "sessions": phase.sessions_done,
        "calls_ok": len(phase.calls_ms),
    }
    if phase.calls_ms:
        for q in (0.5, 0.9, 0.99):
            info[f"p{round(q * 100)}_ms"] = round(percentile(phase.calls_ms, q), 3)
    if quiet is not None and quiet.calls_ms and phase.calls_ms:
        for q in (0.5, 0.9, 0.99):
            ratio = percentile(phase.calls_ms, q) / percentile(quiet.calls_ms, q)
            info[f"ratio_p{round(q * 100)}"] = round(ratio, 2)
    info["error_examples"] = phase.errors[:5]
    status = errors_status(phase, sessions, calls)
    if "p99_ms" in info:
        status += f"; p99 {info['p99_ms']:.2f} ms"
    if "ratio_p50" in info:
        status += (
            f"; flood/quiet median {info['ratio_p50']}x, p90 {info['ratio_p90']}x, p99 {info['ratio_p99']}x"
        )
    emit(f"soak.{phase.name}.call", phase.calls_ms, status=status, info=info)
    emit(f"soak.{phase.name}.attach", phase.attach_ms)
    status_errors = collections.Counter(phase.status_errors)
    emit(
        f"soak.{phase.name}.status",
        phase.status_ms,
        status="; ".join(f"{n}x failed: {error}" for error, n in status_errors.most_common(3)) or None,
    )


def verdict(quiet: Phase, flood: Phase, args: argparse.Namespace, rss_growth_mib: float) -> list[str]:
    """What keeps this run from meeting the issue's bar (empty: it meets it)."""
    failures = []
    expected = args.runs * args.calls
    for phase in (quiet, flood):
        if phase.errors or len(phase.calls_ms) < expected:
            failures.append(
                f"{phase.name}: {len(phase.calls_ms)}/{expected} calls ok, {len(phase.errors)} errors seen by "
                "the well-behaved sessions (must be 0)"
            )
    if quiet.calls_ms and flood.calls_ms:
        ratio = statistics.median(flood.calls_ms) / statistics.median(quiet.calls_ms)
        if ratio > 2.0:
            failures.append(f"flood/quiet median call latency {ratio:.2f}x (target <= 2x)")
    if rss_growth_mib > args.rss_bound_mib:
        failures.append(
            f"supervisor peak RSS grew {rss_growth_mib:.0f} MiB over its start (bound {args.rss_bound_mib:g} MiB)"
        )
    return failures


async def flood_phase(workspace: Path, first: int, args: argparse.Namespace) -> tuple[Phase, dict[str, Any]]:
    hostile = CodeExecutor(workspace=workspace)
    await asyncio.wait_for(hostile.start(), ATTACH_TIMEOUT_S)
    stats: dict[str, Any] = {}
    try:
        source = inspect.getsource(Flood)
        start = FLOOD_START.format(
            source=source,
            idle=args.idle,
            oversized_mib=args.oversized_mib,
            oversized_conns=args.oversized_conns,
            oversized_rounds=args.oversized_rounds,
            garbage_s=args.garbage_ms / 1000,
            reset_s=args.reset_ms / 1000,
            max_s=args.phase_s + 120,
        )
        result = await hostile.execute(start, timeout=60)
        log(f"flood started: {(result.text or '').strip()} idle connections open")
        phase = await run_phase("flood", workspace, first, args.runs, args)
        try:
            result = await hostile.execute("print(_flood.stop())", timeout=60)
            stats = json.loads((result.text or "").strip().splitlines()[-1])
        except Exception as e:
            stats = {"stop_failed": f"{type(e).__name__}: {e}"[:300]}
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(hostile.stop(), DETACH_TIMEOUT_S)
    return phase, stats


def stop_supervisor(supervisor: subprocess.Popen[bytes]) -> None:
    if supervisor.poll() is None:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(60)
        except subprocess.TimeoutExpired:
            log("ipybox up did not stop within 60 s of SIGTERM: killing it")
            supervisor.kill()
            supervisor.wait()


async def main() -> list[str]:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--calls", type=int, default=100, help="tool calls per session")
    extra.add_argument("--workers", type=int, default=2, help="well-behaved sessions at a time")
    extra.add_argument("--idle", type=int, default=5000, help="idle connections the hostile kernel holds")
    extra.add_argument("--oversized-mib", type=int, default=200, help="size of each oversized request line")
    extra.add_argument("--oversized-conns", type=int, default=4, help="oversized lines per round")
    # Bounded by default: today's supervisor keeps most of what it was sent (11 GiB after 21 rounds).
    extra.add_argument(
        "--oversized-rounds", type=int, default=4, help="rounds of oversized lines (0: all phase)"
    )
    extra.add_argument("--garbage-ms", type=float, default=1.0, help="pause between garbage lines")
    extra.add_argument("--reset-ms", type=float, default=100.0, help="pause between reset ops")
    extra.add_argument("--phase-s", type=float, default=120.0, help="no session starts later in a phase")
    extra.add_argument(
        "--rss-bound-mib",
        type=float,
        default=256.0,
        help="allowed growth of the supervisor's peak RSS over start",
    )
    args = parse_args(__doc__ or "", default_runs=50, default_warmup=2, extra=extra)

    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        workspace = Path(tmp)
        warm_pool = args.workers + 1
        (workspace / "ipybox.toml").write_text(
            f"[kernel]\nwarm_pool = {warm_pool}\n[sandbox]\nenabled = true\n"
            f'[approval]\ndefault = "allow"\n'
            f'[servers.edge]\ncommand = "{sys.executable}"\nargs = ["{EDGE}"]\n'
        )
        with open(Path.cwd() / "soak.supervisor.log", "wb") as supervisor_log:
            # Same process group as this script: whatever it leaves behind, the bench runner ends.
            supervisor = subprocess.Popen(
                [str(IPYBOX), "up", str(workspace)],
                stdin=subprocess.DEVNULL,
                stdout=supervisor_log,
                stderr=subprocess.STDOUT,
            )
        monitor = Monitor(supervisor.pid)
        try:
            await wait_ready(workspace, supervisor, warm_pool)
            monitor.start()
            at_start = monitor.now()
            log(f"ipybox up ready (pid {supervisor.pid}): {at_start}")

            warmup = await run_phase("warmup", workspace, 0, args.warmup, args)
            if warmup.errors:
                log(f"warm-up errors: {warmup.errors[:3]}")
            quiet = await run_phase("quiet", workspace, args.warmup, args.runs, args)
            emit_phase(quiet, args.runs, args.calls, None)
            after_quiet = monitor.now()
            peak_quiet = {"rss_mib": round(monitor.peak_rss_kib / 1024, 1), "fds": monitor.peak_fds}

            monitor.reset_peaks()
            flood, stats = await flood_phase(workspace, args.warmup + args.runs, args)
            emit_phase(flood, args.runs, args.calls, quiet)
            peak = {"rss_mib": round(monitor.peak_rss_kib / 1024, 1), "fds": monitor.peak_fds}
            await asyncio.sleep(SETTLE_S)
            end = monitor.now()
            hwm = round(monitor.status_kib("VmHWM") / 1024, 1)
            emit(
                "soak.supervisor",
                [],
                status=(
                    f"RSS MiB: start {at_start['rss_mib']}, after quiet {after_quiet['rss_mib']}, flood peak "
                    f"{peak['rss_mib']} (VmHWM {hwm}), end {end['rss_mib']}; open fds: start {at_start['fds']}, "
                    f"quiet peak {peak_quiet['fds']}, flood peak {peak['fds']}, end {end['fds']}"
                ),
                info={
                    "start": at_start,
                    "after_quiet": after_quiet,
                    "quiet_peak": peak_quiet,
                    "flood_peak": peak,
                    "vm_hwm_mib": hwm,
                    "end": end,
                },
            )
            counts = stats.get("counts", {})
            summary = ", ".join(f"{kind}: {n}" for kind, n in sorted(counts.items()))
            emit(
                "soak.hostile",
                [],
                status=f"idle peak {stats.get('idle_peak')}; {summary}"
                if counts
                else json.dumps(stats)[:500],
                info=stats,
            )
            return verdict(quiet, flood, args, hwm - at_start["rss_mib"])
        finally:
            monitor.stop()
            stop_supervisor(supervisor)
            log(f"ipybox up exited with {supervisor.returncode}")


if __name__ == "__main__":
    problems = asyncio.run(main())
    if problems:
        # Last on stderr, so the bench report's tail of a failed script shows it.
        log("soak FAILED: " + "; ".join(problems))
        sys.exit(1)
    log("soak passed: 0 errors, latency and RSS within their bounds")
