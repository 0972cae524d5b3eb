"""`ipybox validate --live`: the approval rules checked against the tools the servers really list.

`ipybox validate` checks `ipybox.toml` on its own; a rule naming a tool or argument that does not exist
loads and silently never applies. `--live` also starts every enabled server just long enough to list its
tools (all at once, each within `timeout`), stops them all, and reports what `ipybox.rules.lint` finds:

    /ws/ipybox.toml:14:8: rule 'read-only': tool glob 'get_current_tme' matches no tool of server 'time' (did you mean 'get_current_time'?)

Servers start as `ipybox up` starts them: placeholders filled from the environment and the workspace's
`.env` (with `IPYBOX_WORKSPACE`), sandboxed servers confined with what the host executes protected, and a
server refused when sandboxed kernels could write code it runs (`ServerCodeGuard`; with no kernel alive
the kernels' policy is the one `[sandbox]` gives them). A server that fails to start or list its tools in
time is reported, not an error of the command: rules that may be meant for it are not judged, nor are
those for disabled servers. Nothing is left running: each server is stopped (a stdio server's whole
process group) before the command returns, also when it timed out or the command was interrupted. A
workspace that runs (`ipybox up`) is not asked: its servers are started a second time here.

Exit status: 0 no findings, 1 findings, 2 the configuration does not load. Text output: the findings on
stdout, one line each, then a summary; servers that could not be judged on stderr. `--json`: one object,
`{"ok", "findings": [{"location", "rule", "message", "suggestion"}], "servers": {name: {"tools": n} |
{"error": "..."} | {"skipped": "disabled"}}}` (and `"error"` instead of findings when the file does not
load).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipybox.display_text import printable
from ipybox.lifecycle import task_scope

if TYPE_CHECKING:
    import mcp_types as types

    from ipybox.config import WorkspaceConfig
    from ipybox.config.executables import LiveKernels
    from ipybox.mcp_client.params import ServerParams
    from ipybox.mcp_client.pool import MCPServers
    from ipybox.rules.lint import LintFinding, ToolShape

__all__ = [
    "DEFAULT_TIMEOUT",
    "EXIT_CONFIG",
    "EXIT_FINDINGS",
    "list_server_tools",
    "validate_live",
    "workspace_servers",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
"""Seconds a server gets to start (complete the MCP handshake), and as long again to list its tools."""

EXIT_FINDINGS = 1
EXIT_CONFIG = 2

# As the supervisor sets it for its servers (`ipybox.supervisor.tools.WORKSPACE_ENV`): server parameters
# may say where the workspace is. Not imported from there: that would load the whole tool server.
_WORKSPACE_ENV = "IPYBOX_WORKSPACE"


def validate_live(workspace: Path, *, as_json: bool, timeout: float = DEFAULT_TIMEOUT) -> int:
    """Check the approval rules of `workspace` against its servers' tools; print the findings. See the
    module for what is started, what is printed and the exit status.

    Args:
        workspace: The workspace directory.
        as_json: One JSON object on stdout instead of lines.
        timeout: Seconds each server gets to start, and as long again to list its tools.
    """
    from ipybox.config import CONFIG_FILE, ConfigError, load_config
    from ipybox.config.policy_lint import finding_location, located_findings
    from ipybox.rules.lint import lint_rules

    try:
        config = load_config(workspace / CONFIG_FILE)
    except ConfigError as e:
        if as_json:
            print(json.dumps({"ok": False, "error": str(e), "findings": [], "servers": {}}, indent=2))
        else:
            print(printable(str(e), lines=True), file=sys.stderr)
        return EXIT_CONFIG
    disabled = sorted(name for name, server in config.servers.items() if not server.enabled)
    try:
        listed = asyncio.run(list_server_tools(config, workspace, timeout=timeout))
    except KeyboardInterrupt:
        return 130
    known = {name: tools for name, tools in listed.items() if not isinstance(tools, str)}
    failed = {name: error for name, error in listed.items() if isinstance(error, str)}
    findings = lint_rules(config.approval.rules, known, unknown=[*failed, *disabled])
    if as_json:
        servers: dict[str, dict[str, Any]] = {name: {"tools": len(tools)} for name, tools in known.items()}
        servers.update({name: {"error": error} for name, error in failed.items()})
        servers.update({name: {"skipped": "disabled"} for name in disabled})
        report = {
            "ok": not findings,
            "findings": [_finding_json(finding_location(config, finding), finding) for finding in findings],
            "servers": dict(sorted(servers.items())),
        }
        print(json.dumps(report, indent=2))
    else:
        for name, error in sorted(failed.items()):
            line = (
                f"warning: server {name!r} did not list its tools, so rules for it were not checked: {error}"
            )
            print(printable(line), file=sys.stderr)
        for name in disabled:
            print(
                printable(f"note: server {name!r} is disabled; its rules were not checked"), file=sys.stderr
            )
        for line in located_findings(config, findings):
            print(printable(line))
        print(_summary(config, findings, known))
    return EXIT_FINDINGS if findings else 0


def workspace_servers(
    config: WorkspaceConfig, workspace: Path, *, timeout: float = DEFAULT_TIMEOUT
) -> MCPServers:
    """The enabled servers of `config`, to be started as `ipybox up` starts them (see the module), none
    started yet.

    Args:
        config: The workspace's configuration.
        workspace: The workspace directory.
        timeout: Seconds each server gets to start, and to answer each page of its tool listing.
    """
    from ipybox.config.executables import ServerCodeGuard
    from ipybox.mcp_client.pool import MCPServers

    workspace = workspace.resolve()
    params = {name: config.server_params(name) for name in config.enabled_servers()}
    environ = {**os.environ, _WORKSPACE_ENV: str(workspace)}
    dotenv = workspace / ".env"
    kernels = _kernels(config, workspace)
    guard = ServerCodeGuard(workspace, lambda: params, lambda: kernels, environ=environ, dotenv_path=dotenv)

    async def prepare(name: str, server: ServerParams, secrets: bool) -> ServerParams:
        return guard.check(name, server, secrets=secrets)

    return MCPServers(
        params,
        connect_timeout=timeout,
        call_timeout=timeout,  # per page of the listing; a server's own `call_timeout` wins
        environ=environ,
        dotenv_path=dotenv,
        prepare=prepare,
    )


async def list_server_tools(
    config: WorkspaceConfig,
    workspace: Path,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    on_listed: Callable[[str, str | None, list[types.Tool]], None] | None = None,
) -> dict[str, list[ToolShape] | str]:
    """Start every enabled server of `config` at once (as `workspace_servers` says), list its tools and
    stop it: each server's tools, or why it could not list them (one line). Every server is stopped before
    this returns, however it ends (an error, a timeout, cancellation).

    Args:
        config: The workspace's configuration.
        workspace: The workspace directory.
        timeout: Seconds each server gets to start, and as long again to list its tools.
        on_listed: Called with each server's name, `serverInfo.version` and tools as the SDK lists them,
            when it has listed them (e.g. to pin them in `ipybox.lock`).
    """
    from ipybox.config.policy_lint import tool_shapes

    servers = workspace_servers(config, workspace, timeout=timeout)
    servers.on_listed = on_listed
    names = list(config.enabled_servers())
    results: dict[str, list[ToolShape] | str] = {}
    limit = 2 * timeout + 1

    async def list_one(name: str) -> None:
        try:
            # The connection bounds its handshake and each page of the listing; this bounds the whole
            # (a server that pages forever). A cancelled start or listing stops its own server.
            async with asyncio.timeout(limit):
                await servers.connection(name)
        except Exception as e:  # any failure is this server's, reported; the others are still judged
            logger.debug("listing the tools of MCP server %r failed", name, exc_info=True)
            if type(e) is TimeoutError:  # the bound above, not the connection's own (which says more)
                results[name] = f"did not start and list its tools within {limit:g} s"
            else:
                results[name] = " ".join(str(e).split()) or type(e).__name__
        else:
            results[name] = tool_shapes(servers.tools(name))

    try:
        async with task_scope() as group:
            for name in names:
                group.create_task(list_one(name))
    finally:
        await servers.stop()
    return {name: results[name] for name in names if name in results}


def _kernels(config: WorkspaceConfig, workspace: Path) -> list[LiveKernels]:
    """The kernels `ServerCodeGuard` weighs a server against: with none alive here, those `ipybox up` would
    start (the `[sandbox]` policy protecting what the servers execute); none when kernels are unsandboxed."""
    from ipybox.config.executables import LiveKernels, protect, workspace_executables

    if not config.sandbox.enabled:
        return []
    policy = protect(config.sandbox.policy(), workspace_executables(config, workspace))
    return [LiveKernels("the workspace's sandboxed kernels", policy)]


def _finding_json(location: str, finding: LintFinding) -> dict[str, Any]:
    return {
        "location": location,
        "rule": finding.rule_id,
        "message": finding.message,
        "suggestion": finding.suggestion,
    }


def _summary(
    config: WorkspaceConfig, findings: list[LintFinding], known: Mapping[str, list[ToolShape]]
) -> str:
    path = config.path
    tools = sum(len(shapes) for shapes in known.values())
    checked = (
        f"{len(config.approval.rules)} approval rule{'s' * (len(config.approval.rules) != 1)} checked "
        f"against {tools} tool{'s' * (tools != 1)} of {len(known)} server{'s' * (len(known) != 1)}"
    )
    if not findings:
        return f"{path}: ok ({checked})"
    rules = len({finding.rule_index for finding in findings})
    return (
        f"{path}: {len(findings)} finding{'s' * (len(findings) != 1)} in {rules} rule{'s' * (rules != 1)} "
        f"({checked})"
    )
