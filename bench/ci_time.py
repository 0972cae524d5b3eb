"""CI wall time per commit: runs CI (`bash .ci/run`), appends its wall time, commit and pass count to
`bench/ci_times.tsv`, and prints the record's tail, so a run that got slower shows next to the ones before.

    python3 bench/ci_time.py                    # run `bash .ci/run` here, record it
    python3 bench/ci_time.py -- bash .ci/run -x # any command (after --)
    python3 bench/ci_time.py --record 17:22 --passed 2952 --note "fresh clone"   # a run timed elsewhere

Standard library only, run by the system's python3: in a fresh clone there is no .venv before CI made it.
The exit status is the command's. Commit the updated record with the change it measured.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = Path(__file__).resolve().parent / "ci_times.tsv"
COLUMNS = ("date", "commit", "wall", "passed", "failed", "exit", "note")
BUDGET_S = 20 * 60  # issue 33: `bash .ci/run` in a fresh clone on a 2-core machine
TAIL = 12


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{round(seconds % 60):02d}"


def seconds(wall: str) -> float:
    """`17:22` (minutes:seconds) or `35` (minutes) in seconds."""
    if ":" in wall:
        m, s = wall.split(":")
        return int(m) * 60 + int(s)
    return float(wall) * 60


def commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def counts(output: str) -> tuple[int | None, int]:
    """Passed and failed (failures and errors) from pytest's last summary line in `output`."""
    summaries = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|errors?)\b", line)]
    if not summaries:
        return None, 0
    last = summaries[-1]

    def count(what: str) -> int:
        found = re.search(rf"(\d+) {what}\b", last)
        return int(found.group(1)) if found else 0

    return count("passed"), count("failed") + count("errors?")


def run(command: list[str]) -> tuple[float, int, str]:
    """Run `command` in the repository root, its output passed through; (wall seconds, status, output tail)."""
    tail: collections.deque[str] = collections.deque(maxlen=400)
    started = time.monotonic()
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            tail.append(line)
    return time.monotonic() - started, process.returncode, "".join(tail)


def append(row: dict[str, str]) -> None:
    new = not RECORD.exists()
    with RECORD.open("a") as f:
        if new:
            f.write("\t".join(COLUMNS) + "\n")
        f.write("\t".join(row.get(column, "").replace("\t", " ") for column in COLUMNS) + "\n")


def rows() -> list[dict[str, str]]:
    lines = RECORD.read_text().splitlines() if RECORD.exists() else []
    return [dict(zip(COLUMNS, line.split("\t"), strict=False)) for line in lines[1:] if line.strip()]


def report() -> None:
    record = rows()
    print(f"\n== CI wall time ({RECORD.relative_to(ROOT)}, last {min(TAIL, len(record))} of {len(record)})")
    for row in record[-TAIL:]:
        over = "  OVER BUDGET" if seconds(row["wall"]) > BUDGET_S else ""
        print(
            f"{row['date']:10}  {row['commit']:16} {row['wall']:>6}  {row['passed'] or '-':>5} passed"
            f"  {row['failed'] or '-':>3} failed  {row['note']}{over}"
        )
    if len(record) >= 2:
        last = seconds(record[-1]["wall"])
        before = statistics.median(seconds(row["wall"]) for row in record[-6:-1])
        print(
            f"last {minutes(last)} vs median of the 5 before {minutes(before)} ({last / before - 1:+.0%}); "
            f"budget {minutes(BUDGET_S)}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--record", metavar="M:SS", help="record a run timed elsewhere instead of running one"
    )
    parser.add_argument("--passed", type=int, help="with --record: how many tests passed")
    parser.add_argument("--failed", type=int, help="with --record: how many failed or errored")
    parser.add_argument("--commit", help="the commit measured (default: this checkout's HEAD)")
    parser.add_argument("--note", default="", help="e.g. 'fresh clone, 2 cores'")
    parser.add_argument("command", nargs="*", help="default: bash .ci/run")
    args = parser.parse_args()

    today = datetime.date.today().isoformat()
    if args.record is not None:
        row = {"wall": minutes(seconds(args.record)), "exit": ""}
        row |= {"passed": "" if args.passed is None else str(args.passed)}
        row |= {"failed": "" if args.failed is None else str(args.failed)}
        status = 0
    else:
        wall, status, output = run(args.command or ["bash", ".ci/run"])
        passed, failed = counts(output)
        row = {"wall": minutes(wall), "exit": str(status), "passed": "" if passed is None else str(passed)}
        row |= {"failed": str(failed)}
    append(row | {"date": today, "commit": args.commit or commit(), "note": args.note})
    report()
    return status


if __name__ == "__main__":
    sys.exit(main())
