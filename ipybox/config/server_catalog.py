"""Well-known MCP servers, as `ipybox init` writes them into a new `ipybox.toml`: commented out, or
active with `ipybox init --server NAME`.

Data, not template code, so that other commands (`ipybox server add`) can offer the same servers. Each
`CatalogServer` holds the `[servers.<name>]` table exactly as written (`params`), what the server is (for
the comment above it), and the approval rules that come with it.

Contract:

- Every entry's `params` load with the real loader (`load_config`), each server alone and all together,
  and every rule's `match`/`not_match` examples pass; tests/cli/test_init.py checks both.
- A rule's table may name the workspace with the placeholders `{workspace}` (its absolute path, for
  example calls), `{workspace_glob}` (the same, glob-escaped, for `glob`/`not_glob` conditions) and
  `{workspace_regex}` (escaped for `regex`, by `regex_escape`). They are written into `ipybox.toml` as they
  are, and the loader fills them in for the workspace the file is in (`fill_workspace`), so a committed
  file works wherever it is checked out; `rules_for()` fills them in here. Nothing else is a placeholder: `${VAR}` in `params` is ipybox.toml's own
  syntax, filled when the server starts, and comments never hold a path (a path may hold a line break).
- `deny` rules are meant to be written active even while their server is commented out: they can only
  refuse, and a server of that name added later is covered from its first call. `allow` and `ask` rules
  come in with their server only (an allow rule for a name must not outlive the server it was written for).

- A server that takes paths of the workspace (filesystem) runs sandboxed: the kernel chooses its
  arguments, so unsandboxed it would read and write for the kernel what the kernel's own sandbox keeps
  from it (`.env`, `.ipybox/`, `ipybox.toml` through a link the kernel made). A sandboxed server has no
  network, so its command is the package's own program, installed beforehand (`install` says how), not
  `npx -y`. Servers whose arguments name no file of the workspace (fetch, memory, time, everything,
  github) run unsandboxed with `npx -y` or `uvx`, which fetch the package on first use; git must write
  `.git`, which a sandbox protects, so it stays unsandboxed and its rule keeps it on the workspace's own
  repository.
- The workspace's protected names (`PROTECTED_NAMES`) are refused in every path argument of the
  filesystem server by `deny` rules, in every spelling the other rules let through (relative, `./`,
  absolute; `..` is refused by its own rule), as a second line behind the sandbox.
"""

from __future__ import annotations

import glob
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipybox.sandbox.policy import DEFAULT_DENY_WRITE, DOTENV_PATTERN

__all__ = [
    "CATALOG",
    "PROTECTED_NAMES",
    "CatalogRule",
    "CatalogServer",
    "catalog_server",
    "fill_workspace",
    "regex_escape",
    "rules_for",
]

_PLACEHOLDER = re.compile(r"\{workspace(_glob|_regex)?\}")

PROTECTED_NAMES: tuple[str, ...] = (DOTENV_PATTERN, *DEFAULT_DENY_WRITE)
"""The names a sandbox hides (`.env*`) or keeps read-only (`ipybox.toml`, `.ipybox`, `mcptools`, `.git`,
...) at the workspace's top level; the filesystem server's rules refuse paths to them."""


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
        install: The command that installs its program, for a server whose `command` is not fetched on
            first use (a sandboxed one), or `""`.
    """

    name: str
    summary: str
    params: Mapping[str, Any]
    note: str = ""
    rules: tuple[CatalogRule, ...] = field(default_factory=tuple)
    install: str = ""


def regex_escape(text: str) -> str:
    """`text` as a rule regex matching it literally, in a form both Python's `re` and RE2 read the same
    way: ASCII letters, digits, `_`, `-` and `/` as they are, other ASCII punctuation after a backslash, any
    other character (a space, a line break, non-ASCII) as `\\uXXXX`/`\\UXXXXXXXX`."""
    out = []
    for char in text:
        if (char.isascii() and char.isalnum()) or char in "_-/":  # `-` is literal outside a class
            out.append(char)
        elif char in string.punctuation:
            out.append("\\" + char)
        else:
            out.append(f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")
    return "".join(out)


def _top_level_regex(names: tuple[str, ...]) -> str:
    """A rule regex for a path to one of `names` (fnmatch patterns whose only glob is a trailing `*`) at
    the workspace's top level or inside it: relative, after `./` or `//`, or absolute (`{workspace_regex}`
    is the workspace's path); and any path with a `..` part, which could lead there."""
    parts = [
        regex_escape(name[:-1]) + "[^/]*" if name.endswith("*") else regex_escape(name) for name in names
    ]
    return f"(?s)(.*/)?\\.\\.(/.*)?|({{workspace_regex}})?(/|\\./)*({'|'.join(parts)})(/.*)?"


# A call of the filesystem server taking each path argument, for the examples: (tool, the other arguments).
_TAKES = {
    "path": ("write_file", {"content": ""}),
    "source": ("move_file", {"destination": "out/x"}),
    "destination": ("move_file", {"source": "out/x"}),
}


