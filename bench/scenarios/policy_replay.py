"""`ipybox policy replay` and `ipybox audit verify` over an audit log of 100,000 records (issue 35):
wall time of the command (a fresh interpreter, as a user runs it) and its peak RSS.

The log is written here in the format `AuditLog.record()` writes (one rule in ten changes its decision
under the replayed policy), chained as `AuditLog` chains it, so that `verify` walks a real chain.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _protocol import emit, log, parse_args

RECORDS = 100_000
GENESIS = "0" * 64
WORKSPACE = """
[approval]
default = "ask"

[[approval.rules]]
id = "reads"
server = "fs"
tool = "read_*"
decision = "allow"

[[approval.rules]]
id = "no-secrets"
server = "fs"
args = { path = { glob = "secret/*" } }
decision = "deny"
priority = 10
"""


def write_log(path: Path) -> None:
    path.parent.mkdir(parents=True)
    prev = GENESIS
    with open(path, "wb") as file:
        for i in range(RECORDS):
            record = {
                "time": "2026-12-07T10:00:00.000000Z",
                "server": "fs",
                "tool": "read_file",
                "args": {"path": f"secret/{i}" if i % 10 == 0 else f"notes-{i}.md"},
                "decision": "allow",
                "rule_id": "reads",
                "decided_by": "rule",
                "reason": "rule 'reads' applies",
                "prev": prev,
            }
            line = json.dumps(record, ensure_ascii=True, separators=(", ", ": ")).encode()
            file.write(line + b"\n")
            prev = hashlib.sha256(line).hexdigest()
    os.chmod(path, 0o600)


def run(argv: list[str]) -> tuple[float, int, int]:
    """Wall ms, peak RSS (KiB) and exit code of one command in a fresh interpreter."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "ipybox.cli", *argv], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return (time.perf_counter() - started) * 1000, usage.ru_maxrss, child.returncode


def main() -> None:
    args = parse_args("policy replay / audit verify of 100,000 records", default_runs=3, default_warmup=1)
    with tempfile.TemporaryDirectory() as scratch:
        workspace = Path(scratch) / "ws"
        workspace.mkdir()
        (workspace / "ipybox.toml").write_text(WORKSPACE)
        write_log(workspace / ".ipybox" / "audit.jsonl")
        os.environ["XDG_CONFIG_HOME"] = str(Path(scratch) / "config")  # no admin tier
        for name, argv, expected in (
            ("policy.replay_100k", ["policy", "replay", str(workspace)], 1),
            ("audit.verify_100k", ["audit", "verify", str(workspace)], 0),
        ):
            samples, peaks = [], []
            for i in range(args.warmup + args.runs):
                ms, peak, code = run(argv)
                if code != expected:
                    log(f"{name}: exit {code}, expected {expected}")
                if i >= args.warmup:
                    samples.append(ms)
                    peaks.append(peak)
            emit(name, samples, info={"peak_rss_mib": round(max(peaks) / 1024, 1), "records": RECORDS})


if __name__ == "__main__":
    main()
