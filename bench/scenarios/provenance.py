"""Provenance matching (issue 39): the per-call cost of matching a call's arguments against 1, 100 and
10,000 results recorded for its session, the cost of recording a result, and the memory a session holds
at the default cap (8 MiB), measured with tracemalloc next to what the tracker counts.

In-process and pure (`ipybox.rules.provenance`, what the tool server calls on its event loop): ours only.
A result is an e-mail-like record of ~400 characters with its own address and id; a call's arguments are
an address copied from one result, a short subject and a 400-character body sharing a sentence with it.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _protocol import emit, parse_args

from ipybox.rules.provenance import ProvenanceSettings, ProvenanceTracker

CALLS_PER_SAMPLE = 200
BODY = (
    "Hello, this is message {i} about the quarterly planning. Please review the attached figures, "
    "reply to sender{i}@partner{k}.example before Friday, and quote ticket PRJ-{i:06d} in the subject. "
    "The meeting notes from last week are below; nothing in them needs action from your side yet. "
    "Regards, the operations team of partner {k}, which writes a few more words here to fill the page."
)


def result(i: int) -> dict[str, str]:
    return {
        "from": f"sender{i}@partner{i % 97}.example",
        "subject": f"Planning {i}",
        "body": BODY.format(i=i, k=i % 97),
    }


def call_args(i: int) -> dict[str, str]:
    return {
        "to": f"Sender{i}@Partner{i % 97}.example",
        "subject": "Re: planning",
        "body": "Thanks! As you wrote: please review the attached figures, reply to the team soon. "
        + "Our own text follows and does not come from anywhere else. " * 5,
    }


def main() -> None:
    args = parse_args(
        "provenance matching per call and memory per session", default_runs=20, default_warmup=2
    )
    annotations = {"openWorldHint": True}
    for held in (1, 100, 10_000):
        tracker = ProvenanceTracker(ProvenanceSettings(max_bytes=1 << 30))  # all `held` kept
        started = time.perf_counter()
        for i in range(held):
            tracker.record("s", "mail", "read", result(i), annotations)
        record_ms = (time.perf_counter() - started) * 1000 / held
        samples = []
        for run in range(args.warmup + args.runs):
            started = time.perf_counter()
            for j in range(CALLS_PER_SAMPLE):
                found = tracker.match("s", call_args((run * CALLS_PER_SAMPLE + j) % held))
            if run >= args.warmup:
                samples.append((time.perf_counter() - started) * 1000 / CALLS_PER_SAMPLE)
        assert set(found) == {"to", "body"}, found
        emit(
            f"provenance.match_{held}",
            samples,
            info={"held": tracker.results("s"), "record_ms_per_result": round(record_ms, 4)},
        )
    # Memory at the default cap: fill a session past it, compare what tracemalloc sees with the count.
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracker = ProvenanceTracker()
    started = time.perf_counter()
    i = 0
    while i < 3_000:
        tracker.record("s", "mail", "read", result(i), annotations)
        i += 1
    fill_ms = (time.perf_counter() - started) * 1000
    held_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    emit(
        "provenance.fill_past_cap",
        [fill_ms],
        info={
            "cap_bytes": tracker.settings.max_bytes,
            "counted_bytes": tracker.memory("s"),
            "tracemalloc_bytes": held_bytes,
            "results_held": tracker.results("s"),
            "results_recorded": i,
        },
    )


if __name__ == "__main__":
    main()
