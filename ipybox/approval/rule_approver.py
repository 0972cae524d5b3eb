"""`WorkspaceApprover`: the rule-based approver of a workspace's tool calls.

For each call: the `[approval]` rules decide; `allow` and `deny` stand at once; `ask` goes to the
application attached to the calling kernel (its [ApprovalChannel][ipybox.approval.channel.ApprovalChannel],
whose websocket the supervisor serves, so `ApprovalClient` connects to it); then the decision
is appended to the audit log, before the call can run.

Contracts:

- The approver owns no channel: `answerer` (the supervisor's `LeaseTable.answerer`) says which
  application answers a caller's `ask`, so one table holds leases, kernels, callers and channels.
- The rules' word on an unanswered `ask` is "deny": an `ask` that times out is `Rejected` (audited as
  decided by `timeout`), not `TimedOut`, so the calling code gets a rejection naming the rule.
- An `ask` with nobody attached to the caller's lease (or whose application leaves mid-question) is
  `NoOneToAsk`, with the allow rule to add; it is audited as unanswered.
- A decision that can't be audited is not acted on: the `OSError` propagates and the call fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ipybox.approval.approver import Approval, Approved, NoOneToAsk, Rejected, TimedOut
from ipybox.approval.channel import ApprovalChannel
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall

__all__ = ["WorkspaceApprover"]

logger = logging.getLogger(__name__)


class WorkspaceApprover:
    """The tool server's approver in a workspace (an [Approver][ipybox.approval.approver.Approver]).

    Args:
        policy: The `[approval]` table (swapped on reload through `policy`).
        audit: Where decisions are recorded.
        answerer: The open approval channel of the application attached to a caller's kernel, if any;
            asked on each `ask`.
    """

    def __init__(
        self,
        policy: ApprovalPolicy,
        audit: AuditLog,
        answerer: Callable[[str], ApprovalChannel | None],
    ) -> None:
        self.policy = policy
        self.audit = audit
        self.answerer = answerer

    async def decide(self, call: ToolCall) -> Approval:
        policy = self.policy  # one policy per call, even if the rules are reloaded meanwhile
        verdict = policy.decide(call)
        source = _source(verdict.rule_id)
        if verdict.decision != "ask":
            await asyncio.to_thread(self.audit.record, call, verdict)
            return Approved() if verdict.decision == "allow" else Rejected(f"denied by {source}")
        channel = self.answerer(call.caller)
        if channel is None or not channel.open:
            outcome: Approval = NoOneToAsk(f"{source} asks, but no application is attached to answer")
        else:
            outcome = await channel.decide(call, timeout=policy.ask_timeout)
        match outcome:
            case Approved():
                await asyncio.to_thread(self.audit.record, call, verdict, answer="allow")
                return outcome
            case Rejected(why):
                await asyncio.to_thread(self.audit.record, call, verdict, answer="deny")
                return Rejected(why or "rejected by the application")
            case TimedOut(timeout):
                reason = f"no answer within {timeout:g} s ({source} asks)"
                await asyncio.to_thread(self.audit.record, call, verdict, timed_out=True, reason=reason)
                return Rejected(reason)
            case NoOneToAsk(why):
                reason = f"{why}; add an allow rule for {call.server}.{call.tool} to ipybox.toml"
                await asyncio.to_thread(self.audit.record, call, verdict, timed_out=True, reason=reason)
                return NoOneToAsk(reason)


def _source(rule_id: str | None) -> str:
    return f"rule {rule_id!r}" if rule_id is not None else "the default decision"
