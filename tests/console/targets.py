"""A `ConsoleTarget` of the tests' own, built from the real parts the supervisor holds: an `AskBoard`, an
`ApprovalPolicy` loaded from TOML, an `AuditLog` in a temporary directory and a `WorkspaceStatus`. It
answers asks on its board (as the workspace's approver does, minus writing `always` rules) and records
every answer it was given, so tests see what the console passed on."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ipybox.approval.ask_context import CellView, ClientView
from ipybox.approval.asks import AskAnswer, AskBoard, PendingAsk
from ipybox.config import load_config, rule_edit
from ipybox.config.rule_edit import RuleEdit, RuleEdited
from ipybox.config.rule_writer import write_answer_rule
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, Verdict, split_commands
from ipybox.running.status import (
    GatewayStatus,
    KernelId,
    KernelsStatus,
    KernelStatus,
    KernelUsage,
    LeaseId,
    MCPServerStatus,
    PoolStatus,
    ReconcilerStatus,
    ToolServerStatus,
    WorkspaceStatus,
)

RULES = """
[approval]
default = "ask"
ask_timeout = 90

[[approval.rules]]
id = "read-only"
annotations = { readOnlyHint = true }
decision = "allow"

[[approval.rules]]
id = "ask-for-writes"
server = "filesystem"
tool = "write_*"
decision = "ask"

[[approval.rules]]
id = "no-secrets"
server = "filesystem"
args = { path = { glob = "secrets/**" } }
decision = "deny"

[[approval.rules]]
id = "trusted-writes"
server = "filesystem"
tool = "write_file"
args = { path = { glob = "out/**" } }
decision = "allow"
priority = 5

[[approval.rules]]
server = "shell"
tool = "ls"
decision = "allow"

