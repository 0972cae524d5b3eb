"""The kernel suite: executor lifecycle, small and large executions, reset, and the jupyter_client floor."""

from bench.registry import Job, Metric, Side, Suite, Target, register

BOTH = (Side.OURS, Side.PEER)


def _print_job(mb: int, runs: int) -> Job:
    # One executor per size: an output rate limit tripped by one size must not spill into the next.
    return Job(
        "print_large.py",
        BOTH,
        runs=runs,
        args=("--mb", str(mb)),
        metrics=(Metric(f"kernel.print_{mb}mb", f"print {mb} MB"),),
    )


register(
    Suite(
        name="kernel",
        description="code execution foundation (CodeExecutor lifecycle, execute, reset)",
        jobs=(
            # The floor right before ours, so both see the same machine state.
            Job(
                "jupyter_floor.py",
                (Side.FLOOR,),
                runs=200,
                metrics=(Metric("floor.execute_x1", "jupyter_client x = 1 round trip"),),
            ),
            Job(
                "execute_small.py",
                BOTH,
                runs=200,
                metrics=(
                    Metric(
                        "kernel.execute_x1",
                        'execute("x = 1")',
                        Target(max_floor_ratio=1.3, floor_metric="floor.execute_x1"),
                    ),
                ),
            ),
            Job(
                "jupyter_floor.py",
                (Side.FLOOR,),
                runs=10,
                args=("--lifecycle",),
                metrics=(
                    Metric("floor.kernel_start", "jupyter_client kernel start to ready"),
                    Metric("floor.kernel_stop", "jupyter_client kernel shutdown"),
                ),
            ),
            Job(
                "executor_lifecycle.py",
                BOTH,
                runs=10,
                metrics=(
                    Metric("kernel.start", "executor start (enter to ready)", Target(max_peer_ratio=0.5)),
                    Metric("kernel.first_execute", "first execute after start"),
                    Metric("kernel.stop", "executor stop (exit)"),
                ),
            ),
            Job(
                "reset.py",
                BOTH,
                runs=10,
                metrics=(
                    Metric("kernel.reset", "reset()", Target(max_ms=150)),
                    Metric("kernel.first_execute_after_reset", "first execute after reset"),
                    Metric("kernel.reset_back_to_back", "reset() right after reset() (waits for the spare)"),
                ),
            ),
            Job(
                "recovery.py",
                (Side.OURS,),
                runs=10,
                metrics=(
                    Metric("kernel.death_error", "a cell kills its kernel: KernelDiedError"),
                    Metric("kernel.execute_after_death", "execute after a kernel death"),
                    Metric("kernel.reset_after_death", "reset after a kernel death", Target(max_ms=150)),
                    Metric("kernel.first_execute_after_death_reset", "first execute after that reset"),
                    Metric("kernel.gateway_death_error", "gateway killed under a cell: KernelDiedError"),
                    Metric(
                        "kernel.ws_execute_after_gateway_death",
                        "ipybox up: execute after a gateway death (restart)",
                    ),
                    Metric(
                        "kernel.ws_gateway_death_error",
                        "ipybox up: gateway killed under a cell: KernelDiedError",
                    ),
                    Metric("kernel.ws_reset_after_death", "ipybox up: reset after a kernel death"),
                ),
            ),
            *(_print_job(mb, runs) for mb, runs in ((1, 10), (5, 3), (10, 3))),
        ),
    )
)
