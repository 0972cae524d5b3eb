"""The prompt-injection evaluation (issue 39): the scenarios of bench/injection/scenarios run through a real
workspace under each configuration of the provided policy (bench/injection/policy.toml); what the
harness does is in bench/injection/harness.py, how calls are counted in bench/injection/model.py.

Ours only (the peer has no provenance). One JSON line per configuration, `injection.<name>`: samples are
each scenario's wall time (attach, cells, detach), the status the counts (attack calls stopped, benign
calls wrongly stopped, benign sink calls wrongly stopped) and whether the issue's target is met (every
attack call stopped, benign calls wrongly stopped under 10 %); `info` has every scenario's outcome.
The markdown tables (the summary and one row per scenario) are printed and, with `--markdown FILE`,
written there. Exit 1 when a scenario's sinks disagree with the audit log or it made undeclared calls
(the harness or a scenario is wrong); a missed target is reported, not an error.

    .venv/bin/python -m bench injection                      # every configuration, every scenario
    .venv/bin/python bench/scenarios/injection_eval.py --configs provided --only attack_web_email_plain
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # bench.injection; ipybox itself is the venv's (an editable install)

from _protocol import emit, log, parse_args  # noqa: E402

from bench.injection.harness import run_configuration  # noqa: E402
from bench.injection.model import CONFIGURATIONS, cell_text, load_scenarios, markdown, tally  # noqa: E402


def main() -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument(
        "--configs",
        default=",".join(c.name for c in CONFIGURATIONS),
        help="comma-separated configurations (default: all)",
    )
    extra.add_argument("--only", help="comma-separated scenario names (default: all)")
    extra.add_argument("--markdown", type=Path, help="also write the tables to this file")
    extra.add_argument("--no-sandbox", action="store_true", help="unsandboxed kernels (default: sandboxed)")
    args = parse_args("prompt-injection evaluation of provenance rules", 1, 0, extra)
    names = args.configs.split(",")
    unknown = [n for n in names if n not in {c.name for c in CONFIGURATIONS}]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; known: {[c.name for c in CONFIGURATIONS]}")
    configurations = [c for c in CONFIGURATIONS if c.name in names]
    scenarios = load_scenarios(only=args.only.split(",") if args.only else None)
    results = {}
    failed = False
    for configuration in configurations:
        log(f"{configuration.name}: {len(scenarios)} scenarios")
        with tempfile.TemporaryDirectory(prefix="ipybox-injection-eval-") as scratch:
            outcome = asyncio.run(
                run_configuration(Path(scratch) / "ws", configuration, scenarios, sandbox=not args.no_sandbox)
            )
        results[configuration.name] = outcome
        counts = tally(outcome)
        problems = {r.scenario.name: r.problems for r in outcome if r.problems}
        failed |= bool(problems)
        status = (
            f"attack calls stopped {counts.attacks_stopped}; benign calls wrongly stopped {counts.benign_stopped}; "
            f"benign sink calls {counts.benign_sinks_stopped}; target {'met' if counts.meets_target() else 'missed'}"
        )
        if problems:
            status += f"; HARNESS PROBLEMS in {', '.join(problems)}"
        emit(
            f"injection.{configuration.name}",
            [r.wall_ms for r in outcome],
            status=status,
            info={
                "scenarios": {r.scenario.name: cell_text(r) for r in outcome},
                "problems": problems,
                "outputs": {r.scenario.name: r.outputs for r in outcome if r.problems},
            },
        )
    table = markdown(configurations, results, scenarios)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
        log(f"tables written to {args.markdown}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
