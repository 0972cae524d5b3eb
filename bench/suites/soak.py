"""The soak suite (issue 14's "Done when"): one `ipybox up` workspace, 100 sessions and 10,000 tool calls,
half of them while a hostile kernel floods the call channel. The quiet half is the floor the flooded half
is judged against (both in the same run, on the same machine in the same minutes).

Ours only: ipybox 0.9.2 has no workspace that several sessions share (each `CodeExecutor` has its own
tool server), so the peer has no equivalent to run. `--runs N` sets the sessions per phase (default 50,
so 2 x 50 x 100 calls); `--runs 5` is a quick smoke run.
"""

from bench.registry import Job, Metric, Side, Suite, Target, register

register(
    Suite(
        name="soak",
        description="ipybox up under load: 100 sessions, 10,000 tool calls, one kernel flooding the call channel",
        jobs=(
            Job(
                "soak.py",
                (Side.OURS,),
                runs=50,
                timeout_s=900.0,
                metrics=(
                    Metric(
                        "soak.quiet.call", "quiet: edge.echo from the other sessions' kernels", floor=True
                    ),
                    Metric(
                        "soak.flood.call",
                        "flood: edge.echo from the other sessions' kernels",
                        Target(max_floor_ratio=2.0, floor_metric="soak.quiet.call"),
                    ),
                    Metric("soak.quiet.attach", "quiet: CodeExecutor(workspace=...) start"),
                    Metric("soak.flood.attach", "flood: CodeExecutor(workspace=...) start"),
                    Metric("soak.quiet.status", "quiet: control status() round trip"),
                    Metric("soak.flood.status", "flood: control status() round trip"),
                    Metric("soak.supervisor", "supervisor RSS and open fds (see status)"),
                    Metric("soak.hostile", "what the flood did and was answered (see status)"),
                ),
            ),
        ),
    )
)
