"""`LeasedKernelClient`: the `KernelClient` of an application attached to a workspace, which says so when
the workspace replaced its kernel between two executions.

The workspace may take a lease's kernel while it sits idle: the idle kernel reaper deletes it (`[kernel]
max_idle`, `recycle_rss`), a recycle or a gateway restart replaces every kernel. The application notices
only at its next execution, which runs on a fresh kernel from the pool; the lease answer for that kernel
says why the previous one was taken (`KernelLeased.lost`). Without a word, the agent would meet a
`NameError` for a variable it defined and not know why.

Contract: the first execution on such a replacement carries one notice, `NOTICE` with the reason, as the
first line of its output: a `stderr` chunk before the others (when the execution streams any), and at the
start of the result's `text` and `stderr`, or of the error's message (and its `result`) when the code
raised or the kernel died again. It is told once. A `reset()` asked for by the application tells nothing:
it wanted a fresh kernel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from ipybox.kernels.kernel_client import Cancellation, KernelClient
from ipybox.kernels.result import CodeExecutionChunk, CodeExecutionError, CodeExecutionResult

NOTICE = "[ipybox] this session's kernel was replaced by a fresh one, so all its state is lost: {why}"


class LeasedKernelClient(KernelClient):
    """A `KernelClient` whose kernels come from a lease (see the module docstring).

    Args:
        replaced: Returns why the workspace took the lease's previous kernel, once (then `None`), as the
            last lease answer said.
        submitting: Run with each cell's code while it is sent (the session registers it with the
            workspace, so asks about its calls show it as verified); never fails the execution.
        **kwargs: As for `KernelClient`.
    """

    def __init__(
        self,
        *args: Any,
        replaced: Callable[[], str | None],
        submitting: Callable[[str], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.replaced = replaced
        self.submitting = submitting

    async def reset(self) -> None:
        await super().reset()
        self.replaced()  # asked for: no notice

    async def stream(
        self, code: str, timeout: float | None = 120, *, cancellation: Cancellation | None = None
    ) -> AsyncIterator[CodeExecutionChunk | CodeExecutionResult]:
        notice: str | None = None
        # Registered while the code goes out, not before: a round trip to the workspace per execution
        # would add to every cell's latency, and the kernel's first tool call takes longer than that
        # request to reach the host (an ask opened first shows the kernel's text, marked as such). The
        # task is this execution's: awaited before it ends, cancelled when it is abandoned.
        registering = asyncio.ensure_future(self.submitting(code)) if self.submitting is not None else None
        try:
            async for item in super().stream(code, timeout, cancellation=cancellation):
                # Taken at the first item: the replacement happens before the code is sent.
                first = notice is None and (notice := self._notice()) is not None
                if first and isinstance(item, CodeExecutionChunk):
                    yield CodeExecutionChunk(f"{notice}\n", "stderr")
                if isinstance(item, CodeExecutionResult) and notice is not None:
                    item = _noted(item, notice)
                yield item
        except CodeExecutionError as e:
            # Also a kernel that died under this execution: the reason its predecessor was taken may be
            # why (an execution sent just as the reaper deleted it).
            notice = notice or self._notice()
            if notice is not None:
                e.args = (f"{notice}\n{e.args[0] if e.args else ''}", *e.args[1:])
                e.result = _noted(e.result, notice) if e.result is not None else None
            raise
        else:
            if registering is not None:
                await registering
        finally:
            if registering is not None and not registering.done():
                registering.cancel()  # the execution failed or was abandoned first

    def _notice(self) -> str | None:
        why = self.replaced()
        return NOTICE.format(why=why) if why else None


def _noted(result: CodeExecutionResult, notice: str) -> CodeExecutionResult:
    return replace(
        result,
        text=f"{notice}\n{result.text}" if result.text else notice,
        stderr=f"{notice}\n{result.stderr}" if result.stderr else notice,
    )
