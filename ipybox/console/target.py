"""`ConsoleTarget`: what the web console reads and drives (the supervisor), as a small protocol, so the
console is tested in process against a target of the test's own.

Contract: every method answers at once from memory, except `answer` (which may write `ipybox.toml` for an
`always` answer, in a thread), `edit_rule` (which writes it, in a thread, and reloads the rules), `status_with_kernels` (which asks the kernel gateway, for 2 s at most) and
`audit` reads (the console pages the log itself, in a thread).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ipybox.approval.asks import AskAnswer, AskBoard
from ipybox.config.rule_edit import RuleEdit, RuleEdited
from ipybox.rules import ApprovalPolicy, AuditLog, ToolCall, Verdict
from ipybox.running.status import WorkspaceStatus


class ConsoleTarget(Protocol):
    """The workspace the console shows."""

    @property
    def board(self) -> AskBoard:
        """The pending asks, their events, and who is present to answer."""
        ...

    @property
    def policy(self) -> ApprovalPolicy:
        """The `[approval]` rules in effect now."""
        ...

    @property
    def audit(self) -> AuditLog:
        """The audit log of decisions."""
        ...

    @property
    def config_path(self) -> Path:
        """The workspace's `ipybox.toml`."""
        ...

    def status(self) -> WorkspaceStatus:
        """What runs: servers (state, tools, error and its place in `ipybox.toml`), kernels, leases,
        sandbox, endpoints."""
        ...

    async def status_with_kernels(self) -> WorkspaceStatus:
        """`status()` with each kernel's memory, CPU time and processes, and the limits (`kernels`)."""
        ...

    def explain(self, call: ToolCall) -> list[tuple[ToolCall, Verdict]]:
        """What the rules in effect decide for `call`, and which rule decides: one pair for a tool call;
        for a shell line (`server` "shell", `args` `{"cmd": ...}`), one per command it runs.

        Raises:
            ValueError: A shell line that cannot be read (the message says why).
        """
        ...

    async def accept_pins(self, server: str | None) -> list[str]:
        """Pin in `ipybox.lock` what `server` serves now (its changed and new tools are decided by the
        rules again); the servers accepted.

        Raises:
            KeyError: The server has not listed its tools in this run.
        """
        ...

    async def edit_rule(self, rule: str, edit: RuleEdit) -> RuleEdited:
        """Disable, enable or remove a rule of `ipybox.toml` (`ipybox.config.rule_edit.edit_rule`), then
        apply the file's rules now.

        Raises:
            RuleEditError: Nothing was written: why, and what to do.
        """
        ...

    async def set_rule_args(self, rule: str, args: str) -> RuleEdited:
        """Rewrite the argument conditions of a rule an `always` answer wrote (a TOML inline table, empty
        for any arguments: `ipybox.config.rule_edit.set_rule_args`), then apply the file's rules now.

        Raises:
            RuleEditError: Nothing was written: why, and what to do.
        """
        ...

    async def answer(self, ask_id: str, answer: AskAnswer) -> str | None:
        """Answer a pending ask. `None` when the answer took; else why not, for the person: it was answered
        first elsewhere ("already allowed once by terminal (...)"), it is gone (timed out, the calling code
        went away), or an `always` rule could not be written (the reason it would not load)."""
        ...
