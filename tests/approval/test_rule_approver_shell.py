"""`WorkspaceApprover` on a kernel's shell questions: each command of the line decided by the workspace's
rules as `shell.<program>`, the line run only if every command may, asks put to the application in turn,
and every decision that stands in the audit log."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ipybox.approval import ApprovalRequest, Approved, NoOneToAsk, Rejected, rule_approver
from ipybox.approval.rule_approver import LARGE_SHELL_COMMAND, WorkspaceApprover
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, shell_calls
from ipybox.supervisor.leases import LeaseTable
from tests.approval import test_rule_approver as tool_calls
from tests.approval.test_rule_approver import Decide

# The leases, lease table and attached applications of the tool-call tests, as in a workspace.
leases, table, attach = tool_calls.leases, tool_calls.table, tool_calls.attach

RULES: list[dict[str, Any]] = [
    {"id": "read", "server": "shell", "tool": ["ls", "cat"], "decision": "allow"},
    {
        "id": "pip",
        "server": "shell",
        "tool": "pip",
        "args": {"cmd": {"regex": "pip install .*"}},
        "decision": "ask",
    },
    {
        "id": "no-rm-rf",
        "server": "shell",
        "tool": "rm",
        "args": {"cmd": {"regex": "rm -rf .*"}},
        "decision": "deny",
    },
    {"id": "tools", "server": "*", "tool": "*", "decision": "allow", "priority": -1},
]


def policy(ask_timeout: float = 5) -> ApprovalPolicy:
    return ApprovalPolicy.model_validate({"default": "ask", "ask_timeout": ask_timeout, "rules": RULES})


@pytest.fixture
def approver(tmp_path: Path, table: LeaseTable) -> WorkspaceApprover:
    return WorkspaceApprover(policy(), AuditLog(tmp_path / "audit.jsonl"), table.answerer)


def shell(cmd: str, caller: str = "k1", **extra: str) -> ToolCall:
    return ToolCall("ipybox", "shell" if not extra else "shell_magic", {"cmd": cmd, **extra}, caller=caller)


def audited(approver: WorkspaceApprover) -> list[tuple[str, str, str, str, str | None, str]]:
    """The audit log as its reader gives it back."""
    return [
        (e.server, e.tool, e.args["cmd"], e.decision, e.rule_id, e.decided_by) for e in approver.audit.read()
    ]


def reasons(approver: WorkspaceApprover) -> list[str]:
    return [entry.reason or "" for entry in approver.audit.read()]


Attach = Callable[[str, Decide], Awaitable[None]]


def answering(asked: list[tuple[str, str, dict[str, Any]]], *answers: bool) -> Decide:
    """An application that records what it is asked and answers `answers` in turn."""
    queue = list(answers)

    async def decide(request: ApprovalRequest) -> None:
        asked.append((request.server_name, request.tool_name, dict(request.tool_args)))
        await (request.accept() if queue.pop(0) else request.reject())

    return decide


async def test_a_line_whose_commands_are_all_allowed_runs_and_each_is_audited(
    approver: WorkspaceApprover,
) -> None:
    assert await approver.decide(shell("ls -la && cat 'a b' | cat")) == Approved()
    assert audited(approver) == [
        ("shell", "ls", "ls -la", "allow", "read", "rule"),
        ("shell", "cat", "cat 'a b'", "allow", "read", "rule"),
        ("shell", "cat", "cat", "allow", "read", "rule"),
    ]


async def test_one_denied_command_refuses_the_line_at_once_naming_it_and_asking_nobody(
    approver: WorkspaceApprover, attach: Attach
) -> None:
    asked: list[tuple[str, str, dict[str, Any]]] = []
    await attach("lease-a", answering(asked, True, True))
    outcome = await approver.decide(shell("ls && pip install x && r'm' -r\"f\" d"))
    assert outcome == Rejected("`rm -rf d` is denied by rule 'no-rm-rf'")
    assert asked == []
    # The allowed command is audited as not run; the one never asked about is not audited.
    assert audited(approver) == [
        ("shell", "ls", "ls", "allow", "read", "rule"),
        ("shell", "rm", "rm -rf d", "deny", "no-rm-rf", "rule"),
    ]
    assert reasons(approver)[0] == "rule 'read' applies; not run: `rm -rf d` is denied by rule 'no-rm-rf'"


async def test_a_substitution_is_decided_as_a_command_of_its_own(approver: WorkspaceApprover) -> None:
    assert await approver.decide(shell("ls $(rm -rf d)")) == Rejected(
        "`rm -rf d` is denied by rule 'no-rm-rf'"
    )


async def test_each_ask_goes_to_the_application_in_turn_as_the_commands_call(
    approver: WorkspaceApprover, attach: Attach
) -> None:
    asked: list[tuple[str, str, dict[str, Any]]] = []
    await attach("lease-a", answering(asked, True, True))
    assert await approver.decide(shell("pip install a; ls; pip install 'b>=2'")) == Approved()
    assert asked == [
        ("shell", "pip", {"cmd": "pip install a"}),
        ("shell", "pip", {"cmd": "pip install 'b>=2'"}),
    ]
    assert audited(approver) == [
        ("shell", "pip", "pip install a", "allow", "pip", "application"),
        ("shell", "ls", "ls", "allow", "read", "rule"),
        ("shell", "pip", "pip install 'b>=2'", "allow", "pip", "application"),
    ]


async def test_the_first_no_refuses_the_line_and_later_commands_are_not_asked(
    approver: WorkspaceApprover, attach: Attach
) -> None:
    asked: list[tuple[str, str, dict[str, Any]]] = []
    await attach("lease-a", answering(asked, False, True))
    outcome = await approver.decide(shell("ls; pip install a; pip install b"))
    assert outcome == Rejected("`pip install a` was rejected by the application")
    assert [cmd["cmd"] for _, _, cmd in asked] == ["pip install a"]
    assert audited(approver) == [
        ("shell", "ls", "ls", "allow", "read", "rule"),
        ("shell", "pip", "pip install a", "deny", "pip", "application"),
    ]
    assert "not run: `pip install a` was rejected by the application" in reasons(approver)[0]


async def test_an_ask_with_nobody_attached_names_the_command_and_the_rule_to_add(
    approver: WorkspaceApprover,
) -> None:
    outcome = await approver.decide(shell("pip install a"))
    assert outcome == NoOneToAsk(
        "rule 'pip' asks, but nobody is connected to answer (no attached application, no MCP client with "
        "elicitation, no open web console, no `ipybox approve`) on `pip install a`; "
        "add an allow rule for shell.pip to ipybox.toml"
    )
    assert audited(approver) == [("shell", "pip", "pip install a", "deny", "pip", "timeout")]


async def test_an_unanswered_ask_is_refused_after_ask_timeout(
    approver: WorkspaceApprover, attach: Attach
) -> None:
    async def ignore(request: ApprovalRequest) -> None:
        pass

    await attach("lease-a", ignore)
    approver.policy = policy(ask_timeout=0.2)
    assert await approver.decide(shell("pip install a")) == Rejected(
        "no answer on `pip install a` within 0.2 s (rule 'pip' asks)"
    )
    assert audited(approver) == [("shell", "pip", "pip install a", "deny", "pip", "timeout")]


async def test_a_line_that_cannot_be_read_is_refused_and_audited(approver: WorkspaceApprover) -> None:
    outcome = await approver.decide(shell("ls 'unclosed; rm -rf d"))
    assert isinstance(outcome, Rejected) and "cannot be read" in outcome.reason
    assert "a quote is not closed" in outcome.reason
    assert audited(approver) == [("ipybox", "shell", "ls 'unclosed; rm -rf d", "deny", None, "default")]


async def test_a_substitution_in_an_array_subscript_is_decided_and_audited(
    approver: WorkspaceApprover,
) -> None:
    # bash runs `rm -rf d` here; the reader once crashed on the subscript, refusing the line unaudited.
    assert await approver.decide(shell("a[$(rm -rf d)]=1")) == Rejected(
        "`rm -rf d` is denied by rule 'no-rm-rf'"
    )
    assert audited(approver) == [("shell", "rm", "rm -rf d", "deny", "no-rm-rf", "rule")]


async def test_a_line_that_runs_nothing_is_approved_without_an_entry(approver: WorkspaceApprover) -> None:
    assert await approver.decide(shell("# just a comment\n")) == Approved()
    assert audited(approver) == []


async def test_allow_rules_count_for_shell_commands_only_when_they_name_the_shell_server(
    tmp_path: Path,
) -> None:
    rules = [
        {"id": "everything", "decision": "allow"},
        {"id": "no-rm", "tool": "rm", "decision": "deny"},
        {"id": "ls", "server": ["fs", "shell"], "tool": "ls", "decision": "allow"},
    ]
    approver = WorkspaceApprover(
        ApprovalPolicy.model_validate({"default": "deny", "rules": rules}),
        AuditLog(tmp_path / "audit.jsonl"),
        lambda caller: None,
    )
    assert await approver.decide(ToolCall("fs", "write_file")) == Approved()  # tool calls: as before
    assert await approver.decide(shell("ls")) == Approved()
    assert await approver.decide(shell("cat x")) == Rejected("`cat x` is denied by the default decision")
    assert await approver.decide(shell("rm x")) == Rejected("`rm x` is denied by rule 'no-rm'")


@pytest.mark.parametrize(("magic", "expected"), [(None, ["ls", "cat"]), ("script bash", ["ls", "cat"])])
async def test_a_bash_cell_is_decided_command_by_command(
    approver: WorkspaceApprover, magic: str | None, expected: list[str]
) -> None:
    extra = {"magic": magic} if magic else {}
    question = ToolCall("ipybox", "shell_magic", {"cmd": "ls\ncat x\n", **extra}, caller="k1")
    assert await approver.decide(question) == Approved()
    assert [entry[1] for entry in audited(approver)] == expected


async def test_another_interpreters_cell_is_one_command_of_that_interpreter(
    approver: WorkspaceApprover, attach: Attach
) -> None:
    asked: list[tuple[str, str, dict[str, Any]]] = []
    await attach("lease-a", answering(asked, False))
    outcome = await approver.decide(shell("print 1;", magic="perl -w"))
    assert outcome == Rejected("the perl cell was rejected by the application")
    assert asked == [("shell", "perl", {"cmd": "print 1;", "magic": "perl -w"})]


async def test_a_long_line_is_split_off_the_event_loop_and_a_short_one_on_it(
    approver: WorkspaceApprover, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []

    def recording(call: ToolCall) -> list[ToolCall]:
        threads.append(threading.get_ident())
        return shell_calls(call)

    monkeypatch.setattr(rule_approver, "shell_calls", recording)
    assert await approver.decide(shell("ls")) == Approved()
    assert await approver.decide(shell("ls " + "a" * LARGE_SHELL_COMMAND)) == Approved()
    assert threads[0] == threading.get_ident() != threads[1]
