"""The injection suite (issue 39): the prompt-injection evaluation of the provided policy, configuration by
configuration (bench/injection/). Its result is a count, not a time: each row's status says how many attack
calls were stopped and how many benign calls wrongly stopped; the samples are the scenarios' wall times.
"""

from bench.paths import SCRATCH_DIR
from bench.registry import Job, Metric, Side, Suite, register

register(
    Suite(
        name="injection",
        description="prompt-injection scenarios under the provided policy: attacks stopped, benign calls stopped",
        jobs=(
            Job(
                "injection_eval.py",
                (Side.OURS,),
                runs=1,
                timeout_s=1800.0,
                args=("--markdown", str(SCRATCH_DIR / "injection-eval.md")),
                metrics=(
                    Metric("injection.rules", "rules without provenance: per scenario (see status)"),
                    Metric("injection.taint", "+ session taint: per scenario (see status)"),
                    Metric("injection.provided", "+ value provenance, the provided policy (see status)"),
                    Metric("injection.value_only", "value provenance without taint (see status)"),
                ),
            ),
        ),
    )
)
