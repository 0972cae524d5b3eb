"""Well-known MCP servers, as `ipybox init` writes them into a new `ipybox.toml`: commented out, or
active with `ipybox init --server NAME`.

Data, not template code, so that other commands (`ipybox server add`) can offer the same servers. Each
`CatalogServer` holds the `[servers.<name>]` table exactly as written (`params`), what the server is (for
the comment above it), and the approval rules that come with it.

Contract:

- Every entry's `params` load with the real loader (`load_config`), each server alone and all together,
  and every rule's `match`/`not_match` examples pass; tests/cli/test_init.py checks both.
- A rule's table may name the workspace with the placeholders `{workspace}` (its absolute path, for
  example calls) and `{workspace_glob}` (the same, glob-escaped, for `glob`/`not_glob` conditions);
  `rules_for()` fills them in. Nothing else is a placeholder: `${VAR}` in `params` is ipybox.toml's own
  syntax, filled when the server starts, and comments never hold a path (a path may hold a line break).
- `deny` rules are meant to be written active even while their server is commented out: they can only
  refuse, and a server of that name added later is covered from its first call. `allow` and `ask` rules
  come in with their server only (an allow rule for a name must not outlive the server it was written for).

The commands run with `npx -y` (npm) and `uvx` (PyPI) fetch the server's package on first use, so they
need Node.js or uv on the host and the network; such servers are not sandboxed by default (a sandboxed
server has no network).
"""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CATALOG", "CatalogRule", "CatalogServer", "catalog_server", "rules_for"]

_PLACEHOLDER = re.compile(r"\{workspace(_glob)?\}")


@dataclass(frozen=True)
class CatalogRule:
    """An approval rule that comes with a catalog server.

    Attributes:
        comment: Why the rule is there, for the comment above it (one paragraph, no line breaks).
        table: The `[[approval.rules]]` table as written (keys and values as in `ipybox.toml`).
    """

    comment: str
    table: Mapping[str, Any]

    @property
    def decision(self) -> str:
        return str(self.table["decision"])


@dataclass(frozen=True)
class CatalogServer:
    """One well-known MCP server.

    Attributes:
        name: The server's name in `ipybox.toml` (a Python identifier: its tools' package name).
        summary: What it is and where it comes from (one line, for the comment above its table).
        params: The `[servers.<name>]` table as written.
        note: More about it (one paragraph, no line breaks), or `""`.
        rules: Approval rules that come with it.
    """

    name: str
    summary: str
    params: Mapping[str, Any]
    note: str = ""
    rules: tuple[CatalogRule, ...] = field(default_factory=tuple)


_FILESYSTEM_WRITE = {"server": "filesystem", "tool": "write_file"}

