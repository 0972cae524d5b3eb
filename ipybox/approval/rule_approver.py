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
- A kernel's question about a shell command (`ipybox.shell` / `ipybox.shell_magic`) is split into the
  commands it runs ([shell_commands][ipybox.rules.shell_commands]), each decided by the rules as
  `shell.<program>(cmd=<text>)`; it runs only if every command may. An allow rule counts for shell commands
  only if its `server` names `shell` itself, not through a glob such as `*`: allow rules written for tool
  calls don't let commands run (deny and ask rules, and the default, apply as to any call). Any `deny`
  refuses the line at once, naming the command and the rule, and nobody is asked; then each `ask` is put
  to the application in turn (it sees that command's call), and the first answer other than yes refuses
  it. A line that cannot be read is refused. The audit log gets an entry for each command whose decision stands: every command when
  the line runs; when it does not, those decided before it was refused (each allow saying it did not
  run) and the one that refused it. A line that can't be read is audited as `ipybox.<kind>`, denied.
- The rules decide on the event loop while a call's arguments are small, and in a worker thread once
  they hold `LARGE_ARGUMENTS` or more (characters of strings plus values, counted by a walk that stops
  at the threshold). Rule regexes are linear (RE2), but linear in 16 MiB is still 20-90 ms per regex;
  small calls stay inline because they are the critical path (see `LARGE_ARGUMENTS` for the numbers).
  While a large decision runs, the loop still stalls for the UTF-8 copy of the argument that each regex
  takes under the GIL (~2-7 ms for 16 MiB); RE2's matching itself releases the GIL.
  Large decisions share one worker thread per process, so a kernel flooding large calls queues behind
  itself and takes at most one core, never the loop or the default executor (where audits are written).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Literal

from ipybox.approval.approver import Approval, Approved, NoOneToAsk, Rejected, TimedOut
from ipybox.approval.channel import ApprovalChannel
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, Verdict
from ipybox.rules.shell_commands import SHELL_SERVER, ShellSyntaxError, is_shell_question, shell_calls

__all__ = ["LARGE_ARGUMENTS", "LARGE_SHELL_COMMAND", "WorkspaceApprover"]

logger = logging.getLogger(__name__)

LARGE_ARGUMENTS: Final = 16 * 1024
"""From this size of a call's arguments (characters of strings, plus one per value) the rules decide in
a worker thread. Measured with five regex rules on one string argument: 16 KiB decides in ~0.1 ms
inline, the cost of the hop to the worker thread and back (0.09-0.1 ms); 64 KiB takes 0.4 ms, 1 MiB
8-20 ms, 16 MiB 0.1-0.5 s. Without regex rules a decision costs ~1 us at any size, and the hop is
still cheap next to reading a 16 KiB request."""

_decider: ThreadPoolExecutor | None = None
_decider_lock = threading.Lock()


def _large_decisions() -> ThreadPoolExecutor:
    global _decider
    with _decider_lock:
        if _decider is None:
            _decider = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ipybox-decide")
        return _decider


def is_large(args: Mapping[str, Any], threshold: int = LARGE_ARGUMENTS) -> bool:
    """Whether `args` reach `threshold`, counting each value one, plus the characters of each string and
    the entries of each object and array. The walk stops there, so it takes at most `threshold` steps
    however large the arguments are."""
    budget = threshold
    stack: list[Any] = [args]
    while stack:
        value = stack.pop()
        # Exact JSON types first: isinstance against the Mapping ABC costs microseconds per value, on the
        # path of every call.
        kind = type(value)
        if kind in _SCALARS:
            budget -= 1
        elif kind is str or isinstance(value, str):
            budget -= 1 + len(value)
        elif kind is dict or isinstance(value, Mapping):
            budget -= 1 + len(value)
            if budget > 0:
                stack.extend(value.values())
        elif kind is list or isinstance(value, list | tuple):
            budget -= 1 + len(value)
            if budget > 0:
                stack.extend(value)
        else:
            budget -= 1
        if budget <= 0:
            return True
    return False


_SCALARS: Final = frozenset({int, float, bool, type(None)})


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
        self._shell_policy: tuple[ApprovalPolicy, ApprovalPolicy] | None = None  # (policy, its shell view)

    async def decide(self, call: ToolCall) -> Approval:
        if is_shell_question(call):
            return await self._decide_shell(call)
        policy = self.policy  # one policy per call, even if the rules are reloaded meanwhile
        verdict: Verdict
        if is_large(call.args):
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(_large_decisions(), policy.decide, call)
        else:
            verdict = policy.decide(call)
        source = _source(verdict.rule_id)
        if verdict.decision != "ask":
            await asyncio.to_thread(self.audit.record, call, verdict)
            return Approved() if verdict.decision == "allow" else Rejected(f"denied by {source}")
        outcome, record = await self._ask(call, verdict, policy.ask_timeout)
        await asyncio.to_thread(self._record, record)
        return outcome

    async def _decide_shell(self, call: ToolCall) -> Approval:
        """A shell command line: every command it runs must be allowed (see the module's documentation)."""
        policy = self.policy
        if self._shell_policy is None or self._shell_policy[0] is not policy:
            self._shell_policy = (policy, _for_shell(policy))
        policy = self._shell_policy[1]
        try:
            if is_large(call.args, LARGE_SHELL_COMMAND):
                loop = asyncio.get_running_loop()
                decided = await loop.run_in_executor(_large_decisions(), _decide_parts, policy, call)
            else:
                decided = _decide_parts(policy, call)
        except ShellSyntaxError as e:
            reason = f"the command cannot be read ({e}), so it is refused"
            await asyncio.to_thread(self.audit.record, call, Verdict("deny", None, reason))
            return Rejected(reason)
        denied = next(((part, verdict) for part, verdict in decided if verdict.decision == "deny"), None)
        if denied is not None:
            part, verdict = denied
            refusal = f"{_command(part)} is denied by {_source(verdict.rule_id)}"
            final = [_Record(p, v) for p, v in decided if v.decision != "ask"]
            await asyncio.to_thread(self._record_shell, final, refusal)
            return Rejected(refusal)
        records: list[_Record] = []
        outcome: Approval = Approved()
        for part, verdict in decided:
            if verdict.decision == "allow":
                records.append(_Record(part, verdict))
                continue
            outcome, record = await self._ask(part, verdict, policy.ask_timeout, subject=_command(part))
            records.append(record)
            if not isinstance(outcome, Approved):
                break  # the first no stops the line
        refused = None if isinstance(outcome, Approved) else _reason(outcome)
        await asyncio.to_thread(self._record_shell, records, refused)
        return outcome

    async def _ask(
        self, call: ToolCall, verdict: Verdict, timeout: float | None, subject: str | None = None
    ) -> tuple[Approval, _Record]:
        """Ask the application attached to the caller about a call a rule answers `ask`: the outcome for
        the calling code (the rules' word on no answer is "deny") and the audit record of the decision.
        `subject` names the command of a shell line in the messages."""
        source = _source(verdict.rule_id)
        channel = self.answerer(call.caller)
        if channel is None or not channel.open:
            answer: Approval = NoOneToAsk(f"{source} asks, but no application is attached to answer")
        else:
            answer = await channel.decide(call, timeout=timeout)
        on = f" on {subject}" if subject is not None else ""
        match answer:
            case Approved():
                return answer, _Record(call, verdict, answer="allow")
            case Rejected(why):
                if subject is None:
                    reason = why or "rejected by the application"
                else:
                    reason = f"{subject} was rejected by the application" + (f": {why}" if why else "")
                return Rejected(reason), _Record(call, verdict, answer="deny")
            case TimedOut(seconds):
                reason = f"no answer{on} within {seconds:g} s ({source} asks)"
                return Rejected(reason), _Record(call, verdict, timed_out=True, reason=reason)
            case NoOneToAsk(why):
                reason = f"{why}{on}; add an allow rule for {call.server}.{call.tool} to ipybox.toml"
                return NoOneToAsk(reason), _Record(call, verdict, timed_out=True, reason=reason)

    def _record(self, record: _Record) -> None:
        self.audit.record(
            record.call,
            record.verdict,
            answer=record.answer,
            timed_out=record.timed_out,
            reason=record.reason,
        )

    def _record_shell(self, records: list[_Record], refusal: str | None) -> None:
        """Audit each command's decision, in order; with `refusal`, the line did not run, which each allow
        says."""
        for record in records:
            reason: str | None = record.reason
            if refusal is not None and (record.answer == "allow" or record.verdict.decision == "allow"):
                reason = f"{record.verdict.reason}; not run: {refusal}"
            self.audit.record(
                record.call, record.verdict, answer=record.answer, timed_out=record.timed_out, reason=reason
            )


LARGE_SHELL_COMMAND: Final = 256
"""From this size of a shell question's arguments, splitting and deciding the command runs in the worker
thread. Reading a command line costs ~4.4 us per character (shlex is pure Python; measured: `ls` 31 us,
58 characters 0.31 ms, 5.8 KB 25 ms), so inline a question holds the loop for ~1 ms at most."""


@dataclass(frozen=True, slots=True)
class _Record:
    call: ToolCall
    verdict: Verdict
    answer: Literal["allow", "deny"] | None = None
    timed_out: bool = False
    reason: str | None = None


def _for_shell(policy: ApprovalPolicy) -> ApprovalPolicy:
    """`policy` with the allow rules that don't name the `shell` server matching no server (kept in their
    places, so that rules without an id keep their names)."""
    rules = [
        rule
        if rule.decision != "allow"
        or SHELL_SERVER in ([rule.server] if isinstance(rule.server, str) else rule.server)
        else rule.model_copy(update={"server": []})  # an empty list of globs matches no server
        for rule in policy.rules
    ]
    # Not validated again: the rules were, and the copies' examples would no longer hold.
    return ApprovalPolicy.model_construct(default=policy.default, ask_timeout=policy.ask_timeout, rules=rules)


def _decide_parts(policy: ApprovalPolicy, call: ToolCall) -> list[tuple[ToolCall, Verdict]]:
    return [(part, policy.decide(part)) for part in shell_calls(call)]


def _command(part: ToolCall) -> str:
    return f"`{part.args.get('cmd', '')}`" if "magic" not in part.args else f"the {part.tool} cell"


def _reason(outcome: Approval) -> str:
    match outcome:
        case Rejected(reason) | NoOneToAsk(reason):
            return reason
    return str(outcome)


def _source(rule_id: str | None) -> str:
    return f"rule {rule_id!r}" if rule_id is not None else "the default decision"
