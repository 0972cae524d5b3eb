"""The remote suite: kernels on Jupyter Enterprise Gateway (issue 34) against ipybox's local gateway."""

from bench.registry import Job, Metric, Side, Suite, register

register(
    Suite(
        name="remote",
        description="kernels on Jupyter Enterprise Gateway against the local kernel gateway",
        jobs=(
            Job(
                "remote_kernel_start.py",
                (Side.OURS,),
                runs=10,
                metrics=(
                    # Measured in the same job, alternating with the Enterprise Gateway's samples.
                    Metric(
                        "remote.local_kernel_start",
                        "local gateway: POST /api/kernels until kernel_info",
                        floor=True,
                    ),
                    Metric("remote.kernel_start", "Enterprise Gateway (bwrap kernelspec): the same"),
                    Metric("remote.local_kernel_stop", "local gateway: DELETE the kernel", floor=True),
                    Metric("remote.kernel_stop", "Enterprise Gateway: DELETE the kernel"),
                ),
            ),
            Job(
                "remote_workspace.py",
                (Side.OURS,),
                runs=10,
                metrics=(
                    Metric("remote.ws.local_execute", 'local kernels: execute("x = 1")', floor=True),
                    Metric("remote.ws.execute", 'kernels on Enterprise Gateway: execute("x = 1")'),
                    Metric("remote.ws.local_tool_call", "local kernel: echo.run() (Unix socket)", floor=True),
                    Metric("remote.ws.tool_call", "remote kernel: echo.run() (TCP+TLS)"),
                    Metric(
                        "remote.ws.local_first_import",
                        "fresh local kernel: import mcptools.edge.echo (disk)",
                        floor=True,
                    ),
                    Metric(
                        "remote.ws.first_import",
                        "fresh remote kernel: import mcptools.edge.echo (over the channel)",
                    ),
                ),
            ),
        ),
    )
)