[[approval.rules]]
id = "no-rm"
server = "shell"
tool = "rm"
decision = "deny"
"""

# As `RULES`, with `no-secrets` above the `always` rules answers write (a deny at the asking rule's priority
# would refuse an allow rule one above it): the `ipybox.toml` of tests that write such rules.
RULES_FILE = RULES.replace(
    'glob = "secrets/**" } }\ndecision = "deny"\n',
    'glob = "secrets/**" } }\ndecision = "deny"\npriority = 20\n',
)

WRITE = ToolCall(
    "filesystem", "write_file", {"path": "notes/a.md", "content": "hello"}, {"destructiveHint": True}
)


def policy_of(text: str = RULES) -> ApprovalPolicy:
    return ApprovalPolicy.model_validate(tomllib.loads(text)["approval"])


MiB = 1024**2

KERNELS = KernelsStatus(
    reported=True,
    mechanism="cgroup1",
    limits={"memory": 4096 * MiB, "processes": 256, "open_files": 4096},
    max_idle=1800,
    recycle_rss=2048 * MiB,
    reaped=2,
    recycled=1,
    kernels=[
        KernelStatus(
            kernel_id=KernelId("0f1e2d3c-aaaa-bbbb-cccc-000000000001"),
            role="leased",
            lease=LeaseId("9a8b7c6d5e4f00000000000000000001"),
            execution_state="idle",
            last_activity="2026-11-24T08:01:00Z",
            idle_s=75.0,
            usage=KernelUsage(
                memory=int(312.5 * MiB), memory_peak=1024 * MiB, cpu_seconds=12.345, processes=14, oom_kills=1
            ),
        ),
        KernelStatus(
            kernel_id=KernelId("4b5a6978-aaaa-bbbb-cccc-000000000002"),
            role="pool",
            execution_state="idle",
            idle_s=600.0,
            usage=KernelUsage(memory=52 * MiB, memory_peak=53 * MiB, cpu_seconds=0.41, processes=12),
        ),
    ],
)
"""Two kernels as a workspace with limits reports them: one leased (it went over its memory limit once),
one ready in the warm pool."""


def status_of(**changes: object) -> WorkspaceStatus:
    """A status as a running workspace reports it, with one failed server located in the file and the
    kernels of `KERNELS`."""
    base = WorkspaceStatus(
        workspace="/home/me/project",
        pid=4242,
        started_at="2026-11-24T07:00:00Z",
        uptime_s=3723.0,
        sandbox=True,
        gateway=GatewayStatus(running=True, pid=4243),
        tool_server=ToolServerStatus(running=True),
        pool=PoolStatus(size=2, idle=1, leased=1),
        leases=1,
        kernel_generation=3,
        restarts={"gateway": 1},
        reconciler=ReconcilerStatus(
            generation=7,
            servers={
                "filesystem": MCPServerStatus(
                    state="ready", tools=14, generation=7, location="ipybox.toml:4:1"
                ),
                "broken": MCPServerStatus(
                    state="failed",
                    error="could not start: npx: command not found",
                    location="ipybox.toml:12:1",
                    parser_errors=["mcpparse/broken/x.py:3:1: SyntaxError"],
                ),
            },
        ),
        state_dir="/home/me/project/.ipybox",
        mcp="http://127.0.0.1:8123/mcp",
        console="http://127.0.0.1:8124/",
        kernels=KERNELS,
    )
    return base.model_copy(update=changes)


@dataclass
class WorkspaceTarget:
    """The console's target in the tests (see the module docstring).

    Attributes:
        refusal: When set, `answer` refuses with it (as an `always` rule that would not load is refused).
        write_rules: `always` answers write their rule into `config_path` (with the real writer).
        answers: Every `(ask_id, answer)` the console passed on, in order.
    """

    directory: Path
    board: AskBoard = field(default_factory=AskBoard)
    policy: ApprovalPolicy = field(default_factory=policy_of)
    refusal: str | None = None
    answers: list[tuple[str, AskAnswer]] = field(default_factory=list)
    workspace_status: WorkspaceStatus = field(default_factory=status_of)
    accepted: list[str | None] = field(default_factory=list)
    write_rules: bool = False

    def __post_init__(self) -> None:
        self.audit = AuditLog(self.directory / ".ipybox" / "audit.jsonl")
        self.config_path = self.directory / "ipybox.toml"

    def status(self) -> WorkspaceStatus:
        return self.workspace_status.model_copy(update={"pending_asks": len(self.board.pending)})

    async def status_with_kernels(self) -> WorkspaceStatus:
        return self.status()  # the test's status carries `kernels` when it set them

    def explain(self, call: ToolCall) -> list[tuple[ToolCall, Verdict]]:
        if call.server == "shell":
            commands = [
                ToolCall("shell", command.program, {"cmd": command.text})
                for command in split_commands(str(call.args.get("cmd", "")))
            ]
            return [(command, self.policy.decide(command)) for command in commands]
        return [(call, self.policy.decide(call))]

    async def accept_pins(self, server: str | None) -> list[str]:
        """As the supervisor: the server's differences are gone from the status once accepted."""
        self.accepted.append(server)
        policy = self.workspace_status.policy
        if server not in policy.pins:
            raise KeyError(f"server {server!r} has not started in this run")
        pins = {name: lines for name, lines in policy.pins.items() if name != server}
        self.workspace_status = self.workspace_status.model_copy(
            update={"policy": policy.model_copy(update={"pins": pins})}
        )
        return [server] if server is not None else []

    async def edit_rule(self, rule: str, edit: RuleEdit) -> RuleEdited:
        """As the supervisor: the real edit of `ipybox.toml`, then its rules are the ones in effect."""
        done = rule_edit.edit_rule(self.config_path, rule, edit)
        self.policy = load_config(self.config_path).approval
        return done

    async def set_rule_args(self, rule: str, args: str) -> RuleEdited:
        """As the supervisor: the real edit, then its rules are the ones in effect."""
        done = rule_edit.set_rule_args(self.config_path, rule, args)
        self.policy = load_config(self.config_path).approval
        return done

    async def answer(self, ask_id: str, answer: AskAnswer) -> str | None:
        self.answers.append((ask_id, answer))
        if self.refusal is not None:
            return self.refusal
        ask = self.board.get(ask_id)
        if answer.scope == "always" and self.write_rules and ask is not None:
            try:  # as the supervisor: the rule written, then in effect
                write_answer_rule(
                    self.config_path,
                    ask.call,
                    accept=answer.accept,
                    asked_by=ask.rule_id,
                    by=answer.by,
                    redact=self.audit.redact,
                    choices=answer.choices,
                )
            except ValueError as e:
                return str(e)
            self.policy = load_config(self.config_path).approval
        if self.board.answer(ask_id, answer):
            return None
        closed, first = self.board.closed_answer(ask_id)
        if closed and first is not None:
            return f"already {first.describe()}"
        return "this ask is not pending any more"

    def ask(
        self,
        call: ToolCall = WRITE,
        *,
        timeout: float | None = 90,
        subject: str | None = None,
        cell: CellView | None = None,
        client: ClientView | None = None,
    ) -> PendingAsk:
        """Open an ask as the workspace's approver does (call from the board's event loop)."""
        return self.board.open(
            call,
            self.policy.decide(call),
            asked_of="console",
            routes=("console", "terminal"),
            session="0123456789abcdef",
            subject=subject,
            timeout=timeout,
            cell=cell,
            client=client,
        )
