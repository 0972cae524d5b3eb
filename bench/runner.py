"""Runs one scenario script on one side as a subprocess and collects what it reports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.paths import OURS_PYTHON, PEER_PYTHON, SCENARIOS_DIR, SCRATCH_DIR
from bench.registry import Job, Side

# After a script exits, give its children this long to finish shutting down before counting them as
# left behind (a stop that returns before its processes are gone is worth knowing about).
_LEFTOVER_GRACE_S = 1.0


@dataclass(frozen=True)
class MetricResult:
    samples_ms: list[float]
    status: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobRun:
    job: Job
    side: Side
    command: list[str]
    metrics: dict[str, MetricResult]
    returncode: int | None  # None: killed at the timeout
    wall_s: float
    stderr_tail: str
    leftover_processes: list[str]
    load_before: float  # 1-minute load average when the job started: was something else running?

    @property
    def failed(self) -> bool:
        return self.returncode != 0


def python_for(side: Side) -> Path:
    return PEER_PYTHON if side is Side.PEER else OURS_PYTHON


def build_command(job: Job, side: Side, runs: int | None, warmup: int | None) -> list[str]:
    command = [str(python_for(side)), str(SCENARIOS_DIR / job.script), "--runs", str(runs or job.runs)]
    if warmup is not None:
        command += ["--warmup", str(warmup)]
    return [*command, *job.args, *job.side_args.get(side, ())]


def _environment(side: Side) -> dict[str, str]:
    env = dict(os.environ)
    # Behave like an activated venv of that side, and let nothing from the caller leak in.
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        env.pop(name, None)
    bin_dir = python_for(side).parent
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def parse_results(stdout: str) -> dict[str, MetricResult]:
    metrics: dict[str, MetricResult] = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict) or "scenario" not in record:
            continue
        metrics[str(record["scenario"])] = MetricResult(
            samples_ms=[float(s) for s in record.get("samples_ms", [])],
            status=record.get("status"),
            info=dict(record.get("info") or {}),
        )
    return metrics


def _process_group_members(pgid: int) -> list[str]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(cmdline.strip()[:120] or entry.name)
    return members


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def run_job(job: Job, side: Side, runs: int | None = None, warmup: int | None = None) -> JobRun:
    command = build_command(job, side, runs, warmup)
    cwd = SCRATCH_DIR / side.value
    cwd.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    # Output goes to files, not pipes: a child that outlives the script would keep a pipe open and
    # make reading it wait for that child.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        # A session of its own: every process the scenario starts (gateway, kernels, MCP servers)
        # shares its process group, so whatever outlives the script can be found and ended by that id.
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=_environment(side),
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        returncode: int | None
        try:
            returncode = process.wait(timeout=job.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.wait()
            returncode = None
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    wall_s = time.perf_counter() - started
    leftovers = _process_group_members(process.pid)
    if leftovers:
        time.sleep(_LEFTOVER_GRACE_S)
        leftovers = _process_group_members(process.pid)
        _kill_group(process.pid)
    if returncode != 0:
        # Keep the full stderr where it can be read; the report shows only its tail.
        log = cwd / f"{Path(job.script).stem}.stderr.log"
        log.write_text(stderr)
        print(f"[bench] {side.value} {job.title} failed; stderr in {log}", file=sys.stderr)
    return JobRun(
        job=job,
        side=side,
        command=command,
        metrics=parse_results(stdout),
        returncode=returncode,
        wall_s=wall_s,
        stderr_tail="\n".join(stderr.strip().splitlines()[-6:]),
        leftover_processes=leftovers,
        load_before=load_before,
    )
