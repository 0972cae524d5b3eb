"""ipybox 0.9's ways to start the MCP server, driven over stdio by the Python mcp client:
`python -m ipybox.mcp_server` with all of 0.9's options (a missing workspace is created, the host/port
options are accepted and said unused on stderr, `--sandbox` sandboxes the kernels), and the
`ipybox.mcp_server.MCPServer` class with `kernel_env`. Plus 0.9's truncation notice in `execute_ipython_cell`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import TextIO

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.mcp_server.sessions import BUILT_IN_TOOLS, owned_session, text

pytestmark = pytest.mark.integration

OPTIONS_OF_0_9 = [
    "--tool-server-host",
    "localhost",
    "--tool-server-port",
    "8900",
    "--kernel-gateway-host",
    "localhost",
    "--kernel-gateway-port",
    "8888",
    "--log-level",
    "WARNING",
]


def session_of(
    command: list[str], errlog: TextIO, cwd: Path | None = None
) -> AbstractAsyncContextManager[ClientSession]:
    async def open_session(stack: AsyncExitStack) -> ClientSession:
        params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ), cwd=cwd)
        read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        return await stack.enter_async_context(ClientSession(read, write))

    return owned_session(open_session)


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compat")


@pytest.fixture(scope="module")
async def module_session(parent: Path) -> AsyncIterator[tuple[ClientSession, Path, Path]]:
    """`python -m ipybox.mcp_server --workspace <missing dir> --sandbox` with 0.9's other options."""
    workspace = parent / "not-yet" / "workspace"
    stderr = parent / "module-stderr.txt"
    command = [
        sys.executable,
        "-m",
        "ipybox.mcp_server",
        "--workspace",
        str(workspace),
        "--sandbox",
        *OPTIONS_OF_0_9,
    ]
    with stderr.open("w") as errlog:
        async with session_of(command, errlog) as session:
            yield session, workspace, stderr


async def test_python_m_ipybox_mcp_server_serves_a_created_workspace_with_0_9s_options(
    module_session: tuple[ClientSession, Path, Path],
) -> None:
    session, workspace, stderr = module_session
    names = {tool.name for tool in (await session.list_tools()).tools}
    assert names == BUILT_IN_TOOLS
    assert workspace.is_dir()
    code = "import os\nprint(os.getcwd(), os.environ.get('IPYBOX_SANDBOX_WORKSPACE'))"
    result = await session.call_tool("execute_ipython_cell", {"code": code})
    assert not result.is_error and text(result) == f"{workspace} {workspace}"  # a sandboxed kernel
    assert "enabled = true" in (workspace / "ipybox.toml").read_text()
    lines = stderr.read_text().splitlines()
    unused = [line for line in lines if "ignoring --tool-server-host" in line]
    assert unused == [
        "ipybox: ignoring --tool-server-host localhost, --tool-server-port 8900, --kernel-gateway-host localhost, "
        "--kernel-gateway-port 8888: ipybox serves its tool server and kernel gateway on private Unix sockets, "
        "not on host/port addresses"
    ]
    assert f"ipybox: created the workspace directory {workspace}" in lines
    assert not any(" INFO " in line for line in lines)  # --log-level WARNING


async def test_truncated_output_is_0_9s_first_n_characters_and_notice_then_the_file(
    module_session: tuple[ClientSession, Path, Path],
) -> None:
    session, _, _ = module_session
    code = "for i in range(5000): print(f'line {i}')"
    result = await session.call_tool("execute_ipython_cell", {"code": code, "max_output_chars": 500})
    out = text(result)
    whole = "".join(f"line {i}\n" for i in range(5000))
    # Exactly 0.9.2's text (`output[:500] + notice`), then where the complete output is.
    assert out.startswith(whole[:500] + "\n\n[Output truncated: exceeded 500 character limit]\n")
    assert "line 4999" not in out
    path = out.rsplit("[the complete output is in ", 1)[1].rstrip("]")
    assert Path(path).read_text() == whole


async def test_short_output_carries_no_truncation_notice(
    module_session: tuple[ClientSession, Path, Path],
) -> None:
    session, _, _ = module_session
    result = await session.call_tool(
        "execute_ipython_cell", {"code": "print('short')", "max_output_chars": 500}
    )
    assert text(result) == "short"
    # As 0.9.2, which compared the output without its trailing newline: exactly 500 characters fit.
    result = await session.call_tool(
        "execute_ipython_cell", {"code": "print('x' * 500)", "max_output_chars": 500}
    )
    assert text(result) == "x" * 500
    result = await session.call_tool(
        "execute_ipython_cell", {"code": "print('y' * 501)", "max_output_chars": 500}
    )
    assert text(result).startswith("y" * 500 + "\n\n[Output truncated: exceeded 500 character limit]")


async def test_the_mcp_server_class_serves_the_current_directory_with_kernel_env(parent: Path) -> None:
    workspace = parent / "class-workspace"
    workspace.mkdir()
    script = (
        "import asyncio\n"
        "from ipybox.mcp_server import MCPServer\n"
        "asyncio.run(MCPServer(kernel_gateway_port=8888, kernel_env={'GREETING': 'hello-kernel'}, "
        "log_level='DEBUG').run())\n"
    )
    with (parent / "class-stderr.txt").open("w") as errlog:
        async with session_of([sys.executable, "-c", script], errlog, cwd=workspace) as session:
            code = "import os\nprint(os.getcwd(), os.environ.get('GREETING'))"
            result = await session.call_tool("execute_ipython_cell", {"code": code})
    assert text(result) == f"{workspace} hello-kernel"
    assert "hello-kernel" not in (workspace / "ipybox.toml").read_text()  # never written to a file
    assert " DEBUG ipybox." in (parent / "class-stderr.txt").read_text()  # log_level sets the process's log
