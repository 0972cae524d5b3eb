"""The values the rule engine works on: a tool call, and the verdict on it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Decision = Literal["allow", "deny", "ask"]
"""What happens to a tool call: run it, refuse it, or ask the connected application."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call of an MCP tool, as the approval rules see it.

    Attributes:
        server: Name of the MCP server (as configured in the workspace).
        tool: Name of the tool on that server.
        args: The call's arguments (JSON values).
        annotations: The tool's MCP annotations (`readOnlyHint`, `destructiveHint`, `idempotentHint`,
            `openWorldHint`) as the server declares them; undeclared ones take the MCP defaults. With the
            MCP SDK: `tool.annotations.model_dump(exclude_none=True)` if `tool.annotations` else `{}`.
    """

    server: str
    tool: str
    args: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the approval policy decided for a tool call.

    Attributes:
        decision: `allow`, `deny` or `ask`.
        rule_id: The rule that decided: its `id`, or `rules[<index>]` (0-based, in file order) for a rule
            without one. `None` when no rule applied and the policy's `default` decided.
        reason: A short explanation for humans (logs, prompts).
    """

    decision: Decision
    rule_id: str | None
    reason: str
