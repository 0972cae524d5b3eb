"""Work that outlives a request: the running cells and approvals of 2026-07-28 clients, which ask their
questions in band (MCP 2026-07-28, multi round-trip requests) or as tasks.

Under 2026-07-28 a server cannot send a request of its own in the middle of a tool call: it answers the
call with an `InputRequiredResult` (what it asks, and a `requestState`), and the client retries the call
with the answers. A cell cannot be run again to get there (its side effects would repeat), so it keeps
running in an `Operation`, blocked where it asked, and the retry resumes it:

- An `Operation` runs its work in the task group of the server that holds it (`Operations.start`, with
  the `spawn` of its `Service`), never in the request's scope, which ends with every round. The work asks with `await operation.ask(...)`; the
  request that drives it waits (`Operation.wait`) until the work asks or ends, and answers the client
  with the questions outstanding then or the work's value.
- Each round's `requestState` names the operation and the round (`Operation.state`). The MCP SDK seals
  it (AES-GCM under a key of this process, bound to the tool and its arguments, expiring) so the client
  can neither read nor forge it; the operation is also bound to its caller (`ipybox.mcp_server.kernels.
  caller_of`), and a round that was answered already is refused (a replay answers nothing twice).
- A question answered elsewhere first (a person at the console, `ipybox approve`, the ask's timeout) is
  withdrawn: it leaves the outstanding questions, and a late answer to it is ignored.
- A value nobody collects (the client went away between rounds) is dropped `keep` seconds after the work
  ended (`Operations.sweep`); work whose client went away still ends, bounded by its own timeout and the
  asks' `ask_timeout`.
- The tasks extension (`ipybox.mcp_server.tasks`) drives the same operations with `tasks/get`,
  `tasks/update` and `tasks/cancel` instead of retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

import mcp_types as types
from mcp.server.mcpserver.exceptions import ToolError

logger = logging.getLogger(__name__)

T = TypeVar("T")

KEEP = 600.0  # seconds an uncollected value is kept: the SDK's request-state lifetime

# The answer form of every question: allow this or not.
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"allow": {"type": "boolean", "title": "Allow", "description": "Run this tool call?"}},
    "required": ["allow"],
}


@dataclass
class Question:
    """A question an operation asks its client: the elicitation it becomes, and what settles it."""

    key: str
    message: str
    answer: asyncio.Future[bool]
    details: dict[str, Any] = field(default_factory=dict)  # what is asked about, for logs and tests
    settled: asyncio.Future[bool] | None = None  # answered elsewhere first, when done

    @property
    def outstanding(self) -> bool:
        return not self.answer.done() and not (self.settled is not None and self.settled.done())

    def request(self) -> types.ElicitRequest:
        params = types.ElicitRequestFormParams(
            message=self.message,
            requested_schema=cast(Any, APPROVAL_SCHEMA),
        )
        return types.ElicitRequest(params=params)


Status = Literal["running", "asking", "done"]


class Operation(Generic[T]):
    """Work running on behalf of one caller, asking it questions (see the module docstring).

    Attributes:
        id: Unguessable; names it in `requestState` and as a task's id.
        owner: The caller it belongs to.
        round: How many times it answered its client with questions.
        meta: What the tool that started it needs to render its value on a later round.
    """

    def __init__(self, owner: str, meta: Mapping[str, Any] | None = None) -> None:
        self.id = secrets.token_urlsafe(16)
        self.owner = owner
        self.meta: dict[str, Any] = dict(meta or {})
        self.round = 0
        self.created = time.time()
        self.updated = self.created
        self.progress = ""  # what the work says it is doing (a task's status message)
        self.cancelled = False
        self.collected = False
        self._questions: dict[str, Question] = {}
        self._asked = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._value: T | None = None
        self._error: Exception | None = None
        self._ended_at: float | None = None
        self._on_cancel: Callable[[], Awaitable[None]] | None = None

    # -- the work's side -----------------------------------------------------------------------------

    async def ask(
        self,
        message: str,
        details: Mapping[str, Any] | None = None,
        settled: asyncio.Future[bool] | None = None,
    ) -> bool:
        """Ask the client; `True` if it allows. `settled` ends the question early with its value (it was
        answered elsewhere): the question is withdrawn."""
        self._asked += 1
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        question = Question(f"ask-{self._asked}", message, answer, dict(details or {}), settled)
        self._questions[question.key] = question
        self._touch()
        if settled is not None:
            settled.add_done_callback(lambda _: self._touch())
        try:
            if settled is None:
                return await answer
            done, _ = await asyncio.wait({answer, settled}, return_when=asyncio.FIRST_COMPLETED)
            return answer.result() if answer in done else settled.result()
        finally:
            self._questions.pop(question.key, None)
            self._touch()

    def on_cancel(self, callback: Callable[[], Awaitable[None]]) -> None:
        """What stops the work when its client cancels (a cell is interrupted, its kernel kept)."""
        self._on_cancel = callback

    def say(self, progress: str) -> None:
        self.progress = progress
        self.updated = time.time()

    # -- the driver's side ---------------------------------------------------------------------------

    @property
    def questions(self) -> dict[str, Question]:
        """The questions outstanding now, by key (one settled elsewhere is not, even before its work
        resumes: a round never returns it)."""
        return {key: question for key, question in self._questions.items() if question.outstanding}

    @property
    def status(self) -> Status:
        if self._ended_at is not None:
            return "done"
        return "asking" if self.questions else "running"

    @property
    def state(self) -> str:
        """This round's `requestState` (sealed by the SDK before it leaves)."""
        return f"{self.id}.{self.round}"

    def answer(self, responses: Mapping[str, Any] | None) -> None:
        """Apply a client's answers: `accept` with `allow: true` allows, anything else denies. Answers to
        questions not outstanding (answered, withdrawn, never asked) are ignored."""
        for key, response in (responses or {}).items():
            question = self._questions.pop(key, None)
            if question is None or not question.outstanding:
                continue
            allowed = (
                isinstance(response, types.ElicitResult)
                and response.action == "accept"
                and (response.content or {}).get("allow") is True
            )
            question.answer.set_result(allowed)
        self._touch()

    async def wait(self, timeout: float | None = None) -> Status:
        """Until the work asks (questions are outstanding) or ends, or `timeout` passes: the status then."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.status == "running":
            self._changed.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return self.status

    def result(self) -> T:
        """The work's value (its exception raised); the operation is collected."""
        assert self.status == "done"
        self.collected = True
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    async def cancel(self) -> None:
        """Stop the work as its client asked: the cell is interrupted, the questions denied."""
        if self.cancelled or self.status == "done":
            return
        self.cancelled = True
        for question in list(self._questions.values()):
            if not question.answer.done():
                question.answer.set_result(False)
        self._questions.clear()
        if self._on_cancel is not None:
            await self._on_cancel()
        self._touch()

    def _touch(self) -> None:
        self.updated = time.time()
        self._changed.set()

    async def _run(self, work: Callable[[Operation[T]], Awaitable[T]]) -> None:
        # A failure is the operation's value, raised to whoever collects it: the task group must not end
        # with the server because one call failed. Cancellation (the server stops) goes through.
        try:
            self._value = await work(self)
        except Exception as e:
            if not isinstance(e, ToolError):
                logger.warning("an operation failed: %r", e)
            self._error = e
        finally:
            self._ended_at = asyncio.get_running_loop().time()
            self._touch()


Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]
"""Runs work in a task group that outlives the request (`Service.spawn` of the server that holds them)."""


