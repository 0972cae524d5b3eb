"""The kernels of the workspace MCP server's callers, and the handles that name them.

Contracts:

- A caller is who a request comes from, as far as the transport can tell: over stdio the process's one
  client (`"stdio"`), over streamable HTTP the endpoint's bearer token (a digest of it: the token itself
  is never kept). Kernels and handles are bound to their caller: a handle presented by another caller is
  unknown to it, exactly like a handle never minted.
- Handshake-era clients (MCP 2025-11-25 and older) keep one kernel per MCP session, keyed by the
  session: `Mcp-Session-Id` over HTTP, the process over stdio. It goes back to the pool when the session
  ends (`ipybox.mcp_server.workspace_mcp`). Over stdio a 2026-07-28 client has the process's kernel as
  its default too: one process serves one client.
- A 2026-07-28 client has no session (MCP 2026-07-28, "Stateful Tools"): it keeps state in a kernel
  handle, minted here, returned by the call that opened the kernel and passed back as the `kernel`
  argument of every tool that touches a kernel. A handle is 128 random bits (never derived from anything
  a caller sees), so knowing one is the capability to use that kernel; it expires after `idle` seconds
  unused (`[endpoints] kernel_idle`), and the kernel goes back to the pool then.
- A caller holds at most `max_kernels` handles at once: a model that forgets its handle and opens a
  kernel per call is told to pass or close one, rather than leasing the pool dry.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from ipybox.executor.code_executor import CodeExecutor

logger = logging.getLogger(__name__)

HANDLE_PREFIX = "kernel-"
NEW = "new"  # the `kernel` argument that asks for a new kernel
DEFAULT_IDLE = 1800.0  # seconds a handle's kernel may sit unused: the MCP SDK's own session idle timeout
DEFAULT_MAX_KERNELS = 8

STDIO = "stdio"

# Set while a saved code action's tool runs its cell: a caller without a session kernel gets a kernel for
# that one call (no handle: a tool call carries none), closed when the call ends.
ACTION_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("ipybox_action_call", default=False)


def caller_of(ctx: Context) -> str:
    """Who `ctx`'s request comes from (see the module docstring): `"stdio"`, or a digest of the bearer
    token the HTTP request carried."""
    return caller_of_request(ctx.request_context.request)


def caller_of_request(request: object) -> str:
    """`caller_of` for the transport's request object (`None` over stdio)."""
    headers = getattr(request, "headers", None)
    if headers is None:
        return STDIO
    token = headers.get("authorization", "")
    return "http:" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def session_key(ctx: Context) -> str | None:
    """The key of the handshake-era session or stdio process `ctx` belongs to; `None` for a 2026-07-28
    request over HTTP, which belongs to no session."""
    headers = getattr(ctx.request_context.request, "headers", None)
    if headers is None:
        return STDIO
    session = headers.get("mcp-session-id")
    return f"session:{session}" if session else None


@dataclass(eq=False)
class Kernel:
    """One caller's kernel: its executor, the lock its calls take turns on, and when it was last used.

    Attributes:
        handle: The handle that names it (`None` for a session's or the stdio process's own kernel).
    """

    executor: CodeExecutor
    owner: str
    handle: str | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = 0.0
    one_call: bool = False  # opened for one call, closed when it ends (`Kernels.release`)

    def touch(self) -> None:
        self.last_used = asyncio.get_running_loop().time()


OpenExecutor = Callable[[Context], Awaitable[CodeExecutor]]


