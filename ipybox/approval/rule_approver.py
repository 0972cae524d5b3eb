"""`WorkspaceApprover`: the rule-based approver of a workspace's tool calls.

For each call: the `[approval]` rules decide; `allow` and `deny` stand at once; `ask` is first checked
against the answers a person gave for the calling session ([grants][ipybox.approval.grants]), then put on
the workspace's [AskBoard][ipybox.approval.asks.AskBoard] and routed as `[approval] ask` says: to the
application attached to the calling kernel (its [ApprovalChannel][ipybox.approval.channel.ApprovalChannel],
whose websocket the supervisor serves, so `ApprovalClient` connects to it) when it decides itself or asks
its MCP client (elicitation), else to the people at the web console or in `ipybox approve`; the people
listed see every pending ask and may answer first. Then the decision is appended to the audit log, with
its scope and who answered, before the call can run.

Contracts:

- The approver owns no channel: `answerer` (the supervisor's `LeaseTable.answerer`) says which
  application answers a caller's `ask`, and `session_of` which lease (session) the caller belongs to, so
  one table holds leases, kernels, callers and channels.
- The first answer wins (`AskBoard.answer`); the others are withdrawn: the application's request is taken
  back (`withdrawn` notice), and people's screens drop it. An answer `for this session` becomes a grant of
  the session; `always` writes a rule into `ipybox.toml` first (`write_rule`) and is refused, with the
  reason, when that rule would not load, leaving the ask pending.
- The rules' word on an unanswered `ask` is "deny": an `ask` that times out is `Rejected` (audited as
  decided by `timeout`), not `TimedOut`, so the calling code gets a rejection naming the rule.
- An `ask` of a kernel that checks agent-written code (an output parser, a saved action being saved or
  described: `refusal_of` gives a reason for its caller) is refused at once with that reason: nobody is
  asked, nothing reaches the board (the console, `ipybox approve`), and it is audited as unanswered.
- An `ask` nobody can answer (no route of `[approval] ask` has anyone: no application attached, an MCP
  client without elicitation, no console page or `ipybox approve` open), or whose application leaves
  mid-question or declines it (`CodeExecutor.execute()` answers no asks) with no person present, is
  `NoOneToAsk`, with the allow rule to add; it is audited as unanswered.
- A sandboxed kernel's connection to a host no `allowedDomains` entry covers (`[sandbox.network] unknown =
  "ask"`: `ask_host`, the kernels' proxy's asker) is asked as the call `ipybox.network(host, port,
  method)` with the subject `connect to host:port`: routed as the connecting kernel's tool-call asks when
  `caller_of_client` attributes the connection to a kernel a lease holds (its application, its MCP
  client, the people), else to the people `[approval] ask` lists only. Attribution chooses who is asked,
  never whether. Nobody to answer refuses it at once; "for this session" holds for the host while the
  proxy runs (not a grant of the lease: grants cover a tool, here every host); `always` writes the host
  into `allowedDomains` (or `deniedDomains`) through `write_domain`. It is audited like a call.
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
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from ipybox.approval.approver import Approval, Approved, NoOneToAsk, Rejected, TimedOut
from ipybox.approval.ask_context import CellView, ClientView, cell_view
from ipybox.approval.ask_events import AskView
from ipybox.approval.asks import PEOPLE, AskAnswer, AskBoard, PendingAsk
from ipybox.approval.channel import ApprovalChannel, Settled
from ipybox.approval.grants import SessionGrants
from ipybox.approval.links import PathLink
from ipybox.approval.quotas import CallQuotas
from ipybox.lifecycle import task_scope
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, Verdict
from ipybox.rules.audit import DecidedBy, Scope
from ipybox.rules.calls import AskRoute
from ipybox.rules.shell_commands import (
    KERNEL_SHELL_SERVER,
    SHELL_SERVER,
    ShellSyntaxError,
    is_shell_question,
    shell_calls,
)
from ipybox.sandbox.host_asks import HostAnswer, HostQuestion, HostScope

__all__ = [
    "LARGE_ARGUMENTS",
    "LARGE_SHELL_COMMAND",
    "NETWORK_TOOL",
    "WorkspaceApprover",
    "explain_call",
    "for_shell",
]

logger = logging.getLogger(__name__)

NETWORK_TOOL: Final = "network"
"""The tool of an ask about a host (`WorkspaceApprover.ask_host`): `ipybox.network`, ipybox's own server
name (`KERNEL_SHELL_SERVER`), which no MCP server may take."""

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
        answerer: The open approval channel of the application attached to a caller's kernel, if any.
        board: Where pending asks wait, and who is present to answer them (a new one if not given).
        session_of: The session (lease) a caller's kernel belongs to, if any.
        write_rule: Writes the rule an `always` answer makes (the ask, allowed, who, and the person's
            `AskAnswer.choices` for its argument conditions) and has the workspace load it; raises
            `ValueError` (e.g. `RuleWriteError`) with the reason when it must not be written.
        console: Where the web console is, for the message when nobody can answer.
        links: Where a call's path arguments lead through symlinks, computed on the host when a call is
            asked and shown with it everywhere ([links][ipybox.approval.links]; default: nothing).
        refusal_of: Why a caller's `ask`s are refused without asking anyone (its kernel checks
            agent-written code), or `None`.
        pending_tool: Whether a tool differs from its pin in `ipybox.lock`: `"changed"`, `"new"` (on a
            pinned server) or `None`; such a call the rules would allow is decided `[approval]
            changed_tools` instead, until the change is accepted (default: no pins).
        write_domain: Writes an `always` answer to an ask about a host (`ask_host`) into `ipybox.toml`
            (host, allowed, who) and has the workspace load it; raises `ValueError` with the reason when it
            must not be written.
        caller_of_client: The caller (tool-call token holder) of the kernel a process connecting to the
            sandbox's proxy belongs to, by the process's id, when a lease holds that kernel; else `None`
            (default: none, so asks about hosts go to the people).
        session_info: A session's name (its client's) and when it started, shown with its asks
            (default: unknown).
        cell_text_of: The text of the cell with this SHA-256 that `session` submitted through the host, if
            the host registered it (the ask then shows it as verified; default: none, so the kernel's
            text is shown, marked as its claim).
    """

    def __init__(
        self,
        policy: ApprovalPolicy,
        audit: AuditLog,
        answerer: Callable[[str], ApprovalChannel | None],
        *,
        board: AskBoard | None = None,
        session_of: Callable[[str], str | None] = lambda caller: None,
        write_rule: Callable[[PendingAsk, bool, str, Mapping[str, str] | None], Awaitable[object]]
        | None = None,
        console: Callable[[], str | None] = lambda: None,
        links: Callable[[ToolCall], Mapping[str, PathLink]] = lambda call: {},
        refusal_of: Callable[[str], str | None] = lambda caller: None,
        pending_tool: Callable[[str, str], str | None] = lambda server, tool: None,
        write_domain: Callable[[str, bool, str], Awaitable[object]] | None = None,
        caller_of_client: Callable[[int], str | None] = lambda pid: None,
        session_info: Callable[[str], tuple[str | None, datetime | None]] = lambda session: (None, None),
        cell_text_of: Callable[[str, str], str | None] = lambda session, sha: None,
    ) -> None:
        self.policy = policy
        self.audit = audit
        self.answerer = answerer
        self.board = board if board is not None else AskBoard()
        self.session_of = session_of
        self.write_rule = write_rule
        self.console = console
        self.links = links
        self.refusal_of = refusal_of
        self.pending_tool = pending_tool
        self.write_domain = write_domain
        self.caller_of_client = caller_of_client
        self.session_info = session_info
        self.cell_text_of = cell_text_of
        self._host_asks: dict[str, str] = {}  # pending asks about hosts (`ask_host`): ask id -> host
        self.grants = SessionGrants()
        self.quotas = CallQuotas()
        self._writing = asyncio.Lock()  # one `always` rule written at a time
        self._shell_policy: tuple[ApprovalPolicy, ApprovalPolicy] | None = None  # (policy, its shell view)

    async def decide(self, call: ToolCall) -> Approval:
        if is_shell_question(call):
            outcome = await self._decide_shell(call)
        else:
            outcome = await self._decide_call(call)
        if call.caller:  # the session's history, shown with its asks
            self.grants.tally(self.session_of(call.caller), isinstance(outcome, Approved))
        return outcome

    async def _decide_call(self, call: ToolCall) -> Approval:
        policy = self.policy  # one policy per call, even if the rules are reloaded meanwhile
        verdict: Verdict
        if is_large(call.args):
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(_large_decisions(), policy.decide, call)
        else:
            verdict = policy.decide(call)
        ruled = verdict  # the rule's own verdict: what a quota counts against
        session = self.session_of(call.caller) if call.caller else None
        trip = self.quotas.check(policy, call, verdict, session)
        note = None  # why a rule's verdict was made stricter, for the calling code
        if trip is not None:
            verdict, note = trip.verdict, trip.note
        quota = trip.text if trip is not None else None
        pinned = self._pinned(policy, call, verdict)
        if pinned is not None:
            verdict, note = pinned
        if verdict.decision != "ask":
            if verdict.decision == "allow":
                self.quotas.count(policy, call, ruled, session)  # before any await: no two take the last
            await asyncio.to_thread(self.audit.record, call, verdict, quota=quota, code=call.code)
            return Approved() if verdict.decision == "allow" else _denied(verdict, note)
        outcome, record = await self._ask(call, verdict, policy.ask_timeout, hint=note)
        if isinstance(outcome, Approved) and trip is None:
            self.quotas.count(policy, call, ruled, session)
        await asyncio.to_thread(self._record, dataclasses.replace(record, quota=quota))
        return outcome

    def _pinned(self, policy: ApprovalPolicy, call: ToolCall, verdict: Verdict) -> tuple[Verdict, str] | None:
        """`verdict` made `[approval] changed_tools`, and why, when it would let run a tool that differs
        from its pin in `ipybox.lock` (an `ask` says why it asks; a `deny` stands: `None`)."""
        if verdict.decision == "deny":
            return None
        state = self.pending_tool(call.server, call.tool)
        if state is None:
            return None
        what = "changed since it was pinned" if state == "changed" else "new since its server was pinned"
        note = (
            f"{call.server}.{call.tool} is {what} in ipybox.lock: review the change and accept it "
            f"(`ipybox lock accept`, or the console) for {_source(verdict.rule_id, verdict.tier)} to decide again"
        )
        decision = verdict.decision if verdict.decision == "ask" else policy.changed_tools
        reason = f"{verdict.reason}, but {note}"
        return Verdict(decision, verdict.rule_id, reason, verdict.tier, verdict.explanation), note

    async def _decide_shell(self, call: ToolCall) -> Approval:
        """A shell command line: every command it runs must be allowed (see the module's documentation)."""
        policy = self.policy
        if self._shell_policy is None or self._shell_policy[0] is not policy:
            self._shell_policy = (policy, for_shell(policy))
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
            why = f": {verdict.explanation}" if verdict.explanation else ""
            refusal = f"{_command(part)} is denied by {_source(verdict.rule_id, verdict.tier)}{why}"
            final = [_Record(p, v) for p, v in decided if v.decision != "ask"]
            await asyncio.to_thread(self._record_shell, final, refusal)
            return _rejected(refusal, verdict)
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
        self,
        call: ToolCall,
        verdict: Verdict,
        timeout: float | None,
        subject: str | None = None,
        hint: str | None = None,
        host: str | None = None,
    ) -> tuple[Approval, _Record]:
        """Put a call a rule answers `ask` to whoever can answer (see the module's contracts): the outcome
        for the calling code (the rules' word on no answer is "deny") and the audit record of the decision.
        `subject` names the command of a shell line in the messages; `hint` says why the call is asked
        about when a quota or a pin made an allow an ask (instead of suggesting an allow rule). `host`
        makes it an ask about a host (`ask_host`): session grants are neither consulted nor made (they
        cover a whole tool, here every host; the proxy keeps `session` answers per host), and people's
        answers go through `_answer_host`."""
        source = _source(verdict.rule_id)
        # An ask about a host is refused with the proxy's message, which names the host and how to allow it.
        on = f" on {subject}" if subject is not None and host is None else ""
        tail = f"; {hint or _allow_rule_hint(call)}" if host is None else ""
        what = subject if subject is not None else f"the call {call.server}.{call.tool}"
        refusal = self.refusal_of(call.caller) if call.caller else None
        if refusal is not None:
            reason = f"{what} was refused: {source} asks, but {refusal}"
            return _rejected(reason, verdict), _Record(call, verdict, timed_out=True, reason=reason)
        session = self.session_of(call.caller) if call.caller else None
        grant = self.grants.lookup(session, call) if host is None else None
        if grant is not None:
            verb = "allowed" if grant.accept else "denied"
            reason = f"{verdict.reason}; {verb} for this session by {grant.by}"
            record = _Record(call, verdict, _answer(grant.accept), "session", "session", grant.by, reason)
            if grant.accept:
                return Approved(), record
            return _rejected(f"{what} was {verb} for this session by {grant.by}", verdict), record
        routes = tuple(self.policy.ask)
        channel = self.answerer(call.caller)
        asked_of = self._first_route(routes, channel)
        if asked_of is None:
            reason = f"{source} asks, but {self._nobody(routes)}{on}{tail}"
            if channel is not None:
                await channel.refused(call, reason)
            return NoOneToAsk(reason), _Record(call, verdict, timed_out=True, reason=reason)
        people = tuple(route for route in routes if route in PEOPLE)
        answerable = (asked_of, *(route for route in people if route != asked_of))
        ask = self.board.open(
            call,
            verdict,
            asked_of=asked_of,
            routes=answerable,
            session=session,
            subject=subject,
            timeout=timeout,
            links=self.links(call) if subject is None else None,  # a shell command's text is no path
            cell=self._cell_of(call, session) if host is None else None,
            client=self._client_of(session),
        )
        if host is not None:
            self._host_asks[ask.id] = host
        loop = asyncio.get_running_loop()
        settled: Settled = loop.create_future()
        app_reason: list[str] = []  # an application's reason for refusing, when it gave one
        # Asking the application runs beside the wait for an answer, in this call's scope.
        async with task_scope() as scope:
            app_task: asyncio.Task[None] | None = None
            try:
                if asked_of in ("application", "elicitation"):
                    assert channel is not None
                    app_task = scope.create_task(
                        self._ask_application_of(ask, channel, asked_of, settled, app_reason)
                    )
                    answer = await self._answer_of(ask, timeout)
                    _settle(settled, answer)  # the application drops its question if someone else answered
                else:
                    async with channel.waiting(settled) if channel is not None else contextlib.nullcontext():
                        answer = await self._answer_of(ask, timeout)
                        _settle(settled, answer)
            finally:
                _settle(settled, None)
                self._host_asks.pop(ask.id, None)
                self.board.close(
                    ask, why="the calling code went away" if host is None else "the connection went away"
                )
                if app_task is not None:
                    # Settled now, it tells the application to drop the question and ends: waited for also
                    # when this call goes away (the scope would cancel it untold). A second cancellation of
                    # the caller ends the wait, and the scope cancels it.
                    await asyncio.wait({app_task})
        match answer:
            case AskAnswer(accept=True):
                if answer.scope == "session" and session is not None and host is None:
                    self.grants.grant(session, call, True, answer.by)
                return Approved(), _Record(call, verdict, "allow", answer.route, answer.scope, answer.by)
            case AskAnswer(accept=False):
                if answer.scope == "session" and session is not None and host is None:
                    self.grants.grant(session, call, False, answer.by)
                if answer.route in ("application", "elicitation") and subject is None:
                    reason = (app_reason[0] if app_reason else "") or f"rejected by {answer.by}"
                elif answer.route in ("application", "elicitation"):
                    why = app_reason[0] if app_reason else ""
                    reason = f"{subject} was rejected by {answer.by}" + (f": {why}" if why else "")
                else:
                    reason = f"{what} was {answer.describe()}"
                return _rejected(reason, verdict), _Record(
                    call, verdict, "deny", answer.route, answer.scope, answer.by
                )
            case "timeout":
                reason = f"no answer{on} within {timeout:g} s ({source} asks)"
                return _rejected(reason, verdict), _Record(call, verdict, timed_out=True, reason=reason)
            case _:  # withdrawn: the application asked left, and no person is there
                why = app_reason[0] if app_reason else "the application left before answering"
                reason = f"{source} asks, but {why}{on}{tail}"
                return NoOneToAsk(reason), _Record(call, verdict, timed_out=True, reason=reason)

    def _cell_of(self, call: ToolCall, session: str | None) -> CellView | None:
        """The code of the cell that made `call`: the host's record of it when it has one (verified), else
        the kernel's text (see [ask_context][ipybox.approval.ask_context])."""
        known = (
            self.cell_text_of(session, call.code) if session is not None and call.code is not None else None
        )
        return cell_view(call, known)

    def _client_of(self, session: str | None) -> ClientView | None:
        """Who asked: the session's name, start and history so far."""
        if session is None:
            return None
        name, started = self.session_info(session)
        return ClientView.of(session, name, started, self.grants.calls(session), self.grants.of(session))

    def _first_route(self, routes: tuple[AskRoute, ...], channel: ApprovalChannel | None) -> AskRoute | None:
        """The first route of `routes` that can answer now."""
        answers = channel.answers if channel is not None and channel.open else None
        for route in routes:
            if route in PEOPLE:
                if self.board.people(route) > 0:
                    return route
            elif answers == route:
                return route
        return None

    def open_question(self, call: ToolCall, verdict: Verdict, *, elicitation: bool) -> PendingAsk | str:
        """Put a question that comes from outside a kernel (an MCP client's `register_mcp_server`) on the
        board, routed as `[approval] ask` says, `application` aside (there is none): the asker's MCP client
        (`elicitation`, if it can) or the people present. Returns the pending ask (the asker waits for it
        and may answer it as `elicitation` when that is `asked_of`), or why nobody can answer. The asker
        closes it (`board.close`) when it stops waiting."""
        routes = tuple(route for route in self.policy.ask if route != "application")
        people = tuple(route for route in routes if route in PEOPLE)
        asked_of: AskRoute | None = None
        for route in routes:
            if (route == "elicitation" and elicitation) or (route in PEOPLE and self.board.people(route) > 0):
                asked_of = route
                break
        if asked_of is None:
            return f"{_source(verdict.rule_id)} asks, but {self._nobody(routes)}"
        answerable = (asked_of, *(route for route in people if route != asked_of))
        return self.board.open(
            call, verdict, asked_of=asked_of, routes=answerable, timeout=self.policy.ask_timeout
        )

    async def ask_host(self, question: HostQuestion) -> HostAnswer:
        """Ask whether a sandboxed kernel may connect to a host no `allowedDomains` entry covers (the
        proxy's [HostAsker][ipybox.sandbox.host_asks.HostAsker], for `[sandbox.network] unknown = "ask"`).

        The ask is the call `ipybox.network(host, port, method)` with the subject `connect to host:port`.
        When `caller_of_client` attributes the connection (`question.client_pid`) to a kernel's caller
        that a lease holds, it is routed as that caller's tool-call asks are, in `[approval] ask` order:
        the lease's application (`application`), its MCP client (`elicitation`, through the same channel),
        the people present; a kernel whose lease checks agent-written code is refused at once. Otherwise
        (a process no kernel's token names, or a kernel no lease holds) only the people `[approval] ask`
        lists are asked (web console, `ipybox approve`).

        Attribution only ever selects who is asked, never whether: a kernel can connect to the proxy's
        socket itself and rewrite its own environment, but it holds no other kernel's token, so at most it
        routes its ask to its own application, or to the people; every route waits for an answer, and the
        people listed may answer any ask first.

        Applications answer once. A person's answer "for this session" holds for the host while the
        proxy runs (the supervisor's run), for every kernel: it is not a grant of the lease, since grants
        cover a whole tool (here every host). `always` writes the host into `allowedDomains` (or
        `deniedDomains`) through `write_domain`. It waits `ask_timeout` at most; with nobody to answer it
        is refused at once. The decision is audited.
        """
        policy = self.policy
        caller = self.caller_of_client(question.client_pid) if question.client_pid is not None else None
        call = ToolCall(
            KERNEL_SHELL_SERVER,
            NETWORK_TOOL,
            {"host": question.host, "port": question.port, "method": question.method},
            caller=caller or "",
        )
        verdict = Verdict("ask", None, f'{question.host} is not in allowedDomains, and unknown = "ask"')
        if caller:
            outcome, record = await self._ask(
                call, verdict, policy.ask_timeout, subject=question.subject, host=question.host
            )
            await asyncio.to_thread(self._record, record)
            scope: HostScope = record.scope if record.scope in ("session", "always") else "once"
            if isinstance(outcome, Approved):
                return HostAnswer(True, scope, f"allowed {scope} by {record.by}")
            return HostAnswer(False, scope if record.answer == "deny" else "once", _reason(outcome))
        people = tuple(route for route in policy.ask if route in PEOPLE)
        asked_of = next((route for route in people if self.board.people(route) > 0), None)
        if asked_of is None:
            if people:
                why = self._nobody(people)
            else:
                why = "nobody can be asked: [approval] ask lists no person (console, terminal) to ask about hosts"
            await asyncio.to_thread(self._record, _Record(call, verdict, timed_out=True, reason=why))
            return HostAnswer(False, why=why)
        ask = self.board.open(
            call,
            verdict,
            asked_of=asked_of,
            routes=(asked_of, *(route for route in people if route != asked_of)),
            subject=question.subject,
            timeout=policy.ask_timeout,
        )
        self._host_asks[ask.id] = question.host
        try:
            answer = await self._answer_of(ask, policy.ask_timeout)
        finally:
            self._host_asks.pop(ask.id, None)
            self.board.close(ask, why="the connection went away")
        if isinstance(answer, AskAnswer):
            record = _Record(call, verdict, _answer(answer.accept), answer.route, answer.scope, answer.by)
            await asyncio.to_thread(self._record, record)
            return HostAnswer(answer.accept, answer.scope, answer.describe())
        why = (
            f"nobody answered within {policy.ask_timeout:g} s"
            if answer == "timeout"
            else "the ask was withdrawn"
        )
        await asyncio.to_thread(self._record, _Record(call, verdict, timed_out=True, reason=why))
        return HostAnswer(False, why=why)

    async def _answer_host(self, ask: PendingAsk, host: str, answer: AskAnswer) -> str | None:
        """A person's answer to an ask about a host (`ask_host`): `always` writes the host into
        `ipybox.toml` first; "for this session" needs no lease (it holds for the proxy's run)."""
        if answer.scope == "always":
            if self.write_domain is None:
                return "this workspace cannot write ipybox.toml: answer once or for this session"
            async with self._writing:
                if self.board.get(ask.id) is None:
                    return self._gone(ask.id)
                try:
                    await self.write_domain(host, answer.accept, answer.by)
                except ValueError as e:
                    return str(e)
        if not self.board.answer(ask.id, answer):
            return self._gone(ask.id)
        return None

    def _nobody(self, routes: tuple[AskRoute, ...]) -> str:
        """Who was missing, route by route, for the refusal's message."""
        console = self.console()
        missing = {
            "application": "no attached application",
            "elicitation": "no MCP client with elicitation",
            "console": f"no open web console{f' ({console})' if console else ''}",
            "terminal": "no `ipybox approve`",
        }
        return f"nobody is connected to answer ({', '.join(missing[route] for route in routes)})"

    async def _ask_application_of(
        self,
        ask: PendingAsk,
        channel: ApprovalChannel,
        route: AskRoute,
        settled: Settled,
        reason: list[str],
    ) -> None:
        """`_ask_application`, whose failure is logged rather than ending the ask: the people asked, or the
        ask's timeout, still decide."""
        try:
            await self._ask_application(ask, channel, route, settled, reason)
        except Exception:
            logger.exception(
                "asking the application about a call of %s.%s failed", ask.call.server, ask.call.tool
            )

    async def _ask_application(
        self,
        ask: PendingAsk,
        channel: ApprovalChannel,
        route: AskRoute,
        settled: Settled,
        reason: list[str],
    ) -> None:
        """Ask the application (or, through it, its MCP client) and put its answer on the board. One that
        leaves, or declines (`CodeExecutor.execute()`), without answering hands the question to the people
        present, if any, else withdraws it."""
        by = "the application" if route == "application" else "the MCP client"
        outcome = await channel.decide(
            ask.call, timeout=ask.timeout, settled=settled, links=ask.links, view=AskView.of(ask)
        )
        if settled.done():
            return  # answered elsewhere first: the application was told to drop it
        match outcome:
            case Approved():
                self.board.answer(ask.id, AskAnswer(True, "once", route, by))
            case Rejected(why):
                reason.append(why)
                self.board.answer(ask.id, AskAnswer(False, "once", route, by))
            case TimedOut():
                pass  # the ask's own timeout ends the wait
            case NoOneToAsk(why):
                if not any(self.board.people(person) for person in ask.routes if person in PEOPLE):
                    people = "no person [approval] ask lists (web console, `ipybox approve`) is connected"
                    reason.append(f"{why}, and {people}")
                    self.board.close(ask, why=why)
                    return
                # The people present answer it. An application that declined is still there, running the
                # cell: its clock stays stopped while they decide (a `waiting` notice; nothing if it left).
                async with channel.waiting(settled):
                    await settled

    async def _answer_of(self, ask: PendingAsk, timeout: float | None) -> AskAnswer | str | None:
        """The answer that closed `ask`; "timeout" when none came in time; `None` when it was withdrawn."""
        done, _ = await asyncio.wait({ask.answered}, timeout=timeout)
        if not done:
            self.board.close(ask, why=f"no answer within {timeout:g} s")
            return "timeout"
        return None if ask.answered.cancelled() else ask.answered.result()

    async def answer(self, ask_id: str, answer: AskAnswer) -> str | None:
        """A person's answer to a pending ask (the console, `ipybox approve`). `None` when it took; else
        why not, for the person (see `ipybox.console.target.ConsoleTarget.answer`)."""
        ask = self.board.get(ask_id)
        if ask is None:
            return self._gone(ask_id)
        if answer.route not in ask.routes:
            routes = ", ".join(f'"{route}"' for route in self.policy.ask)
            return f"the {answer.route} does not answer this question ([approval] ask = [{routes}])"
        if (host := self._host_asks.get(ask_id)) is not None:
            return await self._answer_host(ask, host, answer)
        if answer.scope == "session" and ask.session is None:
            return "this call comes from a kernel that no session holds: answer once or always"
        if answer.scope == "always" and ask.call.server == KERNEL_SHELL_SERVER:
            # Registering MCP servers (`ipybox.register_mcp_server`): "always" would let any MCP client
            # make the host run any command; a rule naming the server is for a person to write.
            return "always is not offered for this question: answer once, or add a rule to ipybox.toml"
        if answer.scope == "always":
            if self.write_rule is None:
                return "this workspace cannot write rules: answer once or for this session"
            async with self._writing:
                if self.board.get(ask_id) is None:
                    return self._gone(ask_id)
                try:
                    await self.write_rule(ask, answer.accept, answer.by, answer.choices)
                except ValueError as e:
                    return str(e)
        if not self.board.answer(ask_id, answer):
            return self._gone(ask_id)
        if answer.scope == "session" and ask.session is not None:
            self._settle_session(ask, answer)
        return None

    def _settle_session(self, ask: PendingAsk, answer: AskAnswer) -> None:
        """An answer "for this session" to `ask` (just given): granted now, and given at once to every other
        pending ask it covers (`SessionGrants.covers`: same session, same tool; for shell commands, the same
        program), as the grant would have answered them had it come first. The board notes how many it
        settled, for the answerer."""
        assert ask.session is not None
        self.grants.grant(ask.session, ask.call, answer.accept, answer.by)
        settled = 1
        for other in self.board.pending:
            if other.id in self._host_asks or not self.grants.covers(
                ask.session, ask.call, other.session, other.call
            ):
                continue
            if self.board.answer(other.id, answer):
                settled += 1
        self.board.note_settled(ask.id, settled)

    def _gone(self, ask_id: str) -> str:
        closed, first = self.board.closed_answer(ask_id)
        if closed and first is not None:
            return f"already {first.describe()}"
        if closed:
            return "this question is no longer pending: its time ran out, or the calling code went away"
        return "no such question is pending"

    def forget_session(self, session: str) -> None:
        """The session (lease) ended: its `for this session` answers and its quota counts go with it."""
        self.grants.forget(session)
        self.quotas.forget_session(session)

    def explain(self, call: ToolCall) -> list[tuple[ToolCall, Verdict]]:
        """What the rules in effect decide for `call` (one pair), or for a shell line (`server` "shell" or
        `ipybox.shell`, `args` `{"cmd": ...}`), for each command it runs (shell rules as for kernels).

        Raises:
            ValueError: A shell line that cannot be read.
        """
        return explain_call(self.policy, call)

    def _record(self, record: _Record) -> None:
        self.audit.record(
            record.call,
            record.verdict,
            answer=record.answer,
            timed_out=record.timed_out,
            reason=record.reason,
            decided_by=record.decided_by,
            scope=record.scope,
            by=record.by,
            quota=record.quota,
            code=record.call.code,
        )

    def _record_shell(self, records: list[_Record], refusal: str | None) -> None:
        """Audit each command's decision, in order; with `refusal`, the line did not run, which each allow
        says."""
        for record in records:
            reason: str | None = record.reason
            if refusal is not None and (record.answer == "allow" or record.verdict.decision == "allow"):
                reason = f"{record.verdict.reason}; not run: {refusal}"
            self.audit.record(
                record.call,
                record.verdict,
                answer=record.answer,
                timed_out=record.timed_out,
                reason=reason,
                decided_by=record.decided_by,
                scope=record.scope,
                by=record.by,
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
    decided_by: DecidedBy | None = None
    scope: Scope | None = None
    by: str | None = None
    reason: str | None = None
    timed_out: bool = False
    quota: str | None = None


def _answer(accept: bool) -> Literal["allow", "deny"]:
    return "allow" if accept else "deny"


def _allow_rule_hint(call: ToolCall) -> str:
    return f"add an allow rule for {call.server}.{call.tool} to ipybox.toml"


def explain_call(policy: ApprovalPolicy, call: ToolCall) -> list[tuple[ToolCall, Verdict]]:
    """What `policy` decides for `call` (one pair), or for a shell line (`server` "shell" or
    `ipybox.shell`, `args` `{"cmd": ...}`), for each command it runs (shell rules as for kernels).

    Raises:
        ValueError: A shell line that cannot be read.
    """
    if call.server == SHELL_SERVER or is_shell_question(call):
        question = call if is_shell_question(call) else ToolCall(KERNEL_SHELL_SERVER, "shell", call.args)
        return _decide_parts(for_shell(policy), question)
    return [(call, policy.decide(call))]


def for_shell(policy: ApprovalPolicy) -> ApprovalPolicy:
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
    # The admin tiers stay: they deny and ask only, so they need no shell view.
    return ApprovalPolicy.model_construct(
        default=policy.default,
        ask_timeout=policy.ask_timeout,
        ask=policy.ask,
        lint=policy.lint,
        changed_tools=policy.changed_tools,
        rules=rules,
    ).with_admin(policy.admin)


def _decide_parts(policy: ApprovalPolicy, call: ToolCall) -> list[tuple[ToolCall, Verdict]]:
    return [(part, policy.decide(part)) for part in shell_calls(call)]


def _command(part: ToolCall) -> str:
    return f"`{part.args.get('cmd', '')}`" if "magic" not in part.args else f"the {part.tool} cell"


def _settle(settled: Settled, answer: AskAnswer | str | None) -> None:
    if not settled.done():
        settled.set_result((answer.accept, answer.by) if isinstance(answer, AskAnswer) else (None, ""))


def _reason(outcome: Approval) -> str:
    match outcome:
        case Rejected(reason) | NoOneToAsk(reason):
            return reason
    return str(outcome)


def _source(rule_id: str | None, tier: str | None = None) -> str:
    if rule_id is None:
        return "the default decision"
    return f"rule {rule_id!r}" + (f" of the {tier} admin policy" if tier is not None else "")


def _rejected(reason: str, verdict: Verdict) -> Rejected:
    """A refusal of a call `verdict`'s rule asked about (or denied), naming the rule for the calling code."""
    if verdict.explanation and verdict.explanation not in reason:
        reason = f"{reason} ({_source(verdict.rule_id, verdict.tier)}: {verdict.explanation})"
    return Rejected(reason, verdict.rule_id, verdict.tier, verdict.explanation)


def _denied(verdict: Verdict, note: str | None = None) -> Rejected:
    """The refusal of a `deny` verdict: the rule, its tier and its `reason` for the calling code (and
    `note`, when a quota or a pin made the rule's verdict a deny)."""
    why = f": {verdict.explanation}" if verdict.explanation else ""
    why += f" ({note})" if note else ""
    if verdict.rule_id is None:
        return Rejected(f"denied by {_source(None)}{why}")
    return Rejected(
        f"denied by {_source(verdict.rule_id, verdict.tier)}{why}",
        verdict.rule_id,
        verdict.tier,
        verdict.explanation,
    )
