"""`ask_question`: put a question to a running workspace's people from another process (the MCP server,
about an MCP client's `register_mcp_server`), over the control endpoint's `/asks` websocket.

Contract: routed by the workspace as `[approval] ask` says (the asker's MCP client through `elicit`, if it
can and comes first; the people present at the console or in `ipybox approve`); the first answer wins; a
person's answer cancels the pending `elicit`. Returns the answer that won, or why there is none (nobody
could answer, nobody did in time); never raises for either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import aiohttp

from ipybox.approval.ask_events import (
    AnswerMessage,
    AnswerView,
    AskClosedMessage,
    AskOpenedMessage,
    AskQuestion,
    parse_server_message,
)
from ipybox.lifecycle import task_scope
from ipybox.running.state import NotRunningError, SupervisorState

__all__ = ["ask_question"]

logger = logging.getLogger(__name__)

Elicit = Callable[[], Awaitable[bool]]
"""Ask the MCP client; `True` to allow. Cancelled when a person answers first."""


async def ask_question(
    state: SupervisorState, question: AskQuestion, elicit: Elicit | None
) -> AnswerView | str:
    """The answer that won, or why there is none.

    Raises:
        NotRunningError: The workspace is not reachable.
    """
    connector = aiohttp.UnixConnector(path=state.control_socket)
    headers = {"Authorization": f"Bearer {state.control_token}"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:
        try:
            ws = await http.ws_connect("http://localhost/asks")
        except aiohttp.ClientError as e:
            raise NotRunningError(f"cannot reach ipybox in {state.workspace}: {e}") from None
        try:
            # The client's dialog runs in a task group of this question's scope: it never outlives it.
            async with task_scope() as group:
                return await _answer(ws, question, elicit, group)
        finally:
            await ws.close()


async def _answer(
    ws: aiohttp.ClientWebSocketResponse,
    question: AskQuestion,
    elicit: Elicit | None,
    group: asyncio.TaskGroup,
) -> AnswerView | str:
    eliciting: asyncio.Task[None] | None = None
    try:
        await ws.send_str(question.to_json())
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                continue
            message = parse_server_message(frame.data)
            if isinstance(message, AskOpenedMessage):
                if message.ask.asked_of == "elicitation" and elicit is not None:
                    eliciting = group.create_task(_elicit(ws, message.ask.id, elicit))
            elif isinstance(message, AskClosedMessage):
                return message.answer if message.answer is not None else message.why
        return "the workspace closed the question without an answer"
    finally:
        if eliciting is not None:
            eliciting.cancel()  # a person answered first: the client's dialog is no longer wanted


async def _elicit(ws: aiohttp.ClientWebSocketResponse, ask_id: str, elicit: Elicit) -> None:
    try:
        accept = await elicit()
    except Exception as e:  # the client could not ask: the question stays with the people asked
        logger.debug("eliciting an answer failed: %s", e)
        return
    with contextlib.suppress(Exception):
        await ws.send_str(AnswerMessage(id=ask_id, accept=accept).to_json())
