"""MCP client sessions for tests, each with its transport in a task of its own: anyio scopes must be left
in the task that entered them, and a module-scoped fixture is torn down in another one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

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
