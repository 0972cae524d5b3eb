"""The values the rule engine works on: a tool call, and the verdict on it.

`ToolCall` is the one model of a tool call in ipybox: the tool server builds it from a kernel's request on
the call channel, approvers decide on it, the approval wire format carries it to an application, and the
audit log records it. Nothing else models a call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ipybox.in_kernel.call_protocol import MAX_CELL_TEXT

__all__ = ["MAX_CELL_TEXT", "AskRoute", "Decision", "ToolCall", "Verdict"]

Decision = Literal["allow", "deny", "ask"]
"""What happens to a tool call: run it, refuse it, or ask the connected application."""

AskRoute = Literal["application", "elicitation", "console", "terminal"]
"""Where an `ask` can be answered: the application attached to the calling kernel, the MCP client's
elicitation, the web console, `ipybox approve` (see `ipybox.approval.asks`)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call of an MCP tool, from the kernel that made it to the audit log.

    Attributes:
        server: Name of the MCP server (as configured in the workspace).
        tool: Name of the tool on that server.
        args: The call's arguments (JSON values).
        annotations: The tool's MCP annotations (`readOnlyHint`, `destructiveHint`, `idempotentHint`,
            `openWorldHint`, `title`) as the server declares them; rules read only the boolean hints, and
            an undeclared (or non-boolean) hint takes the MCP default. The tool server passes those known
            before the server starts (a call is decided first), which may be none. With the MCP SDK:
            `tool.annotations.model_dump(exclude_none=True)` if `tool.annotations` else `{}`.
        caller: Who made the call: the name the tool server issued its token under
            (`ToolServer.add_caller`, e.g. one kernel of a workspace), or "" for the shared call token.
            It routes an `ask` to whoever answers for that caller; it is never recorded or shown.
        cell: The number of the kernel's cell that made the call, as the kernel reports it (`None` when
            it does not). Counts a rule's `max_calls.cell`; it comes from the kernel, so code in it can
            claim a new cell (`max_calls.session`, counted on the host, is the bound it cannot reset).
        code: The hex SHA-256 of that cell's text, as the kernel reports it (`None` when it does not):
            the audit log records it, so a call can be traced to the code that made it.
        line: The line of that cell the call was made on (1-based), as the kernel reports it (`None` when
            it does not: the call ran in another thread, or outside a cell). Shown to people asked about
            the call; never decides anything.
        cell_text: The cell's text as the kernel reports it, at most `MAX_CELL_TEXT` characters: the whole
            cell, or for a longer one the lines around `line` (`cell_text_from` says where they start).
            Shown to people asked about the call, marked as the kernel's claim; never decides anything.
        cell_text_from: The cell line `cell_text` starts at (1 when it is the whole cell).
    """

    server: str
    tool: str
    args: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, Any] = field(default_factory=dict)
    caller: str = ""
    cell: int | None = None
    code: str | None = None
    line: int | None = None
    cell_text: str | None = None
    cell_text_from: int = 1


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the approval policy decided for a tool call.

    Attributes:
        decision: `allow`, `deny` or `ask`.
        rule_id: The rule that decided: its `id`, or `rules[<index>]` (0-based, in file order) for a rule
            without one. `None` when no rule applied and the policy's `default` decided.
        reason: A short explanation for humans (logs, prompts).
        tier: The policy the deciding rule belongs to: `None` for the workspace's `ipybox.toml`, else the
            admin tier's name (`system`, `user`; see `ipybox.config.admin_policy`).
        explanation: The deciding rule's `reason`, written for the calling code ("writes go under out/"),
            when it has one.
    """

    decision: Decision
    rule_id: str | None
    reason: str
    tier: str | None = None
    explanation: str | None = None
