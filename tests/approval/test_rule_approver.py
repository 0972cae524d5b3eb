"""`WorkspaceApprover`: the rules decide, an `ask` goes to the application attached to the calling kernel's
lease (looked up in the supervisor's `LeaseTable`, as in a workspace), and every decision is in the audit
log before the call may run."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from starlette.websockets import WebSocket

from ipybox.approval import ApprovalClient, ApprovalRequest, Approved, NoOneToAsk, Rejected
from ipybox.approval.channel import ApprovalChannel
from ipybox.approval.rule_approver import LARGE_ARGUMENTS, WorkspaceApprover, is_large
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall
from ipybox.running.status import CallerId, CallerToken, KernelId, LeaseId
from ipybox.supervisor.leases import LeaseTable
from tests.approval.conftest import serving

RULES = [
    {"id": "reads", "server": "fs", "tool": "read_*", "decision": "allow"},
    {"id": "no-delete", "server": "fs", "tool": "delete_*", "decision": "deny"},
    {"id": "writes", "server": "fs", "tool": "write_*", "decision": "ask"},
]


def policy(default: str = "deny", ask_timeout: float = 5) -> ApprovalPolicy:
    return ApprovalPolicy.model_validate({"default": default, "ask_timeout": ask_timeout, "rules": RULES})


def audited(approver: WorkspaceApprover) -> list[dict[str, Any]]:
    return [json.loads(line) for line in approver.audit.path.read_text().splitlines()]


def last(approver: WorkspaceApprover) -> tuple[str, str | None, str]:
    entry = audited(approver)[-1]
    return entry["decision"], entry["rule_id"], entry["decided_by"]


@pytest.fixture
def leases() -> dict[str, LeaseId]:
    return {}


@pytest.fixture
def table(leases: dict[str, LeaseId]) -> LeaseTable:
    """Two leases, `lease-a` holding caller k1's kernel and `lease-b` caller k2's."""
    table = LeaseTable()
    for name, caller in (("lease-a", "k1"), ("lease-b", "k2")):
        leases[name] = table.new_lease()
        table.add_caller(CallerId(caller), CallerToken(f"token-{caller}"))
        table.bind(leases[name], KernelId(f"kernel-{caller}"), CallerId(caller))
    return table


@pytest.fixture
def approver(tmp_path: Path, table: LeaseTable) -> WorkspaceApprover:
    return WorkspaceApprover(policy(), AuditLog(tmp_path / "audit.jsonl"), table.answerer)


async def drop(table: LeaseTable, lease: LeaseId) -> None:
    """Release a lease as the supervisor does: its channel disconnects, its pending asks are not approved."""
    if lease in table and (channel := table.release(lease).channel) is not None:
        await channel.disconnect()


Decide = Callable[[ApprovalRequest], Awaitable[None]]


@pytest.fixture
async def attach(
    table: LeaseTable, leases: dict[str, LeaseId]
) -> AsyncIterator[Callable[[str, Decide], Awaitable[None]]]:
    """Attach an application to a lease: an `ApprovalClient` on the lease's websocket, served as the
    supervisor serves it (the channel belongs to the lease in the table)."""

    async def serve(websocket: WebSocket) -> None:
        lease = leases[websocket.path_params["lease"]]
        channel = table.open_channel(lease, ApprovalChannel(True, 5))
        try:
            await channel.connect(websocket)
        finally:
            if not channel.open:
                table.close_channel(lease, channel)

    async with AsyncExitStack() as stack:
        address = await stack.enter_async_context(serving({"/leases/{lease}/approval": serve}))

        async def attach(lease: str, decide: Decide) -> None:
            client = ApprovalClient(decide, address=address, path=f"/leases/{lease}/approval")
            await stack.enter_async_context(client)
            while (channel := table.channel(leases[lease])) is None or not channel.open:
                await asyncio.sleep(0.01)

        yield attach
        for lease in leases.values():
            await drop(table, lease)


async def test_an_allow_rule_approves_and_is_audited(approver: WorkspaceApprover) -> None:
    assert await approver.decide(ToolCall("fs", "read_file", {"path": "a"})) == Approved()
    assert last(approver) == ("allow", "reads", "rule")


async def test_a_deny_rule_rejects_naming_the_rule(approver: WorkspaceApprover) -> None:
    assert await approver.decide(ToolCall("fs", "delete_file")) == Rejected("denied by rule 'no-delete'")
    assert last(approver) == ("deny", "no-delete", "rule")


async def test_the_default_decides_a_call_no_rule_matches(approver: WorkspaceApprover) -> None:
    assert await approver.decide(ToolCall("web", "fetch")) == Rejected("denied by the default decision")
    assert last(approver) == ("deny", None, "default")


async def test_an_ask_with_no_application_attached_has_no_one_to_ask_and_names_the_rule_to_add(
    approver: WorkspaceApprover,
) -> None:
    outcome = await approver.decide(ToolCall("fs", "write_file", caller="k1"))
    assert outcome == NoOneToAsk(
        "rule 'writes' asks, but nobody is connected to answer (no attached application, no MCP client with "
        "elicitation, no open web console, no `ipybox approve`); "
        "add an allow rule for fs.write_file to ipybox.toml"
    )
    assert last(approver) == ("deny", "writes", "timeout")


async def test_an_ask_goes_to_the_application_of_the_callers_lease_only(
    approver: WorkspaceApprover, attach: Callable[[str, Decide], Awaitable[None]]
) -> None:
    asked: dict[str, list[str]] = {"lease-a": [], "lease-b": []}

    def application(lease: str, accept: bool) -> Decide:
        async def decide(request: ApprovalRequest) -> None:
            asked[lease].append(request.tool_args["path"])
            await (request.accept() if accept else request.reject())

        return decide

    await attach("lease-a", application("lease-a", accept=True))
    await attach("lease-b", application("lease-b", accept=False))
    assert await approver.decide(ToolCall("fs", "write_file", {"path": "1"}, caller="k1")) == Approved()
    assert last(approver) == ("allow", "writes", "application")
    rejected = await approver.decide(ToolCall("fs", "write_file", {"path": "2"}, caller="k2"))
    assert rejected == Rejected("rejected by the application")
    assert last(approver) == ("deny", "writes", "application")
    # A caller of no lease (the shared call token) is nobody's to answer for.
    assert isinstance(await approver.decide(ToolCall("fs", "write_file", {"path": "3"})), NoOneToAsk)
    assert asked == {"lease-a": ["1"], "lease-b": ["2"]}


async def test_an_unanswered_ask_is_rejected_as_the_rules_say_after_ask_timeout(
    approver: WorkspaceApprover, attach: Callable[[str, Decide], Awaitable[None]]
) -> None:
    async def ignore(request: ApprovalRequest) -> None:
        pass

    await attach("lease-a", ignore)
    approver.policy = policy(ask_timeout=0.2)  # a reload takes effect on the next call
    outcome = await approver.decide(ToolCall("fs", "write_file", caller="k1"))
    assert outcome == Rejected("no answer within 0.2 s (rule 'writes' asks)")
    assert last(approver) == ("deny", "writes", "timeout")


async def test_releasing_a_lease_mid_ask_leaves_no_one_to_ask(
    approver: WorkspaceApprover,
    attach: Callable[[str, Decide], Awaitable[None]],
    table: LeaseTable,
    leases: dict[str, LeaseId],
) -> None:
    arrived = asyncio.Event()

    async def hold(request: ApprovalRequest) -> None:
        arrived.set()

    await attach("lease-a", hold)
    decision = asyncio.create_task(approver.decide(ToolCall("fs", "write_file", caller="k1")))
    await asyncio.wait_for(arrived.wait(), 5)
    await drop(table, leases["lease-a"])
    outcome = await decision
    assert isinstance(outcome, NoOneToAsk) and "disconnected" in outcome.reason
    assert last(approver) == ("deny", "writes", "timeout")


async def test_a_decision_that_cannot_be_audited_is_not_acted_on(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").touch()
    (tmp_path / "audit.jsonl").symlink_to(tmp_path / "elsewhere")  # planted where the log goes
    approver = WorkspaceApprover(policy(), AuditLog(tmp_path / "audit.jsonl"), LeaseTable().answerer)
    with pytest.raises(OSError, match="symlink"):
        await approver.decide(ToolCall("fs", "read_file"))
    assert (tmp_path / "elsewhere").read_text() == ""


# --- slow decisions stay off the event loop ---------------------------------------------------------------


def regex_approver(tmp_path: Path, *rules: dict[str, Any]) -> WorkspaceApprover:
    policy = ApprovalPolicy.model_validate({"default": "allow", "rules": list(rules)})
    return WorkspaceApprover(policy, AuditLog(tmp_path / "audit.jsonl"), lambda caller: None)


@pytest.mark.timeout(
    10
)  # a guard against a hang (SIGALRM interrupts a backtracking match), not a speed check
async def test_a_call_against_a_catastrophic_regex_rule_is_decided_at_once(tmp_path: Path) -> None:
    # With Python's re this decision held the supervisor's event loop (every session, `ipybox status`)
    # for 22 s.
    approver = regex_approver(tmp_path, {"id": "aaa", "args": {"q": {"regex": "(a+)+"}}, "decision": "deny"})
    assert await approver.decide(ToolCall("s", "t", {"q": "a" * 28 + "!"})) == Approved()
    assert await approver.decide(ToolCall("s", "t", {"q": "a" * 28})) == Rejected("denied by rule 'aaa'")


class ThreadProbe(str):
    """A string argument that records the threads the rules' regexes read it in."""

    threads: list[int]

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        self.threads.append(threading.get_ident())
        return str(self).encode(encoding, errors)


