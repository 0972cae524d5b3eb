"""`ipybox mcp` over stdio, driven by the Python mcp client: a directory left untouched until a tool is
called, instructions that describe it, register a server, execute code that uses its generated API,
approval through elicitation (or a clear denial without it), install, reset."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.cli.test_main import IPYBOX
from tests.mcp_server.sessions import (
    BUILT_IN_TOOLS,
    check_cancellation_frees_the_kernel,
    check_progress,
    owned_session,
    text,
)
from tests.servers.params import EDGE_SERVER

pytestmark = pytest.mark.integration

ANSWERS: list[bool] = []
ASKED: list[str] = []  # the elicitations' messages


async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    ASKED.append(params.message)
    allow = ANSWERS.pop(0) if ANSWERS else False
    return types.ElicitResult(action="accept", content={"allow": allow})


async def open_session(
    stack: AsyncExitStack, workspace: Path, *args: str, elicitation: bool = True
) -> ClientSession:
    params = StdioServerParameters(command=str(IPYBOX), args=[*args, "--workspace", str(workspace)])
    read, write = await stack.enter_async_context(stdio_client(params))
    session = ClientSession(read, write, elicitation_callback=elicit if elicitation else None)
    return await stack.enter_async_context(session)


# The workspace's directory before the server started, and after a health check: every entry with its
# mtime and content.
UNTOUCHED: list[list[tuple[str, int, bytes]]] = []
CHECKED: list[list[tuple[str, int, bytes]]] = []


def listing(directory: Path) -> list[tuple[str, int, bytes]]:
    entries = [directory, *sorted(directory.rglob("*"))]
    return [
        (str(p.relative_to(directory)), p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
        for p in entries
    ]


@pytest.fixture(scope="module")
async def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workspace = tmp_path_factory.mktemp("mcp-ws")
    (workspace / ".env").write_text("EDGE_TOKEN=from-dotenv\nKERNEL_ENV_GREETING=hello-kernel\n")
    UNTOUCHED.append(listing(workspace))
    return workspace


def client(
    workspace: Path, *args: str, elicitation: bool = True
) -> AbstractAsyncContextManager[ClientSession]:
    return owned_session(lambda stack: open_session(stack, workspace, *args, elicitation=elicitation))


@pytest.fixture(scope="module")
async def session(workspace: Path) -> AsyncIterator[ClientSession]:
    async with client(workspace) as session:  # the bare `ipybox --workspace DIR` form of ipybox 0.9
        # A health check, as `claude mcp list` makes (initialize, then tools/list), before any other test.
        await session.list_tools()
        CHECKED.append(listing(workspace))
        yield session


async def test_a_health_check_writes_nothing_and_the_first_call_makes_the_directory_a_workspace(
    session: ClientSession, workspace: Path
) -> None:
    # What `claude mcp list` does (initialize, then tools/list) wrote no file into the directory.
    assert CHECKED == UNTOUCHED
    names = {tool.name for tool in (await session.list_tools()).tools}
    assert names == BUILT_IN_TOOLS
    # Told what the workspace will be: a directory without ipybox.toml, served without --sandbox.
    result = session.initialize_result
    assert result is not None and result.instructions is not None
    assert (
        "Kernels are not sandboxed" in result.instructions
        and "sandbox" not in result.instructions.split("Kernels are not sandboxed")[0]
    )
    # The first tool call uses it: the workspace is created and started, its state git-ignored.
    assert text(await session.call_tool("execute_ipython_cell", {"code": "print(6 * 7)"})).strip() == "42"
    assert (workspace / "ipybox.toml").is_file()
    assert (workspace / ".ipybox" / ".gitignore").read_text().splitlines()[-1] == "*"


@pytest.mark.slow
async def test_register_then_use_the_generated_api(session: ClientSession, workspace: Path) -> None:
    params = {"command": sys.executable, "args": [str(EDGE_SERVER)], "env": {"EDGE_TOKEN": "${EDGE_TOKEN}"}}
    ANSWERS[:] = [True]  # no rule covers registrations: the client is asked
    result = await session.call_tool("register_mcp_server", {"server_name": "edge", "server_params": params})
    assert not result.is_error, text(result)
    assert text(result).startswith("mcptools.edge: ") and "echo" in text(result)
    toml = (workspace / "ipybox.toml").read_text()
    assert "[servers.edge]" in toml and "${EDGE_TOKEN}" in toml  # the placeholder, never the value

    ANSWERS[:] = [True]
    code = "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='via mcp')))"
    result = await session.call_tool("execute_ipython_cell", {"code": code})
    assert not result.is_error and text(result) == "via mcp"
    # The client was asked with what a person sees: the call, the session's client, the rule, the code.
    message = ASKED[-1]
    assert message.startswith("ipybox: allow the tool call edge.echo(text='via mcp')?\nAsked by mcp")
    assert "0 calls so far" in message and "\nAsked because of the default decision" in message
    assert re.search(
        r"\nCode \(cell \d+, verified: submitted through ipybox\):\n     1 \| from mcptools", message
    )
    assert ">    2 | print(echo.run(echo.Params(text='via mcp')))" in message

    ANSWERS[:] = [False]
    result = await session.call_tool("execute_ipython_cell", {"code": code})
    assert result.is_error and "rejected by the MCP client" in text(result)


async def test_state_env_and_reset(session: ClientSession) -> None:
    await session.call_tool("execute_ipython_cell", {"code": "x = 41"})
    result = await session.call_tool(
        "execute_ipython_cell",
        {"code": "import os\nprint(x + 1, os.environ.get('GREETING'), os.environ.get('EDGE_TOKEN'))"},
    )
    assert text(result) == "42 hello-kernel None"
    assert not (await session.call_tool("reset", {})).is_error
    result = await session.call_tool("execute_ipython_cell", {"code": "print('x' in globals())"})
    assert text(result) == "False"


async def test_long_output_keeps_its_first_max_output_chars_as_0_9_did(session: ClientSession) -> None:
    code = "for i in range(5000): print(f'line {i}')"
    result = await session.call_tool("execute_ipython_cell", {"code": code, "max_output_chars": 500})
    out = text(result)
    head = "".join(f"line {i}\n" for i in range(5000))[:500]
    assert out.startswith(head + "\n\n[Output truncated: exceeded 500 character limit]")
    assert "line 4999" not in out and len(out) < 800
    path = out.rsplit("[the complete output is in ", 1)[1].rstrip("]")
    assert Path(path).read_text().count("\n") >= 5000


async def test_errors_and_timeouts_are_tool_errors(session: ClientSession) -> None:
    result = await session.call_tool("execute_ipython_cell", {"code": "1 / 0"})
    assert result.is_error and "ZeroDivisionError" in text(result)
    result = await session.call_tool(
        "execute_ipython_cell", {"code": "import time\ntime.sleep(30)", "timeout": 1}
    )
    assert result.is_error
    assert text(await session.call_tool("execute_ipython_cell", {"code": "print('alive')"})) == "alive"


async def test_bad_registrations_are_one_clear_error(session: ClientSession) -> None:
    result = await session.call_tool(
        "register_mcp_server", {"server_name": "", "server_params": {"command": "x"}}
    )
    assert result.is_error and "is not a valid Python package name" in text(result)
    # A name as other clients spell them is mapped, not refused: what fails here is the url.
    result = await session.call_tool(
        "register_mcp_server", {"server_name": "my-server", "server_params": {"url": "ftp://x"}}
    )
    assert result.is_error and "http" in text(result) and "package name" not in text(result)
    result = await session.call_tool(
        "register_mcp_server", {"server_name": "bad", "server_params": {"url": "ftp://x"}}
    )
    assert result.is_error and "http" in text(result)


async def test_without_elicitation_ask_is_denied_with_the_rule_to_add(
    workspace: Path, session: ClientSession
) -> None:
    async with client(workspace, "mcp", elicitation=False) as other:  # the first keeps the workspace up
        code = "from mcptools.edge import echo\ntry:\n print(echo.run(echo.Params(text='x')))\nexcept Exception as e:\n print(type(e).__name__)"
        result = await other.call_tool("execute_ipython_cell", {"code": code})
        out = text(result)
        assert out.startswith("ApprovalRejectedError") and "Add an allow rule" in out and "edge.echo" in out
        assert "nobody could answer" in out and "ipybox console" in out


async def test_install_package_reports_pip_failures(session: ClientSession) -> None:
    result = await session.call_tool("install_package", {"package_name": "ipybox-no-such-package-xyz"})
    assert result.is_error and "pip could not install" in text(result)
    result = await session.call_tool("install_package", {"package_name": "a\nb"})
    assert result.is_error and "one requirement" in text(result)


async def test_long_cells_report_progress(session: ClientSession) -> None:
    await check_progress(session)


async def test_a_cancelled_call_interrupts_the_kernel(session: ClientSession) -> None:
    await check_cancellation_frees_the_kernel(session)


async def test_a_request_whose_json_escapes_a_lone_surrogate_is_answered(tmp_path: Path) -> None:
    # A client in JavaScript sends a string holding a lone surrogate as the escape "\ud800", valid JSON
    # that mcp's parser refuses: the request was dropped and never answered. The SDK's client can't send
    # it, so the lines are written by hand.
    process = await asyncio.create_subprocess_exec(
        str(IPYBOX),
        "mcp",
        "--workspace",
        str(tmp_path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def answer(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode()
        )
        stdin.write(b"\n")
        while True:
            message = json.loads(await stdout.readline())
            if message.get("id") == request_id:
                return dict(message)

    try:
        async with asyncio.timeout(60):  # it never came: the test would wait forever
            client = {"name": "js", "version": "1"}
            await answer(
                1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
            )
            stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
            code = "print(ascii('a\ud800b'))"
            assert "\"print(ascii('a\\ud800b'))\"" in json.dumps(code)  # the escape is what goes on the wire
            called = await answer(
                2, "tools/call", {"name": "execute_ipython_cell", "arguments": {"code": code}}
            )
    finally:
        stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()
    assert called["result"]["content"][0]["text"] == "'a\\ufffdb'"
