"""`ApprovalChannel`: asks for a decision on each tool call, and waits for it.

Decisions come from an in-process handler (the SDK's `CodeExecutor`, no network hop) or from an
[ApprovalClient][ipybox.approval.approval_client.ApprovalClient] connected over a websocket, which
receives JSON-RPC requests (`{"method": "approve", "params": {...}}`) and answers each with
`{"result": {"accept": bool}}`. A call nobody can decide on is rejected, never approved.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from ipybox.approval.request import ApprovalRequest

logger = logging.getLogger(__name__)

ApprovalHandler = Callable[[ApprovalRequest], Awaitable[None]]


class ApprovalRejected(Exception):
    """The call was rejected (by the application, or because no one could decide)."""


class ApprovalChannel:
    """Server side of tool call approval.

    Args:
        approval_required: When `False`, every call is approved at once.
        approval_timeout: Seconds to wait for a decision before the call fails.
    """

    def __init__(self, approval_required: bool = False, approval_timeout: float = 60) -> None:
        self.approval_required = approval_required
        self.approval_timeout = approval_timeout
        self.handler: ApprovalHandler | None = None
        self._websocket: WebSocket | None = None
        self._pending: dict[int, asyncio.Future[bool]] = {}
        self._ids = itertools.count(1)
        self._closed = asyncio.Event()

    @property
    def open(self) -> bool:
        """Whether someone is connected to decide (an in-process handler or a websocket client)."""
        return self.handler is not None or self._websocket is not None

    async def request(
        self,
        server_name: str,
        tool_name: str,
        tool_args: dict[str, Any],
        annotations: dict[str, Any] | None = None,
    ) -> bool:
        """Ask for a decision on a tool call.

        Returns:
            `True` if accepted, `False` if rejected.

        Raises:
            RuntimeError: Nobody is connected to decide.
            TimeoutError: No decision within `approval_timeout`.
        """
        if not self.approval_required:
            return True
        if self.handler is not None:
            return await self._ask_handler(self.handler, server_name, tool_name, tool_args, annotations)
        if self._websocket is not None:
            return await self._ask_client(self._websocket, server_name, tool_name, tool_args, annotations)
        raise RuntimeError("no approval client is connected to decide on this tool call")

    async def _ask_handler(
        self,
        handler: ApprovalHandler,
        server_name: str,
        tool_name: str,
        tool_args: dict[str, Any],
        annotations: dict[str, Any] | None,
    ) -> bool:
        decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def respond(accepted: bool) -> None:
            if not decided.done():
                decided.set_result(accepted)

        await handler(ApprovalRequest(server_name, tool_name, tool_args, respond, annotations))
        if decided.done():  # decided right away (auto-approval): no timer needed
            return decided.result()
        return await asyncio.wait_for(decided, self.approval_timeout)

    async def _ask_client(
        self,
        websocket: WebSocket,
        server_name: str,
        tool_name: str,
        tool_args: dict[str, Any],
        annotations: dict[str, Any] | None,
    ) -> bool:
        request_id = next(self._ids)
        decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = decided
        try:
            await websocket.send_json(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "method": "approve",
                    "params": {
                        "server_name": server_name,
                        "tool_name": tool_name,
                        "tool_args": tool_args,
                        "annotations": annotations or {},
                    },
                }
            )
            return await asyncio.wait_for(decided, self.approval_timeout)
        finally:
            self._pending.pop(request_id, None)

    async def connect(self, websocket: WebSocket) -> None:
        """Serve an approval client on `websocket` until it disconnects (one client at a time)."""
        if self._websocket is not None:
            await websocket.close(code=4409, reason="another approval client is connected")
            return
        await websocket.accept()
        self._websocket = websocket
        self._closed.clear()
        try:
            while True:
                message = await websocket.receive_json()
                request_id = message.get("id") if isinstance(message, dict) else None
                decided = self._pending.get(request_id) if isinstance(request_id, int) else None
                if decided is None or decided.done():
                    continue
                result = message.get("result")
                decided.set_result(isinstance(result, dict) and result.get("accept") is True)
        except (WebSocketDisconnect, RuntimeError, ValueError) as e:
            logger.debug("approval client disconnected: %s", e)
        finally:
            self._websocket = None
            self._reject_pending()
            self._closed.set()

    def _reject_pending(self) -> None:
        # A lost decision-maker never approves: every call still waiting is rejected.
        for decided in self._pending.values():
            if not decided.done():
                decided.set_result(False)

    async def disconnect(self) -> None:
        """Close the client's websocket; pending calls are rejected."""
        websocket = self._websocket
        if websocket is not None:
            with contextlib.suppress(Exception):
                await websocket.close()
        self._reject_pending()

    async def join(self, timeout: float = 5) -> None:
        """Wait for the connected approval client to go away."""
        if self._websocket is not None:
            await asyncio.wait_for(self._closed.wait(), timeout)
