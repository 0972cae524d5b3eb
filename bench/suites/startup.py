"""The startup suite: what a user waits for before the first line of code runs (issue 33, item 5)."""

from bench.registry import Job, Metric, Side, Suite, Target, register

register(
    Suite(
        name="startup",
        description="import time, attaching to a running workspace, the first tool call in a fresh kernel",
        jobs=(
            Job(
                "import_time.py",
                (Side.OURS, Side.PEER),
                runs=20,
                metrics=(
                    Metric(
                        "startup.import",
                        "from ipybox import CodeExecutor (fresh interpreter)",
                        Target(max_ms=500),
                    ),
                ),
            ),
            Job(
                "interactive.py",
                (Side.OURS,),
                runs=20,
                metrics=(
                    Metric(
                        "startup.time_to_interactive",
                        "CodeExecutor(workspace=...) start + first execute",
                        Target(max_ms=50),
                    ),
                    Metric("startup.attach", "of which start() (lease a warm kernel)"),
                    Metric("startup.attach_first_execute", 'of which the first execute("x = 1")'),
                    Metric(
                        "startup.first_tool_call",
                        "first tool call in that fresh kernel (import + call)",
                        Target(max_ms=50),
                    ),
                ),
            ),
        ),
    )
)
