"""MCP client sessions for tests, each with its transport in a task of its own: anyio scopes must be left
in the task that entered them, and a module-scoped fixture is torn down in another one. Plus the checks
both transports run: progress of long cells, and a cancellation that frees the kernel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import mcp_types as types
import pytest
from mcp import ClientSession


@asynccontextmanager
async def owned_session(
    open_session: Callable[[AsyncExitStack], Awaitable[ClientSession]],
) -> AsyncIterator[ClientSession]:
    """The initialized session `open_session` opens on a stack that lives in a task of its own."""
    ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def own() -> None:
        try:
            async with AsyncExitStack() as stack:
                session = await open_session(stack)
                await session.initialize()
                ready.set_result(session)
                await done.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e)
            raise

    task = asyncio.create_task(own())
    try:
        yield await ready
    finally:
        done.set()
        await task


# The workspace MCP server's own tools (saved code actions come on top).
BUILT_IN_TOOLS = frozenset(
    {
        "execute_ipython_cell",
        "install_package",
        "reset",
        "close_kernel",
        "upload_file",
        "download_file",
        "register_mcp_server",
        "search_tools",
        "save_code_action",
    }
)


def text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def check_progress(session: ClientSession) -> None:
    """A cell running 2.5 s reports progress, in increasing order."""
    updates: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        updates.append(value)

    code = "import time\ntime.sleep(2.5)\nprint('done')"
    result = await session.call_tool("execute_ipython_cell", {"code": code}, progress_callback=progress)
    assert text(result) == "done"
    assert len(updates) >= 2 and updates == sorted(updates)


async def check_cancellation_frees_the_kernel(session: ClientSession) -> None:
    """Cancelling a call to a cell that never ends leaves the kernel free for the next call."""
    call = asyncio.create_task(
        session.call_tool("execute_ipython_cell", {"code": "while True: pass", "timeout": 300})
    )
    await asyncio.sleep(1.5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    started = asyncio.get_running_loop().time()
    result = await session.call_tool("execute_ipython_cell", {"code": "print('free again')"})
    assert text(result) == "free again"
    assert asyncio.get_running_loop().time() - started < 10  # not waiting for the 300 s timeout


# A rule that lets clients register servers without being asked (clients that cannot answer an
# elicitation need it).
ALLOW_REGISTRATION = """
[[approval.rules]]
id = "registrations"
server = "ipybox"
tool = "register_mcp_server"
decision = "allow"
"""
