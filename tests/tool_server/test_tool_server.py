"""ToolServer over its Unix socket with the real server-everything: auth, routing, restarts, cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ipybox import process
from ipybox.approval import ApprovalChannel, ApproveAll
from ipybox.in_kernel.tool_runner import ApprovalRejectedError, ToolRunner, ToolRunnerError
from ipybox.mcp_client.pool import MCPServers
from ipybox.tool_server.tool_server import ToolServer
from tests.servers import params
from tests.servers.processes import pids, tagged
from tests.tool_server.conftest import TAG

pytestmark = pytest.mark.integration


def runner(server: ToolServer, name: str = "everything", token: str | None = None) -> ToolRunner:
    return ToolRunner(
        name, address=server.calls_address, token=token if token is not None else server.call_token
    )


async def call(server: ToolServer, tool: str, args: dict[str, object], **kw: object) -> object:
    return await asyncio.to_thread(runner(server, **kw).run_sync, tool, args)  # type: ignore[arg-type]


async def test_sockets_are_private(tool_server: ToolServer) -> None:
    assert tool_server.unix_socket is not None
    calls = Path(tool_server.calls_address.removeprefix("unix:"))
    assert calls.parent == tool_server.unix_socket.parent
    for sock in (tool_server.unix_socket, calls):
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(tool_server.unix_socket.parent.stat().st_mode) == 0o700


async def raw_exchange(server: ToolServer, *lines: bytes) -> list[bytes]:
    """Send raw request lines on one connection to the call channel; the answer lines, until it closes."""
    reader, writer = await asyncio.open_unix_connection(server.calls_address.removeprefix("unix:"))
    writer.write(b"".join(lines))
    await writer.drain()
    answers = []
    for _ in lines:
        answer = await asyncio.wait_for(reader.readline(), 10)
        if not answer:
            break
        answers.append(answer)
    trailing = await asyncio.wait_for(reader.read(), 10) if len(answers) < len(lines) else b""
    writer.close()
    assert trailing == b""
    return answers


async def test_runs_a_tool(tool_server: ToolServer) -> None:
    assert await call(tool_server, "echo", {"message": "hi"}) == "Echo: hi"


async def test_structured_content_comes_back_as_dict(tool_server: ToolServer) -> None:
    result = await call(tool_server, "get-structured-content", {"location": "New York"})
    assert isinstance(result, dict) and "temperature" in result


async def test_images_are_saved_and_referenced(tool_server: ToolServer) -> None:
    result = await call(tool_server, "get-tiny-image", {})
    assert isinstance(result, str)
    paths = [word.strip("[]()") for word in result.split() if word.strip("[]()").endswith(".png")]
    assert paths
    assert (await asyncio.to_thread(Path(paths[0]).read_bytes)).startswith(b"\x89PNG")


@pytest.mark.parametrize("token", ["", "wrong"])
async def test_requests_without_the_token_are_refused(tool_server: ToolServer, token: str) -> None:
    connector = aiohttp.UnixConnector(path=str(tool_server.unix_socket))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.put("http://localhost/reset", headers=headers) as response:
            assert response.status == 401
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await http.ws_connect("http://localhost/approval", headers=headers)
    with pytest.raises(ToolRunnerError, match="rejected this kernel's token"):
        await call(tool_server, "echo", {"message": "x"}, token=token)


async def test_a_wrong_token_closes_the_connection(tool_server: ToolServer) -> None:
    request = {"op": "run", "server": "everything", "tool": "echo", "args": {"message": "x"}}
    bad = json.dumps({**request, "token": "wrong"}).encode() + b"\n"
    good = json.dumps({**request, "token": tool_server.call_token}).encode() + b"\n"
    # The good request after a bad one on the same connection is never answered.
    [answer] = await raw_exchange(tool_server, bad, good)
    assert json.loads(answer)["error"]["type"] == "unauthorized"


async def test_unknown_server_is_refused_and_no_command_can_be_smuggled(
    tool_server: ToolServer, tmp_path: Path
) -> None:
    canary = tmp_path / "pwned"
    with pytest.raises(ToolRunnerError, match="no MCP server named 'evil' is registered"):
        await call(tool_server, "echo", {"message": "x"}, name="evil")
    # The published ipybox let the kernel send server_params: they are ignored here.
    smuggler = ToolRunner(
        "evil",
        {"command": "touch", "args": [str(canary)]},
        address=tool_server.calls_address,
        token=tool_server.call_token,
    )
    with pytest.raises(ToolRunnerError, match="is registered with this ipybox"):
        await asyncio.to_thread(smuggler.run_sync, "x", {})
    assert not canary.exists()


@pytest.mark.parametrize(
    "line",
    [b"not json\n", b"[1, 2]\n", b'{"token": 1}\n'],
    ids=["not-json", "not-an-object", "token-not-a-string"],
)
async def test_malformed_requests_are_answered_and_the_connection_closed(
    tool_server: ToolServer, line: bytes
) -> None:
    [answer] = await raw_exchange(tool_server, line, line)
    assert json.loads(answer)["error"]["type"] in ("bad_request", "unauthorized")


async def test_bad_requests_keep_the_connection(tool_server: ToolServer) -> None:
    token = tool_server.call_token
    lines = [
        {"token": token, "op": "run", "server": 1},
        {"token": token, "op": "shell", "command": "id"},
        {"token": token, "op": "run", "server": "everything", "tool": "echo", "args": {"message": "ok"}},
    ]
    answers = await raw_exchange(tool_server, *(json.dumps(line).encode() + b"\n" for line in lines))
    assert [json.loads(a).get("error", {}).get("type") for a in answers] == [
        "bad_request",
        "bad_request",
        None,
    ]
    assert json.loads(answers[2])["result"] == "Echo: ok"


async def test_tool_errors_carry_the_servers_message(tool_server: ToolServer) -> None:
    with pytest.raises(ToolRunnerError, match="echo"):
        await call(tool_server, "echo", {})  # missing required argument


async def test_concurrent_calls_share_one_server(tool_server: ToolServer) -> None:
    results = await asyncio.gather(*(call(tool_server, "echo", {"message": str(i)}) for i in range(20)))
    assert results == [f"Echo: {i}" for i in range(20)]
    assert len(pids(TAG)) == 1


async def test_a_crashed_server_is_restarted_on_the_next_call(tool_server: ToolServer) -> None:
    assert await call(tool_server, "echo", {"message": "before"}) == "Echo: before"
    [pid] = pids(TAG)
    os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(0.2)
    try:
        first = await call(tool_server, "echo", {"message": "during"})
    except ToolRunnerError as e:  # the call that finds the connection broken may fail, clearly
        assert "everything" in str(e)
    else:
        assert first == "Echo: during"
    assert await call(tool_server, "echo", {"message": "after"}) == "Echo: after"
    assert pids(TAG) != [pid]


async def test_reset_stops_servers_and_they_start_again(tool_server: ToolServer) -> None:
    await call(tool_server, "echo", {"message": "x"})
    [pid] = pids(TAG)
    await tool_server.reset()
    assert not process.is_alive(pid)
    assert await call(tool_server, "echo", {"message": "again"}) == "Echo: again"


async def test_approval_required_without_a_client_rejects(tmp_path: Path) -> None:
    async with ToolServer(servers={"everything": params.everything()}, approval_required=True) as server:
        with pytest.raises(ApprovalRejectedError, match="no approval client"):
            await call(server, "echo", {"message": "x"})


async def test_tcp_loopback_and_stop_leaves_nothing() -> None:
    server = ToolServer(port=0, servers={"everything": tagged(params.everything(), "tool-exec-tcp")})
    await server.start()
    assert server.address.startswith("http://127.0.0.1:")
    assert server.calls_address.startswith("tcp://127.0.0.1:")
    assert await call(server, "echo", {"message": "tcp"}) == "Echo: tcp"
    port = int(server.calls_address.rpartition(":")[2])
    legacy = ToolRunner(
        "everything", {"ignored": True}, "localhost", port, token=server.call_token
    )  # 0.9 form
    assert await asyncio.to_thread(legacy.run_sync, "echo", {"message": "0.9"}) == "Echo: 0.9"
    started = pids("tool-exec-tcp")
    await server.stop()
    assert started and not any(process.is_alive(pid) for pid in started)


async def test_refuses_non_loopback_hosts() -> None:
    with pytest.raises(ValueError, match="loopback"):
        ToolServer(host="0.0.0.0", port=8900)


async def test_a_restarted_server_is_reached_again_on_the_same_thread(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as thread:  # one thread: its cached connection goes stale in between
        for attempt in range(2):
            everything = {"everything": tagged(params.everything(), "tool-exec-restart")}
            async with ToolServer(unix_socket=tmp_path / "tools.sock", servers=everything) as server:
                runner = ToolRunner("everything", address=server.calls_address, token=server.call_token)
                answer = await loop.run_in_executor(
                    thread, runner.run_sync, "echo", {"message": str(attempt)}
                )
                assert answer == f"Echo: {attempt}"
    assert not (tmp_path / "tools.calls.sock").exists()


async def test_arguments_that_are_not_json_fail_clearly(tool_server: ToolServer) -> None:
    with pytest.raises(ToolRunnerError, match="JSON-serializable"):
        await call(tool_server, "echo", {"message": object()})


async def test_large_arguments_and_results_arrive_whole(tool_server: ToolServer) -> None:
    message = "".join(f"{i:08d}" for i in range(400_000))  # 3.2 MB, many recv() chunks each way
    assert await call(tool_server, "echo", {"message": message}) == f"Echo: {message}"


async def _prepare(name: str, params: Any, secrets: bool) -> Any:
    return params


def test_a_tool_server_is_constructed_complete_from_the_parts_its_caller_made() -> None:
    servers = MCPServers(package_roots=["/tmp"], prepare=_prepare)
    channel = ApprovalChannel(True, None)
    rules, shell = ApproveAll(), ApproveAll()
    server = ToolServer(servers=servers, approval=channel, approver=rules, shell_approver=shell)
    assert (server.servers, server.approval, server.approver, server.shell_approver) == (
        servers,
        channel,
        rules,
        shell,
    )
    assert server.servers.prepare is _prepare
    # Without an approver, the channel given decides when it requires approval.
    assert ToolServer(approval=channel).approver is channel
    assert isinstance(ToolServer(approval=ApprovalChannel(False)).approver, ApproveAll)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"servers": MCPServers(), "connect_timeout": 5},
            r"^connect_timeout= configures the MCPServers a ToolServer makes; with servers=MCPServers\(\.\.\.\), "
            r"pass it to MCPServers and drop connect_timeout= here$",
        ),
        ({"servers": MCPServers(), "environ": {}}, "drop environ= here"),
        ({"approval": ApprovalChannel(True), "approval_timeout": None}, "pass it to ApprovalChannel"),
        ({"approval": ApprovalChannel(True), "approval_required": True}, "drop approval_required= here"),
    ],
)
def test_a_setting_of_a_part_the_caller_made_is_refused_naming_where_it_goes(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ToolServer(**kwargs)
