"""The sandbox suite: what bubblewrap adds to executor start and to a round trip."""

from bench.registry import Job, Metric, Side, Suite, Target, register

register(
    Suite(
        name="sandbox",
        description="sandbox overhead (sandbox=True against sandbox=False)",
        jobs=(
            # The unsandboxed run is the reference ("floor") the sandboxed one is compared with.
            Job(
                "sandbox_overhead.py",
                (Side.FLOOR,),
                runs=10,
                args=("--plain",),
                metrics=(
                    Metric("sandbox.plain.start", "executor start, no sandbox"),
                    Metric("sandbox.plain.execute_x1", 'execute("x = 1"), no sandbox'),
                ),
            ),
            Job(
                "sandbox_overhead.py",
                (Side.OURS,),
                runs=10,
                metrics=(
                    Metric(
                        "sandbox.start",
                        "executor start, sandbox=True",
                        Target(max_floor_ratio=1.2, floor_metric="sandbox.plain.start"),
                    ),
                    Metric(
                        "sandbox.execute_x1",
                        'execute("x = 1"), sandbox=True',
                        Target(max_floor_ratio=1.1, floor_metric="sandbox.plain.execute_x1"),
                    ),
                ),
            ),
        ),
    )
)
