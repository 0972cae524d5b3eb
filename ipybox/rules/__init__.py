"""Rule-based approval of tool calls: `allow`, `deny` or `ask`, decided on the host before a call runs."""

from ipybox.rules.audit import (
    AuditEntry,
    AuditFilter,
    AuditLog,
    AuditLogContents,
    AuditPage,
    BrokenLink,
    ChainReport,
    DecidedBy,
    verify_chain,
)
from ipybox.rules.calls import Decision, ToolCall, Verdict
from ipybox.rules.models import AdminTier, ApprovalPolicy, ArgCondition, CallQuota, ExampleCall, Rule
from ipybox.rules.shell_commands import (
    SHELL_SERVER,
    ShellCommand,
    ShellSyntaxError,
    shell_calls,
    split_commands,
)
from ipybox.rules.tool_annotations import ANNOTATION_DEFAULTS

__all__ = [
    "ANNOTATION_DEFAULTS",
    "SHELL_SERVER",
    "AdminTier",
    "ApprovalPolicy",
    "ArgCondition",
    "AuditEntry",
    "AuditFilter",
    "AuditLog",
    "AuditLogContents",
    "AuditPage",
    "BrokenLink",
    "CallQuota",
    "ChainReport",
    "DecidedBy",
    "Decision",
    "ExampleCall",
    "Rule",
    "ShellCommand",
    "ShellSyntaxError",
    "ToolCall",
    "Verdict",
    "shell_calls",
    "split_commands",
    "verify_chain",
]
