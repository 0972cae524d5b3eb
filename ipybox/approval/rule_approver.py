"""`WorkspaceApprover`: decides on every tool call of a workspace's kernels with its approval rules.

`allow` and `deny` are decided on the spot. `ask` goes to the application attached to the calling kernel
(over a websocket the supervisor serves per lease, speaking the approval channel's JSON-RPC, so
`ApprovalClient` connects to it) and is denied when nobody answers within `ask_timeout` or nobody is
attached. Every decision is appended to the audit log.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket

from ipybox.approval.channel import ApprovalChannel
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall
from ipybox.tool_server.approver import ToolCallRequest

logger = logging.getLogger(__name__)


class WorkspaceApprover:
    """The tool server's approver in a workspace.

    Args:
        policy: The `[approval]` table (swapped on reload through `policy`).
        audit: Where decisions are recorded.
        lease_of: The lease (attached application) a caller's kernel belongs to, if any.
    """

    def __init__(self, policy: ApprovalPolicy, audit: AuditLog, lease_of: dict[str, str]) -> None:
        self.policy = policy
        self.audit = audit
        self.lease_of = lease_of
        self._channels: dict[str, ApprovalChannel] = {}

    async def __call__(self, request: ToolCallRequest) -> str | None:
        call = ToolCall(
            request.server_name, request.tool_name, request.tool_args, _hints(request.annotations)
        )
        verdict = self.policy.decide(call)
        if verdict.decision != "ask":
            await asyncio.to_thread(self.audit.record, call, verdict)
            if verdict.decision == "allow":
                return None
            return f"denied by {_source(verdict.rule_id)}"
        channel = self._channels.get(self.lease_of.get(request.caller, ""))
        if channel is None or not channel.open:
            reason = (
                f"{_source(verdict.rule_id)} asks, but no application is attached to answer; "
                f"add an allow rule for {request.server_name}.{request.tool_name} to ipybox.toml"
            )
            await asyncio.to_thread(self.audit.record, call, verdict, timed_out=True, reason=reason)
            return reason
        channel.approval_timeout = self.policy.ask_timeout
        try:
            accepted = await channel.request(
                request.server_name, request.tool_name, request.tool_args, request.annotations
            )
        except (TimeoutError, RuntimeError):
            reason = f"no answer within {self.policy.ask_timeout:g} s ({_source(verdict.rule_id)} asks)"
            await asyncio.to_thread(self.audit.record, call, verdict, timed_out=True, reason=reason)
            return reason
        await asyncio.to_thread(self.audit.record, call, verdict, answer="allow" if accepted else "deny")
        return None if accepted else "rejected by the application"

    async def serve(self, lease: str, websocket: WebSocket) -> None:
        """Serve the approval websocket of an attached application until it disconnects."""
        channel = self._channels.setdefault(lease, ApprovalChannel(True, self.policy.ask_timeout))
        try:
            await channel.connect(websocket)
        finally:
            if not channel.open:
                self._channels.pop(lease, None)

    async def drop(self, lease: str) -> None:
        """Forget a lease: its pending asks are denied."""
        channel = self._channels.pop(lease, None)
        if channel is not None:
            await channel.disconnect()


def _hints(annotations: dict[str, object]) -> dict[str, bool]:
    return {key: value for key, value in annotations.items() if isinstance(value, bool)}


def _source(rule_id: str | None) -> str:
    return f"rule {rule_id!r}" if rule_id is not None else "the default decision"