def _protected_rule(argument: str) -> CatalogRule:
    """The deny rule for the workspace's protected names in the filesystem server's argument `argument`."""
    tool, others = _TAKES[argument]

    def call(path: str) -> dict[str, Any]:
        return {"server": "filesystem", "tool": tool, "args": {argument: path, **others}}

    comment = (
        "The filesystem server never touches what the host acts on (ipybox.toml, .ipybox, .env files, "
        "mcptools, .git, environments, editor and shell settings, ...): a path to one, or into one, at the "
        "workspace's top level is refused, relative, after ./ or absolute, and so is a path with a .. part, "
        "which may lead there. Its sandbox keeps them out of its "
        "reach too; this refuses the call before it is asked or run. {workspace...} is this workspace's "
        "path, wherever it is."
        if argument == "path"
        else f"The same for the `{argument}` of move_file."
    )
    return CatalogRule(
        comment=comment,
        table={
            "id": f"filesystem-protected-{argument}",
            "server": "filesystem",
            "args": {argument: {"regex": _top_level_regex(PROTECTED_NAMES)}},
            "decision": "deny",
            "priority": 100,
            "match": [
                call("ipybox.toml"),
                call("./.ipybox/state.json"),
                call("{workspace}/.env"),
                call(".//mcptools/x/__init__.py"),
                call("{workspace}/./.git/hooks/pre-commit"),
                call("out/../ipybox.toml"),
            ],
            "not_match": [
                call("out/notes.md"),
                call("ipybox.toml.md"),
                call("out/.env"),
                call("{workspace}-other/.env"),
            ],
        },
    )


_FILESYSTEM_WRITE = {"server": "filesystem", "tool": "write_file"}

CATALOG: Mapping[str, CatalogServer] = {
    server.name: server
    for server in (
        CatalogServer(
            name="filesystem",
            summary="@modelcontextprotocol/server-filesystem (npm): read, write, search and move files.",
            params={"command": "mcp-server-filesystem", "args": ["."], "sandbox": True},
            note=(
                'Its only allowed directory is "." (this workspace), and it runs in a sandbox of its own: '
                "it can't read .env files or .ipybox, nor write ipybox.toml, mcptools, .git or the other "
                "names the host acts on, even through a link. A sandbox has no network, so npx can't "
                "fetch it: install it first (npm install -g @modelcontextprotocol/server-filesystem). The "
                "rules for it under [approval] refuse paths outside the workspace and these names."
            ),
            install="npm install -g @modelcontextprotocol/server-filesystem",
            rules=(
                CatalogRule(
                    comment=(
                        "The filesystem server stays in the workspace: an absolute or ~ path outside it is "
                        "refused (relative paths are the workspace's). {workspace...} is this workspace's path, "
                        "wherever it is."
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
                *(_protected_rule(argument) for argument in _TAKES),
                CatalogRule(
                    comment=(
                        "read_multiple_files takes a list of paths, which rules can't judge path by path: "
                        "it is asked, whatever the tool declares."
                    ),
                    table={
                        "id": "filesystem-path-lists-ask",
                        "server": "filesystem",
                        "tool": "read_multiple_files",
                        "decision": "ask",
                        "priority": 50,
                        "match": [
                            {
                                "server": "filesystem",
                                "tool": "read_multiple_files",
                                "args": {"paths": ["notes.md", ".env"]},
                                "annotations": {"readOnlyHint": True, "openWorldHint": False},
                            }
                        ],
                        "not_match": [
                            {"server": "filesystem", "tool": "read_text_file", "args": {"path": "a"}}
                        ],
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
            note=(
                "Reading is allowed by the read-only rule; commits, resets and checkouts are asked. It is not "
                "sandboxed (it writes .git, which a sandbox keeps read-only): its rule keeps it on this "
                "workspace's own repository."
            ),
            rules=(
                CatalogRule(
                    comment=(
                        "The git server works on this workspace's repository only: a repo_path naming "
                        "another (a subdirectory where code in a kernel made a .git, whose hooks a commit "
                        "would run on the host) is refused. {workspace...} is this workspace's path, "
                        "wherever it is."
                    ),
                    table={
                        "id": "git-workspace-repository-only",
                        "server": "git",
                        "args": {"repo_path": {"not_in": [".", "./", "{workspace}", "{workspace}/"]}},
                        "decision": "deny",
                        "priority": 100,
                        "match": [
                            {
                                "server": "git",
                                "tool": "git_commit",
                                "args": {"repo_path": "out", "message": "x"},
                            },
                            {"server": "git", "tool": "git_status", "args": {"repo_path": "{workspace}/out"}},
                        ],
                        "not_match": [
                            {
                                "server": "git",
                                "tool": "git_commit",
                                "args": {"repo_path": ".", "message": "x"},
                            },
                            {"server": "git", "tool": "git_status", "args": {"repo_path": "{workspace}"}},
                        ],
                    },
                ),
            ),
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


def fill_workspace(value: Any, workspace: Path) -> Any:
    """`value` (a rule's table, or any part of it) with `{workspace}`, `{workspace_glob}` and
    `{workspace_regex}` in its strings replaced by `workspace` (an absolute, resolved path): as it is, glob-
    escaped, regex-escaped."""
    return _fill(value, workspace)


def _fill(value: Any, workspace: Path) -> Any:
    if isinstance(value, str):
        # One pass, so that a workspace path that itself contains "{workspace}" is not filled in again.
        def replace(found: re.Match[str]) -> str:
            if found.group(1) == "_glob":
                return glob.escape(str(workspace))
            return regex_escape(str(workspace)) if found.group(1) else str(workspace)

        return _PLACEHOLDER.sub(replace, value)
    if isinstance(value, Mapping):
        return {key: _fill(item, workspace) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_fill(item, workspace) for item in value]
    return value
