"""`Approver`: the one question the tool server asks before a tool call runs, and its typed answers.

The tool server holds exactly one approver and asks it once per call, before the call's MCP server starts:

```python
outcome = await approver.decide(call)   # call: ipybox.rules.ToolCall
```

The outcome is one of four values, and only `Approved` lets the call run:

- `Approved()`: run it.
- `Rejected(reason)`: someone (a rule, the application) refused it; `reason` says why ("" if nobody said).
- `TimedOut(timeout)`: someone was asked and did not answer within `timeout` seconds.
- `NoOneToAsk(reason)`: the call needed an answer and nobody was there to give one (no application
  connected, or it went away mid-question). Never an exception, so a bug in an approver is not mistaken
  for an absent application: an approver that raises is a bug, and the tool server reports it as one.

Implementations, each in its own module of this package:

- [ApproveAll][ipybox.approval.approver.ApproveAll]: approves everything (`ToolServer(approval_required=False)`).
- [FunctionApprover][ipybox.approval.approver.FunctionApprover]: an async function of the call (a policy
  of your own, or a test's).
- [ApprovalChannel][ipybox.approval.channel.ApprovalChannel]: asks an application, in process (the SDK's
  `stream()`) or over the tool server's `/approval` websocket (`ApprovalClient`).
- [WorkspaceApprover][ipybox.approval.rule_approver.WorkspaceApprover]: a workspace's rules; an `ask` goes to
  the application attached to the calling kernel; every decision goes to the audit log.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ipybox.rules.calls import ToolCall

__all__ = [
    "Approval",
    "ApproveAll",
    "Approved",
    "Approver",
    "FunctionApprover",
    "NoOneToAsk",
    "Rejected",
    "TimedOut",
]


@dataclass(frozen=True, slots=True)
class Approved:
    """The call may run."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """The call was refused.

    Attributes:
        reason: Why, for the error the calling code gets ("" when the one who refused gave no reason).
        rule_id: The rule that refused it or asked about it (`Verdict.rule_id`), when one did.
        tier: The admin tier of that rule (`Verdict.tier`), `None` for the workspace's.
        explanation: That rule's `reason` (what it is for, written for the calling code), if it has one.

    Two refusals are equal when their `reason`s are (which names the rule already): the rule's fields are
    for the calling code to act on, and `Rejected("...")` written before they existed still compares.
    """

    reason: str = ""
    rule_id: str | None = field(default=None, compare=False)
    tier: str | None = field(default=None, compare=False)
    explanation: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class TimedOut:
    """Someone was asked about the call and did not answer in time; the call does not run.

    Attributes:
        timeout: The seconds the call waited.
    """

    timeout: float


@dataclass(frozen=True, slots=True)
class NoOneToAsk:
    """The call needed an answer, and nobody could give one; the call does not run.

    Attributes:
        reason: Who was missing, and what to do about it.
    """

    reason: str


Approval = Approved | Rejected | TimedOut | NoOneToAsk
"""The outcome of `Approver.decide`: only `Approved` lets the call run."""


class Approver(Protocol):
    """Decides whether a tool call may run."""

    async def decide(self, call: ToolCall) -> Approval:
        """The outcome for `call`; called once per call, before its MCP server starts.

        Implementations return an outcome for every situation they expect (nobody to ask included) and
        raise only on a bug, which the tool server reports to the calling code as an internal error.
        """
        ...


class ApproveAll:
    """Approves every call: the approver of a `ToolServer(approval_required=False)`."""

    async def decide(self, call: ToolCall) -> Approval:
        return Approved()


class FunctionApprover:
    """An approver made of an async function of the call.

    Example:
        ```python
        async def read_only(call: ToolCall) -> Approval:
            return Approved() if call.annotations.get("readOnlyHint") is True else Rejected("not read-only")

        tool_server = ToolServer(servers=..., approver=FunctionApprover(read_only))
        ```
    """

    def __init__(self, decide: Callable[[ToolCall], Awaitable[Approval]]) -> None:
        self._decide = decide

    async def decide(self, call: ToolCall) -> Approval:
        return await self._decide(call)