class Kernels:
    """The kernels of one MCP server's callers, by session key and by handle."""

    def __init__(
        self, open_executor: OpenExecutor, idle: float = DEFAULT_IDLE, max_kernels: int = DEFAULT_MAX_KERNELS
    ) -> None:
        self._open_executor = open_executor
        self.idle = idle
        self.max_kernels = max_kernels
        self._by_key: dict[str, Kernel] = {}
        self._by_handle: dict[str, Kernel] = {}
        self._one_call: set[Kernel] = set()

    def __iter__(self) -> Iterator[Kernel]:
        yield from list(self._by_key.values())
        yield from list(self._by_handle.values())
        yield from list(self._one_call)

    def executors(self) -> list[CodeExecutor]:
        return [kernel.executor for kernel in self]

    # -- session kernels (handshake era, and stdio's default) ----------------------------------------

    def of_session(self, key: str) -> Kernel | None:
        return self._by_key.get(key)

    async def open_session(self, key: str, ctx: Context) -> tuple[Kernel, bool]:
        """The kernel of session `key`, opened now if it has none; and whether it was opened now."""
        kernel = self._by_key.get(key)
        if kernel is not None:
            return kernel, False
        executor = await self._open_executor(ctx)
        kernel = self._by_key.setdefault(key, Kernel(executor, caller_of(ctx), None))
        if kernel.executor is not executor:  # another request of the session won the race
            await executor.stop()
            return kernel, False
        return kernel, True

    async def end_session(self, key: str, kernel: Kernel) -> None:
        """Give back the kernel of a session that ended, once a call still finishing with it is done."""
        async with kernel.lock:
            if self._by_key.get(key) is not kernel:
                return  # the sweep gave it back already
            del self._by_key[key]
            await kernel.executor.stop()
        logger.info("MCP session %s ended: its kernel went back to the pool", key.rpartition(":")[2][:8])

    # -- handles (2026-07-28) ------------------------------------------------------------------------

    def get(self, handle: str, ctx: Context) -> Kernel:
        """The kernel `handle` names for the caller of `ctx`.

        Raises:
            ToolError: It names none of this caller's kernels (never minted, expired, or closed).
        """
        kernel = self._by_handle.get(handle)
        if kernel is None or not secrets.compare_digest(kernel.owner, caller_of(ctx)):
            shown = handle if len(handle) <= 64 else handle[:64] + "..."
            raise ToolError(
                f"kernel {shown!r} is unknown or has expired (a kernel unused for {self.idle:g} s is closed, "
                f"and reset keeps its handle). Call execute_ipython_cell with kernel={NEW!r} to open a new "
                "kernel and pass the handle it returns; variables of the old kernel are gone"
            )
        return kernel

    async def open(self, ctx: Context) -> Kernel:
        """A new kernel for the caller of `ctx`, named by a new handle.

        Raises:
            ToolError: The caller holds `max_kernels` handles already.
        """
        owner = caller_of(ctx)
        held = sum(1 for kernel in self._by_handle.values() if kernel.owner == owner)
        if held >= self.max_kernels:
            raise ToolError(
                f"this client has {held} kernels open, the most it may hold: pass the handle of one of them "
                "as `kernel` (each result names its kernel), or close one with close_kernel"
            )
        executor = await self._open_executor(ctx)
        handle = HANDLE_PREFIX + secrets.token_urlsafe(16)
        kernel = Kernel(executor, owner, handle)
        self._by_handle[handle] = kernel
        logger.info("kernel %s... opened for a 2026-07-28 client", handle[: len(HANDLE_PREFIX) + 4])
        return kernel

    async def open_for_call(self, ctx: Context) -> Kernel:
        """A kernel for one call of a caller without a session kernel (see `ACTION_CALL`)."""
        kernel = Kernel(await self._open_executor(ctx), caller_of(ctx), None, one_call=True)
        self._one_call.add(kernel)
        return kernel

    async def release(self, kernel: Kernel) -> None:
        """Close `kernel` if it was opened for one call (`open_for_call`); others stay."""
        if kernel.one_call and kernel in self._one_call:
            self._one_call.discard(kernel)
            await kernel.executor.stop()

    async def close(self, kernel: Kernel) -> None:
        """Close a handle's kernel (after the call running in it, if one is)."""
        async with kernel.lock:
            if kernel.handle is None or self._by_handle.pop(kernel.handle, None) is None:
                return
            await kernel.executor.stop()

    # -- expiry --------------------------------------------------------------------------------------

    async def close_idle(self, idle_for: float | None = None) -> None:
        """Give back the kernels unused for `idle_for` seconds (default: `idle`); `0` closes all of them
        (the server stops). A kernel in use is left alone unless the server stops."""
        idle_for = self.idle if idle_for is None else idle_for
        now = asyncio.get_running_loop().time()
        for table in (self._by_key, self._by_handle):
            for key, kernel in list(table.items()):
                if idle_for > 0 and (now - kernel.last_used < idle_for or kernel.lock.locked()):
                    continue
                if table.pop(key, None) is not None:
                    await kernel.executor.stop()
        if idle_for <= 0:
            for kernel in list(self._one_call):
                self._one_call.discard(kernel)
                await kernel.executor.stop()