CATALOG: Mapping[str, CatalogServer] = {
    server.name: server
    for server in (
        CatalogServer(
            name="filesystem",
            summary="@modelcontextprotocol/server-filesystem (npm): read, write, search and move files.",
            params={"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "."]},
            note=(
                'Its only allowed directory is "." (this workspace): the server itself refuses paths '
                "outside it; the two rules for it under [approval] refuse them before the call."
            ),
            rules=(
                CatalogRule(
                    comment=(
                        "The filesystem server stays in the workspace: an absolute or ~ path outside it is "
                        "refused (relative paths are the workspace's). The path below is this workspace's: "
                        "change it if you move the workspace."
                    ),
                    table={
                        "id": "filesystem-stays-in-workspace",
                        "server": "filesystem",
                        "args": {
                            "path": {
                                "regex": "(?s)[/~].*",
                                "not_glob": "{workspace_glob}/**",
                                "not_in": ["{workspace}", "{workspace}/"],
                            }
                        },
                        "decision": "deny",
                        "priority": 100,
                        "match": [
                            {**_FILESYSTEM_WRITE, "args": {"path": "/etc/cron.d/job", "content": ""}},
                            {
                                "server": "filesystem",
                                "tool": "read_text_file",
                                "args": {"path": "~/.ssh/id_rsa"},
                            },
                        ],
                        "not_match": [
                            {**_FILESYSTEM_WRITE, "args": {"path": "out/notes.md", "content": ""}},
                            {**_FILESYSTEM_WRITE, "args": {"path": "{workspace}/notes.md", "content": ""}},
                            {
                                "server": "filesystem",
                                "tool": "list_directory",
                                "args": {"path": "{workspace}"},
                            },
                        ],
                    },
                ),
                CatalogRule(
                    comment=(
                        "Globs match the text, not the resolved path (<workspace>/../x matches the glob "
                        "above): a path with a .. part is refused."
                    ),
                    table={
                        "id": "filesystem-no-parent-paths",
                        "server": "filesystem",
                        "args": {"path": {"regex": r"(?s)(.*/)?\.\.(/.*)?"}},
                        "decision": "deny",
                        "priority": 100,
                        "match": [
                            {**_FILESYSTEM_WRITE, "args": {"path": "{workspace}/../x", "content": ""}},
                            {**_FILESYSTEM_WRITE, "args": {"path": "out/../../x", "content": ""}},
                        ],
                        "not_match": [{**_FILESYSTEM_WRITE, "args": {"path": "out/a..b.md", "content": ""}}],
                    },
                ),
            ),
        ),
        CatalogServer(
            name="fetch",
            summary="mcp-server-fetch (PyPI): fetch a URL and read it as markdown.",
            params={"command": "uvx", "args": ["mcp-server-fetch"]},
            note="It reaches any URL, and a URL can carry data out: its calls are asked (the rule fetch-asks).",
            rules=(
                CatalogRule(
                    comment=(
                        "Fetching reaches any URL, and a URL can carry data out: asked, whatever annotations "
                        "the server declares."
                    ),
                    table={
                        "id": "fetch-asks",
                        "server": "fetch",
                        "decision": "ask",
                        "priority": 10,
                        "match": [
                            {
                                "server": "fetch",
                                "tool": "fetch",
                                "args": {"url": "https://example.com/"},
                                "annotations": {"readOnlyHint": True, "openWorldHint": False},
                            }
                        ],
                        "not_match": [{"server": "time", "tool": "get_current_time"}],
                    },
                ),
            ),
        ),
        CatalogServer(
            name="memory",
            summary="@modelcontextprotocol/server-memory (npm): a knowledge graph of entities and relations.",
            params={
                "command": "npx",
                "args": ["-y", "@modelcontextprotocol/server-memory"],
                "env": {"MEMORY_FILE_PATH": "${IPYBOX_WORKSPACE}/memory.jsonl"},
            },
            note="The graph is kept in memory.jsonl in the workspace.",
        ),
        CatalogServer(
            name="time",
            summary="mcp-server-time (PyPI): the current time and time zone conversions.",
            params={"command": "uvx", "args": ["mcp-server-time"]},
        ),
        CatalogServer(
            name="git",
            summary="mcp-server-git (PyPI): status, diffs, log, commits and branches of a git repository.",
            params={"command": "uvx", "args": ["mcp-server-git", "--repository", "."]},
            note="Reading is allowed by the read-only rule; commits, resets and checkouts are asked.",
        ),
        CatalogServer(
            name="everything",
            summary="@modelcontextprotocol/server-everything (npm): MCP's test server, every feature, to try things.",
            params={"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"]},
        ),
        CatalogServer(
            name="github",
            summary="GitHub's remote MCP server (streamable HTTP): issues, pull requests, code.",
            params={
                "url": "https://api.githubcopilot.com/mcp/",
                "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"},
            },
            note="Set GITHUB_TOKEN in the environment or in the workspace's .env (never in this file).",
        ),
    )
}
"""The catalog, by name, in the order `ipybox init` writes it."""


def catalog_server(name: str) -> CatalogServer:
    """The catalog's server `name`.

    Raises:
        KeyError: No such server; the message lists the known names.
    """
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the catalog (known: {', '.join(CATALOG)})") from None


def rules_for(server: CatalogServer, workspace: Path) -> list[CatalogRule]:
    """`server`'s rules with `{workspace}` and `{workspace_glob}` filled in for `workspace` (an absolute,
    resolved path)."""
    return [CatalogRule(rule.comment, _fill(rule.table, workspace)) for rule in server.rules]


def _fill(value: Any, workspace: Path) -> Any:
    if isinstance(value, str):
        # One pass, so that a workspace path that itself contains "{workspace}" is not filled in again.
        def replace(found: re.Match[str]) -> str:
            return glob.escape(str(workspace)) if found.group(1) else str(workspace)

        return _PLACEHOLDER.sub(replace, value)
    if isinstance(value, Mapping):
        return {key: _fill(item, workspace) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_fill(item, workspace) for item in value]
    return value