class Operations:
    """The operations of one MCP server, run in the task group of the server that holds them (`attach`)."""

    def __init__(self, keep: float = KEEP) -> None:
        self.keep = keep
        self._running: dict[str, Operation[Any]] = {}
        self._spawn: Spawn | None = None

    def attach(self, spawn: Spawn) -> None:
        """Run operations with `spawn` from now on (the server started)."""
        self._spawn = spawn

    def detach(self) -> None:
        """Start no more operations (the server stops; its group cancels those that run)."""
        self._spawn = None

    def start(self, operation: Operation[T], work: Callable[[Operation[T]], Awaitable[T]]) -> Operation[T]:
        """Run `work` for `operation` in the server's task group."""
        if self._spawn is None:
            raise RuntimeError("the MCP server is not running: enter its WorkspaceMCP first")
        operation._task = self._spawn(operation._run(work), f"ipybox-operation-{operation.id[:6]}")
        self._running[operation.id] = operation
        return operation

    def get(self, operation_id: str, owner: str) -> Operation[Any] | None:
        operation = self._running.get(operation_id)
        if operation is None or not secrets.compare_digest(operation.owner, owner):
            return None
        return operation

    def resume(self, state: str, owner: str) -> Operation[Any]:
        """The operation a retry's `requestState` names, at the round it answers.

        Raises:
            ToolError: It names no operation of this caller, or a round answered already.
        """
        operation_id, _, round_text = state.partition(".")
        operation = self.get(operation_id, owner)
        if operation is None or operation.collected:
            raise ToolError(
                "the execution these answers belong to has ended (or belongs to another client): its "
                "result was returned already or expired. Call the tool again"
            )
        if round_text != str(operation.round):
            raise ToolError(
                "these answers are for questions that were answered already: only the latest round of "
                "a call can be answered"
            )
        return operation

    def forget(self, operation: Operation[Any]) -> None:
        self._running.pop(operation.id, None)

    def sweep(self) -> None:
        """Drop operations that ended `keep` seconds ago and were never collected, and collected ones."""
        now = asyncio.get_running_loop().time()
        for key, operation in list(self._running.items()):
            ended = operation._ended_at
            # A task's result may be fetched again until it expires; a round's is returned once.
            collected = operation.collected and not operation.meta.get("task")
            if ended is not None and (collected or now - ended >= self.keep):
                self._running.pop(key, None)
