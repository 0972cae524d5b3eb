"""Approval-rule findings (`ipybox.rules.lint`) placed in the workspace's files: `ipybox.toml:LINE:COL: ...`.

`ipybox.rules.lint` says what in which rule can't be right (a tool glob that matches no tool, an argument
no schema declares), as a key path within the rule; this module says where that key is written, as
`ConfigError` does for load errors, so an editor or a CI log jumps to it:

    /ws/ipybox.toml:14:8: rule 'read-only': tool glob 'get_current_tme' matches no tool of server 'time' (did you mean 'get_current_time'?)

A finding is placed at the most specific key written: the condition (`glob = ...` inside an argument's
inline table), else the argument, the list element or the key, else the rule's `[[approval.rules]]`
header. Rules set by an `IPYBOX_APPROVAL...` variable (environment or `.env`) are blamed on the variable,
as loading blames a bad value on it. The path is the loaded file's (absolute), as in load errors.

- `located_findings`: the lines to show (`ipybox status`, `ipybox validate --live`);
- `lint_error`: the findings as a `ConfigError`, for `LintMode` `error` (refused like an invalid file);
- `tool_shapes`: what linting reads of the tools an MCP server listed (`mcp_types.Tool`s), without this
  module loading the MCP SDK.

Which `LintMode` applies is the caller's to decide: nothing here reads a setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ipybox.config.errors import ConfigError, ConfigProblem
from ipybox.config.loading import CONFIG_FILE, setting_source
from ipybox.config.positions import KeyPath
from ipybox.config.workspace_config import WorkspaceConfig
from ipybox.mcp_client.pool import annotations_of
from ipybox.rules.lint import LintFinding, ToolShape

if TYPE_CHECKING:
    import mcp_types as types  # only for the type: listing tools loads the SDK, this module must not

__all__ = ["LintMode", "finding_location", "finding_problem", "lint_error", "located_findings", "tool_shapes"]

LintMode = Literal["warn", "error"]
"""How rule findings count: `warn` reports them and changes nothing; `error` makes them refuse the file
as a load error would (the rules that were in effect stay)."""


def tool_shapes(tools: Iterable[types.Tool]) -> list[ToolShape]:
    """What linting reads of tools as an MCP server listed them."""
    return [ToolShape(tool.name, tool.input_schema, annotations_of(tool)) for tool in tools]


def finding_problem(config: WorkspaceConfig, finding: LintFinding) -> ConfigProblem:
    """`finding` as a problem of the workspace's configuration, placed at the most specific key written:
    `str()` of it is `PATH:LINE:COL: rule 'ID': message` (a rule without an id: `rules[N]: ...`, as load
    errors name it). Without a known line (a rule written in a way the position scanner does not follow)
    it is `PATH: ...`; for rules set by a variable, `environment variable NAME: ...`."""
    source, line, column = _place(config, finding)
    unnamed = finding.rule_id == f"rules[{finding.rule_index}]"  # ids of that form are refused
    name = finding.rule_id if unnamed else f"rule {finding.rule_id!r}"
    return ConfigProblem(source, line, column, f"{name}: {finding.message}")


def finding_location(config: WorkspaceConfig, finding: LintFinding) -> str:
    """Where `finding`'s key is written: `PATH:LINE:COL`, or as `finding_problem` says without a line."""
    source, line, column = _place(config, finding)
    return source if line is None else f"{source}:{line}:{column or 1}"


def located_findings(config: WorkspaceConfig, findings: Iterable[LintFinding]) -> list[str]:
    """One line per finding (see `finding_problem`), in the order given."""
    return [str(finding_problem(config, finding)) for finding in findings]


def lint_error(config: WorkspaceConfig, findings: Sequence[LintFinding]) -> ConfigError:
    """A `ConfigError` listing `findings`, for `lint = "error"`: the rules are refused as an invalid file
    would be, one line per finding (at least one).

    Raises:
        ValueError: `findings` is empty.
    """
    return ConfigError(_path(config), [finding_problem(config, finding) for finding in findings])


def _path(config: WorkspaceConfig) -> Path:
    return config.path if config.path is not None else config.root / CONFIG_FILE


def _place(config: WorkspaceConfig, finding: LintFinding) -> tuple[str, int | None, int | None]:
    path = str(_path(config))
    full: KeyPath = ("approval", "rules", finding.rule_index, *finding.key)
    # From the most specific key to the rule itself: a bare value (`path = "x"`) has no `equals` key to
    # point at, and a rule's defaults (`server = "*"`) are not written at all.
    for end in range(len(full), 2, -1):
        source, line, column = setting_source(config, full[:end])
        if line is not None or source != path:
            return source, line, column  # in a file, or a variable that sets the rules (no line)
    return path, None, None
