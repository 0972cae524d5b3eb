from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from ipybox.mcp_client import (
    MCPConnection,
    MCPServerError,
    ServerConnectError,
    ServerNotRunningError,
    ServerStartError,
    ServerTimeoutError,
    ToolCallError,
)
from tests.servers import params

pytestmark = pytest.mark.integration


async def test_lists_tools_with_schemas(edge: MCPConnection) -> None:
    tools = {tool.name: tool for tool in await edge.list_tools()}
    assert {"echo", "add", "get-user", "get.user", "kitchen_sink", "media"} <= set(tools)
    assert tools["add"].output_schema is not None and tools["echo"].output_schema is None
    assert edge.output_schema("add") == tools["add"].output_schema


async def test_calls_tools(edge: MCPConnection) -> None:
    result = await edge.call_tool("echo", {"text": "hi"})
    assert [block.text for block in result.content if block.type == "text"] == ["hi"]
    result = await edge.call_tool("add", {"a": 2, "b": 3})
    assert result.structured_content == {"total": 5, "operands": [2, 3]}


async def test_many_concurrent_calls_on_one_session(edge: MCPConnection) -> None:
    started = time.perf_counter()
    results = await asyncio.gather(*(edge.call_tool("slow", {"seconds": 0.3}) for _ in range(20)))
    assert all(not r.is_error for r in results)
    assert time.perf_counter() - started < 0.3 * 20 / 2, "calls did not run concurrently"
    texts = await asyncio.gather(*(edge.call_tool("echo", {"text": str(i)}) for i in range(50)))
    assert [t.content[0].text for t in texts if t.content[0].type == "text"] == [str(i) for i in range(50)]


async def test_tool_error_is_a_result(edge: MCPConnection) -> None:
    result = await edge.call_tool("fail", {"message": "disk full"})
    assert result.is_error and "disk full" in str(result.content[0])


async def test_unknown_tool_and_invalid_structured_output_raise(edge: MCPConnection) -> None:
    # Servers answer an unknown tool with an error result or a protocol error; both say which tool.
    try:
        result = await edge.call_tool("no_such_tool", {})
    except ToolCallError as e:
        assert e.server_name == edge.server_name and "no_such_tool" in str(e)
    else:
        assert result.is_error and "no_such_tool" in str(result.content)
    with pytest.raises(ToolCallError, match="bad_structured"):
        await edge.call_tool("bad_structured", {})


async def test_call_timeout(edge: MCPConnection) -> None:
    with pytest.raises(ServerTimeoutError, match="slow"):
        await edge.call_tool("slow", {"seconds": 5}, timeout=0.2)
    assert (await edge.call_tool("echo", {"text": "still usable"})).content[0].type == "text"


async def test_not_started_and_stopped_connections_raise() -> None:
    connection = MCPConnection("idle", params.edge())
    with pytest.raises(ServerNotRunningError, match="'idle'"):
        await connection.list_tools()
    await connection.stop()  # stopping a connection that never started is a no-op


def _children_running(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if marker.encode() in cmdline and " Z " not in stat:
            found.append(int(pid))
    return found


async def test_stop_leaves_no_server_process(tmp_path: Path) -> None:
    marker = str(tmp_path / "marker")
    server = params.edge()
    server["args"].append(f"--token={marker}")  # only to make the command line unique
    async with MCPConnection("orphans", server) as connection:
        assert await connection.list_tools()
        assert _children_running(marker)
    assert not _children_running(marker)
    assert not connection.running


def connection_tasks(name: str) -> set[str]:
    """The names of the tasks of connection `name` in this loop: its group's host and the connection's own."""
    return {task.get_name() for task in asyncio.all_tasks() if name in task.get_name()}


async def test_a_stopped_connection_and_a_failed_start_leave_no_task_behind() -> None:
    async with MCPConnection("tasks", params.edge()):
        assert connection_tasks("tasks") == {"ipybox-MCP connection 'tasks'", "mcp-connection-tasks"}
    assert connection_tasks("tasks") == set()
    with pytest.raises(ServerStartError):
        await MCPConnection("crashing", params.edge("--exit-at-once"), connect_timeout=20).start()
    assert connection_tasks("crashing") == set()


async def test_command_not_found() -> None:
    with pytest.raises(ServerStartError) as info:
        await MCPConnection("ghost", {"command": "no-such-mcp-server-command"}).start()
    assert (
        str(info.value) == "MCP server 'ghost': cannot start 'no-such-mcp-server-command': command not found"
    )


async def test_server_exiting_at_once_reports_its_stderr() -> None:
    with pytest.raises(ServerStartError) as info:
        await MCPConnection("crashy", params.edge("--exit-at-once"), connect_timeout=20).start()
    message = str(info.value)
    assert message.startswith("MCP server 'crashy':") and "\n" not in message
    assert "missing configuration EDGE_CONFIG" in message


async def test_server_never_completing_the_handshake_times_out() -> None:
    started = time.perf_counter()
    with pytest.raises(ServerTimeoutError) as info:
        await MCPConnection("mute", params.edge("--never-handshake"), connect_timeout=1.5).start()
    assert "within 1.5 s" in str(info.value) and "'mute'" in str(info.value)
    assert time.perf_counter() - started < 10


async def test_connection_refused() -> None:
    port = params.free_port()
    for path in ("mcp", "sse"):
        with pytest.raises(ServerConnectError, match="connection refused") as info:
            await MCPConnection(
                "remote", {"url": f"http://127.0.0.1:{port}/{path}"}, connect_timeout=5
            ).start()
        assert "'remote'" in str(info.value)


async def test_http_401_and_404() -> None:
    with params.edge_http_server("streamable-http", "--token", "s3cret") as url:
        with pytest.raises(ServerConnectError, match="HTTP 401") as info:
            await MCPConnection("auth", {"url": url}, connect_timeout=5).start()
        assert "credentials" in str(info.value)
        good = {"url": url, "headers": {"Authorization": "Bearer ${TOKEN}"}}
        wrong_path = {**good, "url": url.replace("/mcp", "/nope/mcp")}
        with pytest.raises(ServerConnectError, match=r"HTTP 404 Not Found from .*/nope/mcp: check the URL"):
            await MCPConnection("auth", wrong_path, environ={"TOKEN": "s3cret"}, connect_timeout=5).start()
        async with MCPConnection("auth", good, environ={"TOKEN": "s3cret"}) as connection:
            assert await connection.list_tools()


async def test_every_failure_is_an_mcp_server_error_not_a_group() -> None:
    for server in ({"command": "no-such-cmd"}, {"url": f"http://127.0.0.1:{params.free_port()}/mcp"}):
        try:
            await MCPConnection("x", server, connect_timeout=5).start()
        except MCPServerError as e:
            assert not isinstance(e, BaseExceptionGroup)
            assert e.__cause__ is None or not isinstance(e.__cause__, BaseExceptionGroup)
        else:
            pytest.fail("start() succeeded")
