"""Long cells as tasks: the `io.modelcontextprotocol/tasks` extension (SEP-2663) for 2026-07-28 clients
that declare it.

Contracts:

- Only `execute_ipython_cell` becomes a task, only for a request whose per-request capabilities name the
  extension, and only once the cell has run `TASK_AFTER` seconds without ending or asking: a short cell
  answers as usual, and an ask before then is answered in band (the spec wants those resolved before a
  task is created). The tool body decides (`become_task`); the extension's `tools/call` interceptor turns
  that decision into the `CreateTaskResult` (`resultType: "task"`), the one result shape a tool body
  cannot return itself.
- A task is the cell's `Operation` (`ipybox.mcp_server.rounds`): its id is the operation's, unguessable,
  and `tasks/get`, `tasks/update` and `tasks/cancel` find it only for the caller that started it; any
  other id is an error (-32602, "unknown task").
- `tasks/get` says `working` with a status message (how long it has run, the tail of its output so far),
  `input_required` with the approvals it waits for (`inputRequests`, answered by `tasks/update`),
  `completed` with the `CallToolResult` (a cell that raised is a result with `isError`), `cancelled`
  after `tasks/cancel` (the cell is interrupted, the kernel keeps its state), or `failed` with a JSON-RPC
  error. A task is kept `Operations.keep` seconds after it ended (`ttlMs`).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, InputResponses, RequestParams
from pydantic import Field

from ipybox.mcp_server.kernels import caller_of_request
from ipybox.mcp_server.rounds import Operation, Operations

TASKS = "io.modelcontextprotocol/tasks"
TASK_AFTER = 1.0  # seconds a cell runs before it becomes a task
POLL_INTERVAL_MS = 1000
TASK_TOOLS = frozenset({"execute_ipython_cell"})
_MODERN = frozenset({"2026-07-28"})
_OUTPUT_TAIL = 400  # characters of output so far in a working task's status message

Render = Callable[[Operation[Any]], Awaitable[types.CallToolResult]]


@dataclass
class _Slot:
    operation: Operation[Any] | None = None


_slot: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("ipybox_task_slot", default=None)


def declares_tasks(ctx: Context) -> bool:
    """Whether the request of `ctx` declares the tasks extension (and may be answered with a task)."""
    if _slot.get() is None:
        return False
    capabilities = ctx.client_capabilities
    return capabilities is not None and TASKS in (capabilities.extensions or {})


def become_task(operation: Operation[Any]) -> None:
    """Answer the current `tools/call` with a task for `operation` (its body returns a placeholder)."""
    slot = _slot.get()
    if slot is None:
        raise RuntimeError("become_task outside a tools/call the tasks extension intercepts")
    slot.operation = operation


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId", max_length=256)


class UpdateTaskParams(TaskParams):
    input_responses: InputResponses = Field(alias="inputResponses")


class TasksExtension(Extension):
    """Serves `tasks/get`, `tasks/update` and `tasks/cancel` over the server's `Operations`."""

    identifier = TASKS

    def __init__(self, operations: Operations, render: Render) -> None:
        self._operations = operations
        self._render = render

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskParams, self._get, _MODERN),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, _MODERN),
            MethodBinding("tasks/cancel", TaskParams, self._cancel, _MODERN),
        )

    async def intercept_tool_call(
        self, params: types.CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if params.name not in TASK_TOOLS:
            return await call_next(ctx)
        slot = _Slot()
        token = _slot.set(slot)
        try:
            result = await call_next(ctx)
        finally:
            _slot.reset(token)
        if slot.operation is None:
            return result
        return {"resultType": "task", **self._task(slot.operation)}

    # -- methods -------------------------------------------------------------------------------------

    def _find(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> Operation[Any]:
        operation = self._operations.get(task_id, caller_of_request(ctx.request))
        if operation is None or not operation.meta.get("task"):
            raise MCPError(
                code=INVALID_PARAMS,
                message="unknown task: it expired, or was never created for this client",
                data={"taskId": task_id[:256]},
            )
        return operation

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        operation = self._find(ctx, params.task_id)
        task = self._task(operation)
        if task["status"] == "input_required":
            task["inputRequests"] = {
                key: question.request().model_dump(by_alias=True, exclude_none=True, mode="json")
                for key, question in operation.questions.items()
            }
        elif task["status"] == "completed":
            rendered = await self._render(operation)
            task["result"] = {
                "resultType": "complete",
                **rendered.model_dump(by_alias=True, exclude_none=True),
            }
        return {"resultType": "complete", **task}

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> HandlerResult:
        self._find(ctx, params.task_id).answer(params.input_responses)
        return {"resultType": "complete"}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        await self._find(ctx, params.task_id).cancel()
        return {"resultType": "complete"}

    # -- the task's state ----------------------------------------------------------------------------

    def _task(self, operation: Operation[Any]) -> dict[str, Any]:
        status = operation.status
        if status == "done":
            state = "cancelled" if operation.cancelled else "completed"
            message = "the cell was interrupted" if operation.cancelled else "done"
        elif status == "asking":
            state = "input_required"
            message = f"waiting for the approval of {len(operation.questions)} tool call(s)"
        else:
            state = "working"
            message = f"running for {time.time() - operation.created:.0f} s"
            if operation.progress:
                message += "; output so far ends with:\n" + operation.progress[-_OUTPUT_TAIL:]
        return {
            "taskId": operation.id,
            "status": state,
            "statusMessage": message,
            "createdAt": _iso(operation.created),
            "lastUpdatedAt": _iso(operation.updated),
            "ttlMs": int(self._operations.keep * 1000),
            "pollIntervalMs": POLL_INTERVAL_MS,
        }


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")
