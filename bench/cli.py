"""``python -m bench <suite>... [--peer] [--runs N] [--json FILE]``: run suites, print the table."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.paths import OURS_PYTHON, REPO_ROOT
from bench.peer import ensure_peer_venv, peer_version
from bench.registry import Side, Suite, suites
from bench.report import Results, render, write_json
from bench.runner import JobRun, run_job

# Above this 1-minute load average per core the machine is busy with something else: numbers taken
# now are not comparable with quiet-machine numbers, so say so (but measure anyway).
_BUSY_LOAD_PER_CORE = 0.5


def _parse_args(argv: list[str] | None, known: dict[str, Suite]) -> argparse.Namespace:
    listing = "\n".join(f"  {name:10} {suite.description}" for name, suite in sorted(known.items()))
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="ipybox benchmarks, optionally side by side with the published ipybox 0.9.2.",
        epilog=f"suites:\n{listing}\n  all        every suite above",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("suites", nargs="+", metavar="suite", choices=[*known, "all"])
    parser.add_argument("--peer", action="store_true", help="also run ipybox 0.9.2 (creates its venv once)")
    parser.add_argument("--runs", type=int, help="measured samples per scenario (overrides each default)")
    parser.add_argument("--warmup", type=int, help="warm-up samples per scenario (overrides each default)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every scenario this many times per side, alternating sides, and pool the samples "
        "(spreads slow drifts in machine load over both sides)",
    )
    parser.add_argument("--only", metavar="TEXT", help="only scenario scripts whose command contains TEXT")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every sample to FILE")
    return parser.parse_args(argv)


def _load() -> tuple[float, float, float]:
    return os.getloadavg()


def _ours_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def _meta(with_peer: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "ours": _ours_revision(),
        "ours_python": str(OURS_PYTHON),
        "load_before": _load(),
    }
    if with_peer:
        meta["peer"] = f"ipybox {peer_version()}"
    return meta


def _warn_if_busy(when: str) -> None:
    one_minute = _load()[0]
    if one_minute > _BUSY_LOAD_PER_CORE * (os.cpu_count() or 1):
        print(f"[bench] warning: load average {one_minute:.2f} {when}; numbers may be noisy", file=sys.stderr)


def _run_jobs(selected: list[Suite], args: argparse.Namespace) -> list[JobRun]:
    runs: list[JobRun] = []
    for suite in selected:
        for job in suite.jobs:
            if args.only and args.only not in job.title:
                continue
            sides = [side for side in job.sides if args.peer or side is not Side.PEER]
            for round_index in range(args.rounds):
                # Back to back, never concurrently: the two sides must not compete for the cores.
                # Odd rounds reverse the order, so neither side always runs right after the other.
                for side in sides if round_index % 2 == 0 else reversed(sides):
                    progress = f"{suite.name}: {job.title} [{side.value}]"
                    if args.rounds > 1:
                        progress += f" round {round_index + 1}/{args.rounds}"
                    print(f"[bench] {progress} ...", file=sys.stderr, flush=True)
                    run = run_job(job, side, args.runs, args.warmup)
                    print(f"[bench]   {run.wall_s:.1f} s, exit {run.returncode}", file=sys.stderr, flush=True)
                    runs.append(run)
    return runs


def _load_line(meta: dict[str, Any], runs: list[JobRun]) -> str:
    before = ", ".join(f"{x:.2f}" for x in meta["load_before"])
    after = ", ".join(f"{x:.2f}" for x in meta["load_after"])
    line = f"{meta['cpus']} cpus; load average before: {before}; after: {after}"
    if runs:
        at_starts = [run.load_before for run in runs]
        line += f"; 1-min load at job starts {min(at_starts):.2f}..{max(at_starts):.2f}"
    return line


def main(argv: list[str] | None = None) -> int:
    known = suites()
    args = _parse_args(argv, known)
    selected = (
        list(known.values()) if "all" in args.suites else [known[name] for name in dict.fromkeys(args.suites)]
    )
    if args.peer:
        ensure_peer_venv()
    meta = _meta(args.peer)
    _warn_if_busy("before the run")
    runs = _run_jobs(selected, args)
    meta["load_after"] = _load()
    _warn_if_busy("after the run")

    results = Results(runs)
    print(f"ours {meta['ours']}" + (f" vs peer {meta['peer']}" if args.peer else ""))
    print(_load_line(meta, runs))
    print(render(selected, results, with_peer=args.peer))
    if args.json:
        write_json(args.json, selected, results, meta)
        print(f"\nsamples written to {args.json}")
    return 1 if any(run.failed for run in runs) else 0
