"""The mcp_server suite: ipybox's MCP server over stdio, driven by the mcp package's client."""

from bench.registry import Job, Metric, Side, Suite, Target, register

register(
    Suite(
        name="mcp_server",
        description="ipybox as an MCP server (stdio): start, execute, reset, register",
        jobs=(
            Job(
                "mcp_server.py",
                (Side.OURS, Side.PEER),
                runs=10,
                # Ours serves MCP as `ipybox mcp`; the peer's (0.9.2) is the bare `ipybox --workspace DIR`.
                # Ours also measures the floor, our SDK's execute, in blocks alternating with the MCP ones.
                side_args={Side.OURS: ("--subcommand", "mcp", "--with-floor")},
                metrics=(
                    Metric("mcp.floor.execute_x1", 'CodeExecutor.execute("x = 1"), ours, no MCP', floor=True),
                    Metric(
                        "mcp.spawn_to_initialized",
                        "process start -> initialize() returns",
                        Target(max_peer_ratio=0.333),
                    ),
                    Metric(
                        "mcp.execute_x1",
                        'execute_ipython_cell("x = 1") round trip',
                        Target(max_floor_ratio=1.3, floor_metric="mcp.floor.execute_x1"),
                    ),
                    Metric("mcp.register", "register_mcp_server(server-everything), fresh name"),
                    Metric("mcp.reset", "reset() round trip"),
                ),
            ),
        ),
    )
)

register(
    Suite(
        name="mcp_revisions",
        description="ipybox's MCP server (stdio) per protocol revision: execute, and a cell that asks",
        jobs=(
            Job(
                "mcp_revisions.py",
                (Side.OURS,),
                runs=10,
                metrics=(
                    Metric("mcp.legacy.execute_x1", 'execute_ipython_cell("x = 1"), handshake-era client'),
                    Metric("mcp.modern.execute_x1", 'execute_ipython_cell("x = 1"), 2026-07-28 client'),
                    Metric("mcp.allowed_cell", "a cell calling echo, allowed by a rule (2026-07-28)"),
                    Metric("mcp.legacy.ask_cell", "the same cell, the call asked: elicitation mid-call"),
                    Metric(
                        "mcp.modern.ask_cell", "the same cell, the call asked: InputRequiredResult + retry"
                    ),
                ),
            ),
        ),
    )
)
