"""The tools suite: MCP tool calls from the kernel, approval, and the direct mcp client as the floor."""

from bench.registry import Job, Metric, Side, Suite, Target, register

register(
    Suite(
        name="tools",
        description="programmatic MCP tool calls (tool server, approval)",
        jobs=(
            Job(
                "tool_floor.py",
                (Side.FLOOR,),
                runs=100,
                metrics=(
                    Metric("floor.tools.echo", "mcp ClientSession everything.echo"),
                    Metric("floor.tools.list_directory", "mcp ClientSession filesystem.list_directory"),
                ),
            ),
            Job(
                "tool_calls.py",
                (Side.OURS, Side.PEER),
                runs=100,
                metrics=(
                    Metric(
                        "tools.echo",
                        "in-kernel everything.echo",
                        Target(max_floor_ratio=1.3, floor_metric="floor.tools.echo"),
                    ),
                    Metric(
                        "tools.list_directory",
                        "in-kernel filesystem.list_directory",
                        Target(max_floor_ratio=1.3, floor_metric="floor.tools.list_directory"),
                    ),
                    Metric("tools.approval_added", "stream()+accept() minus execute()", Target(max_ms=0.5)),
                    Metric(
                        "tools.first_call_fresh_kernel", "first call, fresh kernel", Target(max_ms=50)
                    ),  # issue 33
                ),
            ),
            Job(
                "tls_calls.py",
                (Side.OURS,),
                runs=200,
                metrics=(  # issue 34: remote kernels call over TCP+TLS, local ones over the Unix socket
                    Metric("calls.unix.echo", "everything.echo, Unix socket (separate client process)"),
                    Metric("calls.tls.echo", "everything.echo, TCP+TLS, pinned certificate"),
                    Metric("calls.unix.noop", "no-op request (shell approval, ApproveAll), Unix socket"),
                    Metric("calls.tls.noop", "no-op request, TCP+TLS"),
                    Metric("calls.unix.connect", "no-op request on a new connection, Unix socket"),
                    Metric(
                        "calls.tls.connect", "no-op request on a new connection, TCP+TLS (handshake, pin)"
                    ),
                ),
            ),
        ),
    )
)
