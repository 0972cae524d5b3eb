"""The provenance suite (issue 39): matching a call's arguments against a session's recorded results."""

from bench.registry import Job, Metric, Side, Suite, Target, register

register(
    Suite(
        name="provenance",
        description="value provenance: per-call matching at 1, 100, 10,000 recorded results; memory at the cap",
        jobs=(
            Job(
                "provenance.py",
                (Side.OURS,),
                runs=20,
                metrics=(
                    Metric("provenance.match_1", "match one call, 1 result recorded", Target(max_ms=0.5)),
                    Metric("provenance.match_100", "match one call, 100 results", Target(max_ms=0.5)),
                    Metric("provenance.match_10000", "match one call, 10,000 results", Target(max_ms=0.5)),
                    Metric("provenance.fill_past_cap", "record 3,000 results into one session (8 MiB cap)"),
                ),
            ),
        ),
    )
)
