"""Turns job runs into the printed table and the optional JSON file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.registry import Metric, Side, Suite, Target
from bench.runner import JobRun, MetricResult
from bench.stats import Summary


@dataclass(frozen=True)
class Row:
    suite: str
    metric: Metric
    side: Side  # OURS, or FLOOR for floor metrics (they fill the "ours" columns)
    ours: MetricResult | None
    peer: MetricResult | None


def _summary(result: MetricResult | None) -> Summary | None:
    return Summary.of(result.samples_ms) if result and result.samples_ms else None


def _pool(a: MetricResult, b: MetricResult) -> MetricResult:
    statuses = [status for status in (a.status, b.status) if status is not None]
    status = " | ".join(dict.fromkeys(statuses)) if statuses else None
    return MetricResult(samples_ms=a.samples_ms + b.samples_ms, status=status, info={**a.info, **b.info})


def fmt_ms(value: float) -> str:
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:.0f}"


class Results:
    """Every job run of one invocation, indexed by (side, metric name)."""

    def __init__(self, runs: list[JobRun]) -> None:
        self.runs = runs
        self._by_metric: dict[tuple[Side, str], MetricResult] = {}
        for run in runs:
            floors = {metric.name for metric in run.job.metrics if metric.floor}
            for name, result in run.metrics.items():
                key = (Side.FLOOR if name in floors else run.side, name)
                # With --rounds, a job runs several times per side: pool its samples.
                self._by_metric[key] = (
                    _pool(self._by_metric[key], result) if key in self._by_metric else result
                )

    def get(self, side: Side, name: str) -> MetricResult | None:
        return self._by_metric.get((side, name))

    def rows(self, suite: Suite) -> list[Row]:
        rows: list[Row] = []
        for job in suite.jobs:
            side = Side.FLOOR if job.sides == (Side.FLOOR,) else Side.OURS
            declared = {metric.name for metric in job.metrics}
            metrics = list(job.metrics)
            # Metrics a script reports without the suite declaring them still show up, unlabelled.
            for run in self.runs:
                if run.job is job:
                    metrics += [Metric(n, n) for n in run.metrics if n not in declared]
                    declared |= set(run.metrics)
            for metric in metrics:
                metric_side = Side.FLOOR if metric.floor else side
                ours, peer = self.get(metric_side, metric.name), self.get(Side.PEER, metric.name)
                if ours or peer:
                    rows.append(Row(suite.name, metric, metric_side, ours, peer))
        return rows

    def judge(self, target: Target, ours: Summary | None, peer: Summary | None) -> str:
        if ours is None:
            return "no data"
        if target.max_ms is not None:
            verdict = "ok" if ours.median < target.max_ms else "MISS"
            return f"{verdict} ({fmt_ms(ours.median)} ms)"
        if target.max_peer_ratio is not None:
            if peer is None:
                return "needs --peer"
            ratio, limit, what = ours.median / peer.median, target.max_peer_ratio, "peer"
        else:
            assert target.floor_metric is not None and target.max_floor_ratio is not None
            floor = _summary(self.get(Side.FLOOR, target.floor_metric))
            if floor is None:
                return "no floor"
            ratio, limit, what = ours.median / floor.median, target.max_floor_ratio, "floor"
        return f"{'ok' if ratio <= limit else 'MISS'} ({ratio:.2f}x {what})"


def _median_p90(summary: Summary | None) -> list[str]:
    return [fmt_ms(summary.median), fmt_ms(summary.p90)] if summary else ["-", "-"]


def render(suites: list[Suite], results: Results, with_peer: bool) -> str:
    header = ["metric", "n", "ours med", "ours p90", "ours max"]
    if with_peer:
        header += ["peer med", "peer p90", "ours/peer"]
    header += ["target", "result"]
    out: list[str] = []
    for suite in suites:
        table: list[list[str]] = [header]
        notes: list[str] = []
        for row in results.rows(suite):
            ours, peer = _summary(row.ours), _summary(row.peer)
            label = f"floor: {row.metric.label}" if row.side is Side.FLOOR else row.metric.label
            line = [label, str(ours.n if ours else peer.n if peer else 0), *_median_p90(ours)]
            line.append(fmt_ms(ours.maximum) if ours else "-")
            if with_peer:
                ratio = f"{ours.median / peer.median:.2f}" if ours and peer else "-"
                line += [*_median_p90(peer), ratio]
            target = row.metric.target
            line += [target.describe(), results.judge(target, ours, peer)] if target else ["", ""]
            table.append(line)
            for side_name, result in (
                ("ours" if row.side is Side.OURS else "floor", row.ours),
                ("peer", row.peer),
            ):
                if result and result.status:
                    notes.append(f"{row.metric.label} [{side_name}]: {result.status}")
        out.append(f"\n== {suite.name}: {suite.description}")
        out.append(_format_table(table))
        out += [f"  * {note}" for note in notes]
        for run in results.runs:
            if run.job in suite.jobs:
                out += [f"  ! {note}" for note in _run_problems(run)]
    return "\n".join(out)


def _run_problems(run: JobRun) -> list[str]:
    problems = []
    if run.returncode is None:
        problems.append(f"{run.side.value} {run.job.title}: killed after {run.job.timeout_s:.0f} s")
    elif run.returncode != 0:
        tail = run.stderr_tail.replace("\n", "\n      ")
        problems.append(f"{run.side.value} {run.job.title}: exit {run.returncode}\n      {tail}")
    if run.leftover_processes:
        listed = "; ".join(run.leftover_processes[:4])
        problems.append(
            f"{run.side.value} {run.job.title}: {len(run.leftover_processes)} process(es) outlived the script "
            f"(killed): {listed}"
        )
    return problems


def _format_table(table: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = []
    for index, row in enumerate(table):
        # Text columns left-aligned, numbers right-aligned.
        cells = [
            cell.ljust(width) if i == 0 or i >= len(row) - 2 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def write_json(path: Path, suites: list[Suite], results: Results, meta: dict[str, Any]) -> None:
    records = []
    for suite in suites:
        for row in results.rows(suite):
            for side, result in ((row.side, row.ours), (Side.PEER, row.peer)):
                if result is None:
                    continue
                summary = _summary(result)
                records.append(
                    {
                        "suite": suite.name,
                        "metric": row.metric.name,
                        "label": row.metric.label,
                        "side": side.value,
                        "median_ms": summary and summary.median,
                        "p90_ms": summary and summary.p90,
                        "max_ms": summary and summary.maximum,
                        "n": len(result.samples_ms),
                        "status": result.status,
                        "info": result.info,
                        "target": row.metric.target and row.metric.target.describe(),
                        "samples_ms": result.samples_ms,
                    }
                )
    runs = [
        {
            "script": run.job.title,
            "side": run.side.value,
            "command": run.command,
            "returncode": run.returncode,
            "wall_s": round(run.wall_s, 2),
            "leftover_processes": run.leftover_processes,
            "load_before": run.load_before,
        }
        for run in results.runs
    ]
    path.write_text(json.dumps({"meta": meta, "results": records, "runs": runs}, indent=2) + "\n")
