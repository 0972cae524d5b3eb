"""The policy suite: replaying and verifying a large audit log (issue 35)."""

from bench.registry import Job, Metric, Side, Suite, Target, register

register(
    Suite(
        name="policy",
        description="`ipybox policy replay` and `ipybox audit verify` over 100,000 audit records",
        jobs=(
            Job(
                "policy_replay.py",
                (Side.OURS,),
                runs=3,
                metrics=(
                    Metric(
                        "policy.replay_100k",
                        "ipybox policy replay, 100,000 records (whole command)",
                        Target(max_ms=5000),
                    ),
                    Metric(
                        "audit.verify_100k", "ipybox audit verify, 100,000 chained records (whole command)"
                    ),
                ),
            ),
        ),
    )
)
