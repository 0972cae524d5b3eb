"""The workspace suite: attaching to a running workspace, and how fast a saved edit becomes importable."""

from bench.registry import Job, Metric, Side, Suite, Target, register

register(
    Suite(
        name="workspace",
        description="ipybox up: attach to the warm pool, reconcile an added server, answer an ask at the console",
        jobs=(
            Job(
                "workspace.py",
                (Side.OURS,),
                runs=20,
                metrics=(
                    Metric("workspace.attach", "CodeExecutor(workspace=...) start", Target(max_ms=100)),
                    Metric("workspace.server_start", "the added server's own start + list_tools"),
                    Metric(
                        "workspace.reconcile",
                        "saved edit -> import works in a running kernel, minus server start",
                        Target(max_ms=1500),
                    ),
                ),
            ),
            Job(
                "console.py",
                (Side.OURS,),
                runs=20,
                metrics=(
                    Metric("console.ask_shown", "a kernel's tool call -> its ask shown in the web console"),
                    Metric("console.click_to_run", "a click on Allow once -> the call has run in the kernel"),
                ),
            ),
        ),
    )
)
