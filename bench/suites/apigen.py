"""The apigen suite: `generate_mcp_sources` against real MCP servers."""

from bench.registry import Job, Metric, Side, Suite, Target, register

# Display names; the keys are the server names bench/scenarios/_servers.py knows.
SERVERS = {"everything": "server-everything", "filesystem": "server-filesystem", "git": "mcp-server-git"}


def _job(server: str, display: str) -> Job:
    return Job(
        "apigen.py",
        (Side.OURS, Side.PEER),
        runs=10,
        args=("--server", server),
        # Only ours exposes generation apart from fetching the tool list.
        side_args={Side.OURS: ("--split",)},
        metrics=(
            Metric(f"apigen.{server}.total", f"{display}: generate_mcp_sources", Target(max_peer_ratio=0.5)),
            Metric(f"apigen.{server}.fetch", f"{display}: server start + list_tools"),
            Metric(f"apigen.{server}.stop", f"{display}: server stop"),
            Metric(f"apigen.{server}.generate", f"{display}: generation only"),
            Metric(f"apigen.{server}.generate_per_tool", f"{display}: generation per tool", Target(max_ms=3)),
        ),
    )


# Ours only (the peer has no tool search): the index over 500 generated tools, and what an agent reads.
TOOL_SEARCH = Job(
    "tool_search.py",
    (Side.OURS,),
    runs=50,
    metrics=(
        Metric("tool_search.build", "tool index: full build, 500 tools, cold"),
        Metric("tool_search.sync_unchanged", "tool index: sync, nothing changed"),
        Metric("tool_search.sync_one_server", "tool index: sync after 1 server (50 tools) regenerated"),
        Metric("tool_search.search", "search_tools: search(limit=5), 500 tools, warm"),
        Metric("tool_search.tokens", "tokens an agent reads per task"),
    ),
)

register(
    Suite(
        name="apigen",
        description="Python API generation from real MCP servers, and the tool search index",
        jobs=(*(_job(server, display) for server, display in SERVERS.items()), TOOL_SEARCH),
    )
)