def probe(size: int) -> ThreadProbe:
    value = ThreadProbe("x" * size)
    value.threads = []
    return value


async def test_a_call_with_large_arguments_is_decided_off_the_event_loop_and_a_small_one_on_it(
    tmp_path: Path,
) -> None:
    approver = regex_approver(
        tmp_path, {"id": "secrets", "args": {"text": {"regex": "(?s).*secret.*"}}, "decision": "deny"}
    )
    loop_thread = threading.get_ident()
    small, large = probe(100), probe(LARGE_ARGUMENTS)
    assert await approver.decide(ToolCall("s", "t", {"text": small})) == Approved()
    assert await approver.decide(ToolCall("s", "t", {"text": large})) == Approved()
    assert small.threads == [loop_thread]
    assert len(large.threads) == 1 and large.threads[0] != loop_thread
    assert await approver.decide(ToolCall("s", "t", {"text": "x" * LARGE_ARGUMENTS + "secret"})) == Rejected(
        "denied by rule 'secrets'"
    )


def test_large_counts_string_characters_and_values_wherever_they_are() -> None:
    assert not is_large({"a": "x" * (LARGE_ARGUMENTS - 10)})
    assert is_large({"a": "x" * LARGE_ARGUMENTS})
    assert is_large({"a": {"b": ["x" * (LARGE_ARGUMENTS // 2), "y" * (LARGE_ARGUMENTS // 2)]}})
    assert is_large({"a": list(range(LARGE_ARGUMENTS))})
    assert is_large({"a": [[]] * LARGE_ARGUMENTS})
    assert not is_large({"path": "notes.md", "options": {"mode": "w", "tags": ["a", "b"], "n": 1.5}})
    # The walk stops at the threshold: 10 million values are not visited one by one.
    assert is_large({"a": [0] * 10_000_000})
