"""What every scenario script shares: its command line and how it reports.

Scenario scripts run under either interpreter (ours or the peer's), so this module and every script
here use only the standard library and ipybox's public API. A script prints one JSON line per metric:

    {"scenario": "kernel.execute_x1", "samples_ms": [...], "status": "intact", "info": {...}}

``status`` and ``info`` are optional. The driver (bench/runner.py) ignores every other stdout line and
computes the statistics; scripts exclude their own warm-ups before reporting.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def parse_args(
    description: str, default_runs: int, default_warmup: int, extra: argparse.ArgumentParser | None = None
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, parents=[extra] if extra else [])
    parser.add_argument("--runs", type=int, default=default_runs, help="measured samples")
    parser.add_argument("--warmup", type=int, default=default_warmup, help="unmeasured samples first")
    return parser.parse_args()


def emit(
    scenario: str,
    samples_ms: list[float],
    status: str | None = None,
    info: dict[str, Any] | None = None,
) -> None:
    record: dict[str, Any] = {"scenario": scenario, "samples_ms": [round(s, 4) for s in samples_ms]}
    if status is not None:
        record["status"] = status
    if info:
        record["info"] = info
    # Flush per line: a script that dies later still delivers what it measured.
    print(json.dumps(record), flush=True)


def log(message: str) -> None:
    print(f"[scenario] {message}", file=sys.stderr, flush=True)


class Stopwatch:
    """Collects samples in milliseconds; `measure(keep=False)` times a warm-up without keeping it."""

    def __init__(self) -> None:
        self.samples_ms: list[float] = []

    @contextmanager
    def measure(self, keep: bool = True) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if keep:
            self.samples_ms.append((time.perf_counter() - start) * 1000.0)


def summarize_statuses(statuses: list[str]) -> str:
    """One status for many samples: "intact", or "8/10 intact; 2/10 lost silently" when they differ."""
    counts = collections.Counter(statuses)
    if len(counts) == 1:
        return statuses[0]
    return "; ".join(f"{count}/{len(statuses)} {status}" for status, count in counts.most_common())
