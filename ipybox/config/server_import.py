"""The MCP servers of other clients' configurations, as `[servers.<name>]` tables of `ipybox.toml`: what
`ipybox server import` writes. Pure functions (they read the source files, nothing else).

Sources, each read into the same list of `SourceServer`s (name and entry, as the client wrote them):

- `.mcp.json` (Claude Code's project file), Claude Desktop's `claude_desktop_config.json`, Cursor's
  `.cursor/mcp.json` and the `mcpServers` of `~/.claude.json` (user scope, and this project's local scope
  under `projects`): an `mcpServers` object of `command`, `args`, `env`, `url`, `headers`, `type`;
- VS Code's `.vscode/mcp.json`: a `servers` object (same keys, plus `envFile`) and `inputs`; JSON with
  comments and trailing commas, as VS Code reads it;
- Codex's `config.toml`: `[mcp_servers.<name>]` with `command`, `args`, `env`, `env_vars`, `cwd`, `url`,
  `bearer_token_env_var`, `http_headers`, `env_http_headers`, `enabled`, `tool_timeout_sec`.

Contract of `plan_import`:

- Names: a name that is not a Python identifier (`my-server`, `my.server`, `2fa`) or is reserved for
  rules (`shell`, `ipybox`) gets the name `map_server_name` gives it (`my_server`): a server's name in
  ipybox is its package, `mcptools.<name>`, so `ipybox.toml` holds the mapped name, and so do rules,
  `ipybox server list` and the kernels' imports. Two source names that map to one name are refused
  (`ServerImportError` naming both). A server whose name (mapped) `ipybox.toml` has already is skipped,
  or replaced with `replace`.
- Placeholders: `${VAR}` stays; `${env:VAR}` (VS Code, Cursor) and `${VAR:-default}` (Claude Code; the
  default is dropped, with a note) become `${VAR}`; `${workspaceFolder}` (VS Code, Cursor) and
  `${CLAUDE_PROJECT_DIR}` (Claude Code) become `${IPYBOX_WORKSPACE}`, `${userHome}` becomes `${HOME}`;
  VS Code's `${input:id}` (a value VS Code prompts for) becomes `${ID}`, with a note to set it in `.env`.
  In VS Code's format a bare `${name}` is one of VS Code's own variables, not an environment variable:
  any other than those above skips the server, as does any other `${...}` form, saying which.
- Secrets: a literal value under a name that names a secret (`names_a_secret`: `*_TOKEN`, `API_KEY`,
  `Authorization`, ...) in `env` or `headers`, or given to such an option in `args` (`--api-key X`,
  `--token=X`), is not copied into `ipybox.toml` (a file meant to be committed): it becomes `${VAR}`,
  and the value goes to `dotenv`, the variables to add to the workspace's `.env` (git-ignored), where
  placeholders are filled in from on the host. A variable name already set to another value (in `.env` or
  the environment, which wins over `.env`) is not reused.
- Each table is validated with the one server model (`parse_server_section`); a server it refuses (e.g.
  `command` with `type = "http"`) is skipped with the model's reason, as are servers ipybox can't run
  (an OAuth-only entry, a form it doesn't know). Nothing is refused silently: every source server is
  either in `servers` or in `skipped`, and every key that was dropped is in a note.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import ValidationError

from ipybox.config.servers import (
    RESERVED_SERVER_NAMES,
    StdioServerSection,
    map_server_name,
    parse_server_section,
)
from ipybox.errors import IpyboxError
from ipybox.mcp_client.params import describe_problems, dump_server_params
from ipybox.rules.audit import names_a_secret

__all__ = [
    "SOURCES",
    "ImportPlan",
    "ImportedServer",
    "ServerImportError",
    "SkippedServer",
    "SourceKind",
    "SourceServer",
    "parse_source",
    "plan_import",
    "read_source",
    "source_paths",
]

SourceKind = Literal["claude-code", "claude-desktop", "codex", "cursor", "vscode"]
SOURCES: Final[tuple[SourceKind, ...]] = ("claude-code", "claude-desktop", "codex", "cursor", "vscode")
"""The clients `--from` names."""

Format = Literal["mcpServers", "vscode", "codex", "claude.json"]


class ServerImportError(IpyboxError, ValueError):
    """Nothing was imported: `str(error)` says why and what to do."""


@dataclass(frozen=True)
class SourceServer:
    """One server as a client's configuration has it.

    Attributes:
        name: Its name there.
        entry: Its entry (the JSON object, or the TOML table).
        format: The file's format: `mcpServers` (`.mcp.json`, Claude Desktop, Cursor), `vscode`,
            `codex`, or `claude.json` (`~/.claude.json`).
        source: The file it came from.
    """

    name: str
    entry: Any
    format: Format
    source: Path


@dataclass(frozen=True)
class ImportedServer:
    """A server as it will be written.

    Attributes:
        original: Its name in the source.
        name: Its name in ipybox (`[servers.<name>]`, `mcptools.<name>`).
        transport: `stdio`, `streamable_http` or `sse`.
        table: Its `[servers.<name>]` table (placeholders kept).
        dotenv: Variables to add to `.env` for it (literal secrets taken out of the table).
        notes: What was changed or dropped on the way, one sentence each.
        source: The file it came from.
    """

    original: str
    name: str
    transport: str
    table: dict[str, Any]
    dotenv: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    source: Path | None = None


@dataclass(frozen=True)
class SkippedServer:
    """A server that is not imported, and why (one sentence)."""

    original: str
    reason: str


@dataclass(frozen=True)
class ImportPlan:
    """What `ipybox server import` writes: `servers` into `ipybox.toml`, `dotenv` into `.env`."""

    servers: list[ImportedServer]
    skipped: list[SkippedServer]

    @property
    def dotenv(self) -> dict[str, str]:
        """Every variable to add to `.env`."""
        return {key: value for server in self.servers for key, value in server.dotenv.items()}


# Where clients keep their configuration


def source_paths(kind: SourceKind, workspace: Path, *, home: Path | None = None) -> list[Path]:
    """The files `--from kind` reads, in order: for `claude-code` each that exists (the project's
    `.mcp.json`, then `~/.claude.json`), for the others the first that exists.

    Raises:
        ServerImportError: None of them exists (the message names every path tried).
    """
    home = Path.home() if home is None else home
    candidates: list[Path]
    if kind == "claude-code":
        candidates = [workspace / ".mcp.json", home / ".claude.json"]
    elif kind == "claude-desktop":
        if sys.platform == "darwin":
            candidates = [home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"]
        elif sys.platform == "win32":
            appdata = Path(os.environ.get("APPDATA", home / "AppData" / "Roaming"))
            candidates = [appdata / "Claude" / "claude_desktop_config.json"]
        else:
            config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
            candidates = [config / "Claude" / "claude_desktop_config.json"]
    elif kind == "codex":
        codex_home = os.environ.get("CODEX_HOME")
        candidates = [Path(codex_home) / "config.toml" if codex_home else home / ".codex" / "config.toml"]
    elif kind == "cursor":
        candidates = [workspace / ".cursor" / "mcp.json", home / ".cursor" / "mcp.json"]
    else:
        user = (
            home / "Library" / "Application Support" / "Code" / "User"
            if sys.platform == "darwin"
            else Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "Code" / "User"
        )
        candidates = [workspace / ".vscode" / "mcp.json", user / "mcp.json"]
    found = [path for path in candidates if path.is_file()]
    if not found:
        tried = ", ".join(str(path) for path in candidates)
        raise ServerImportError(
            f"--from {kind}: no configuration found (tried {tried}); give the file instead: "
            "`ipybox server import FILE`"
        )
    return found if kind == "claude-code" else found[:1]


def read_source(path: Path, *, workspace: Path | None = None) -> list[SourceServer]:
    """The servers of the configuration file `path`, its format told from its content.

    Args:
        path: The file.
        workspace: For `~/.claude.json`: the project whose local-scope servers are read too.

    Raises:
        ServerImportError: It can't be read, or is not a configuration of MCP servers.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ServerImportError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ServerImportError(f"{path} can't be read ({getattr(e, 'strerror', None) or e})") from None
    return parse_source(text, path, workspace=workspace)


def parse_source(text: str, path: Path, *, workspace: Path | None = None) -> list[SourceServer]:
    """The servers of a configuration file's `text` (see `read_source`)."""
    if path.suffix == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ServerImportError(f"{path} is not valid TOML: {e}") from None
        servers = data.get("mcp_servers")
        if not isinstance(servers, dict):
            raise ServerImportError(f"{path} has no [mcp_servers.<name>] tables (Codex's format)")
        return [SourceServer(name, entry, "codex", path) for name, entry in servers.items()]
    try:
        data = json.loads(_strip_jsonc(text))
    except json.JSONDecodeError as e:
        raise ServerImportError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise ServerImportError(f"{path} is not a JSON object with mcpServers or servers")
    if path.name == ".claude.json" or ("projects" in data and "mcpServers" not in data):
        return _claude_json(data, path, workspace)
    if isinstance(data.get("mcpServers"), dict):
        return [SourceServer(n, e, "mcpServers", path) for n, e in data["mcpServers"].items()]
    if isinstance(data.get("servers"), dict):
        found = [SourceServer(n, e, "vscode", path) for n, e in data["servers"].items()]
        inputs = data.get("inputs")
        return [SourceServer(s.name, _with_inputs(s.entry, inputs), "vscode", path) for s in found]
    raise ServerImportError(
        f"{path} has neither an mcpServers object (.mcp.json, Claude Desktop, Cursor) nor a servers "
        "object (VS Code)"
    )


def _claude_json(data: dict[str, Any], path: Path, workspace: Path | None) -> list[SourceServer]:
    # Claude Code: a project's local scope (`projects[<dir>].mcpServers`) wins over the user scope.
    found: dict[str, SourceServer] = {}
    projects = data.get("projects")
    if workspace is not None and isinstance(projects, dict):
        project = projects.get(str(workspace))
        if isinstance(project, dict) and isinstance(project.get("mcpServers"), dict):
            for name, entry in project["mcpServers"].items():
                found[name] = SourceServer(name, entry, "claude.json", path)
    user = data.get("mcpServers")
    if isinstance(user, dict):
        for name, entry in user.items():
            found.setdefault(name, SourceServer(name, entry, "claude.json", path))
    return list(found.values())


_INPUTS_KEY: Final = "\0inputs"  # where a VS Code entry carries the file's `inputs` (not a real key)


def _with_inputs(entry: Any, inputs: Any) -> Any:
    if isinstance(entry, dict) and isinstance(inputs, list):
        return {**entry, _INPUTS_KEY: inputs}
    return entry


def _strip_jsonc(text: str) -> str:
    """`text` without `//` and `/* */` comments and trailing commas (outside strings), as VS Code reads
    its JSON files; line and column numbers are kept (comments become spaces)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == '"':
            end = i + 1
            while end < n and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(text[i : end + 1])
            i = end + 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end == -1 else end
            out.append(" " * (end - i))
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end == -1 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        else:
            out.append(char)
            i += 1
    return re.sub(r",(\s*[}\]])", r" \1", "".join(out))


# From a client's entry to ipybox's table


_PLACEHOLDER_ANY: Final = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFAULT: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):-(.*)", re.DOTALL)
# Directories other clients fill in: the project (the workspace, when it is imported from there) and home.
_PREDEFINED: Final = {
    "workspaceFolder": "IPYBOX_WORKSPACE",
    "CLAUDE_PROJECT_DIR": "IPYBOX_WORKSPACE",
    "userHome": "HOME",
}
_EDITOR_VARIABLES: Final = frozenset(
    {"workspaceFolderBasename", "pathSeparator", "file", "fileDirname", "cwd", "execPath", "relativeFile"}
)
_AUTH_KEYS: Final = ("oauth", "auth")


class _Skip(Exception):
    """The server is not imported: the message says why."""


@dataclass
class _Conversion:
    name: str
    format: Format
    inputs: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def placeholders(self, value: str, where: str) -> str:
        """`value` with the client's placeholders in ipybox's form."""

        def replace(match: re.Match[str]) -> str:
            inner = match.group(1)
            if inner in _PREDEFINED:
                self.notes.append(f"{where}: ${{{inner}}} became ${{{_PREDEFINED[inner]}}}")
                return f"${{{_PREDEFINED[inner]}}}"
            # VS Code's `${name}` is one of its own variables (an environment variable is `${env:NAME}`);
            # elsewhere it is an environment variable, except for the editor variables Cursor fills in too.
            if _ENV_NAME.fullmatch(inner) and self.format != "vscode" and inner not in _EDITOR_VARIABLES:
                return match.group(0)
            if inner.startswith("env:") and _ENV_NAME.fullmatch(inner[4:]):
                return f"${{{inner[4:]}}}"
            if (default := _DEFAULT.fullmatch(inner)) is not None:
                self.notes.append(
                    f"{where}: ${{{inner}}} became ${{{default.group(1)}}} (ipybox has no defaults: set "
                    f"{default.group(1)} in .env, e.g. to {default.group(2)!r})"
                )
                return f"${{{default.group(1)}}}"
            if inner.startswith("input:"):
                variable = _variable_name(inner[6:])
                prompt = self.inputs.get(inner[6:])
                what = f" ({prompt})" if prompt else ""
                self.notes.append(
                    f"{where}: ${{{inner}}} is asked for by VS Code{what}; ipybox reads ${{{variable}}} "
                    f"instead: set {variable} in .env"
                )
                return f"${{{variable}}}"
            raise _Skip(f"{where} uses ${{{inner}}}, which ipybox can't fill in; add it by hand")

        return _PLACEHOLDER_ANY.sub(replace, value)


def _variable_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").upper() or "VALUE"
    return f"_{name}" if name[0].isdigit() else name


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Skip(f"{where} is not a list of strings")
    return list(value)


def _mapping(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _Skip(f"{where} is not an object of strings")
    result: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise _Skip(f"{where}.{key} is not a string")
        result[str(key)] = str(item)
    return result


def _table(server: SourceServer, conversion: _Conversion) -> dict[str, Any]:
    """The server's `[servers.<name>]` table, placeholders converted (secrets still literal)."""
    entry = server.entry
    if not isinstance(entry, dict):
        raise _Skip("its entry is not an object")
    if server.format == "codex":
        return _codex_table(entry, conversion)
    entry = dict(entry)
    if isinstance(entry.get("transport"), dict):  # an older Claude Code form: {"transport": {type, url, ...}}
        entry = {**entry.pop("transport"), **entry}
    known = {"command", "args", "env", "url", "headers", "type", "cwd", "disabled", "envFile", _INPUTS_KEY}
    for key in _AUTH_KEYS:
        if key in entry:
            raise _Skip(f"it signs in with {key!r} (OAuth), which ipybox does not do; give a token header")
    table: dict[str, Any] = {}
    convert = conversion.placeholders
    if "command" in entry:
        if not isinstance(entry["command"], str):
            raise _Skip("command is not a string")
        table["command"] = convert(entry["command"], "command")
    if "args" in entry:
        args = [convert(arg, f"args {i + 1}") for i, arg in enumerate(_strings(entry["args"], "args"))]
        if args:
            table["args"] = args
    if "env" in entry:
        env = {k: convert(v, f"env {k}") for k, v in _mapping(entry["env"], "env").items()}
        if env:
            table["env"] = env
    if "cwd" in entry:
        if not isinstance(entry["cwd"], str):
            raise _Skip("cwd is not a string")
        table["cwd"] = convert(entry["cwd"], "cwd")
    if "url" in entry:
        if not isinstance(entry["url"], str):
            raise _Skip("url is not a string")
        table["url"] = convert(entry["url"], "url")
    if "headers" in entry:
        headers = {k: convert(v, f"headers {k}") for k, v in _mapping(entry["headers"], "headers").items()}
        if headers:
            table["headers"] = headers
    if "type" in entry:
        kind = entry["type"]
        # `stdio` next to `command` says nothing more; other values are checked by the server model.
        if not (isinstance(kind, str) and kind.lower() == "stdio" and "command" in entry):
            table["type"] = kind
    if entry.get("disabled") is True:
        table["enabled"] = False
    if "envFile" in entry:
        conversion.notes.append(
            f"envFile {entry['envFile']!r} was not imported: the server gets only its env, so put the "
            "variables it needs into env (as ${VAR}) and .env"
        )
    ignored = sorted(key for key in entry if key not in known)
    if ignored:
        conversion.notes.append(f"ignored {', '.join(ignored)} (not an ipybox setting)")
    return table


def _codex_table(entry: dict[str, Any], conversion: _Conversion) -> dict[str, Any]:
    table: dict[str, Any] = {}
    convert = conversion.placeholders
    known = {"command", "args", "env", "env_vars", "cwd", "url", "bearer_token_env_var", "http_headers"}
    known |= {"env_http_headers", "enabled", "tool_timeout_sec", "startup_timeout_sec", "startup_timeout_ms"}
    if "bearer_token" in entry:
        raise _Skip("it has a literal bearer_token; give bearer_token_env_var instead (as Codex asks too)")
    if isinstance(entry.get("command"), str):
        table["command"] = convert(entry["command"], "command")
    if "args" in entry:
        args = [convert(arg, f"args {i + 1}") for i, arg in enumerate(_strings(entry["args"], "args"))]
        if args:
            table["args"] = args
    env = {k: convert(v, f"env {k}") for k, v in _mapping(entry.get("env", {}), "env").items()}
    for variable in _strings(
        entry.get("env_vars", []), "env_vars"
    ):  # passed through from Codex's environment
        env.setdefault(variable, f"${{{variable}}}")
    if env:
        table["env"] = env
    if isinstance(entry.get("cwd"), str):
        table["cwd"] = convert(entry["cwd"], "cwd")
    if isinstance(entry.get("url"), str):
        table["url"] = convert(entry["url"], "url")
    headers = {
        k: convert(v, f"http_headers {k}") for k, v in _mapping(entry.get("http_headers", {}), "").items()
    }
    for header, variable in _mapping(entry.get("env_http_headers", {}), "env_http_headers").items():
        headers[header] = f"${{{variable}}}"
    if isinstance(entry.get("bearer_token_env_var"), str):
        headers["Authorization"] = f"Bearer ${{{entry['bearer_token_env_var']}}}"
    if headers:
        table["headers"] = headers
    if entry.get("enabled") is False:
        table["enabled"] = False
    timeout = entry.get("tool_timeout_sec")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        table["call_timeout"] = timeout
    ignored = sorted(key for key in entry if key not in known)
    if ignored:
        conversion.notes.append(f"ignored {', '.join(ignored)} (not an ipybox setting)")
    return table


# Secrets


_SECRET_OPTION: Final = re.compile(r"--?([A-Za-z0-9_-]+)(?:=(.*))?", re.DOTALL)


@dataclass
class _Secrets:
    """Chooses `.env` variables for literal secrets: a name is reused only for the same value."""

    taken: dict[str, str]  # variable -> value, in `.env` and the environment (the environment wins)
    chosen: dict[str, str] = field(default_factory=dict)  # variable -> value, added by this import

    def variable(self, preferred: str, value: str) -> str:
        candidate, suffix = preferred, 2
        while True:
            existing = self.chosen.get(candidate, self.taken.get(candidate))
            if existing is None or existing == value:
                self.chosen[candidate] = value
                return candidate
            candidate, suffix = f"{preferred}_{suffix}", suffix + 1


def _literal(value: str) -> bool:
    return bool(value) and _PLACEHOLDER_ANY.search(value) is None


def _take_out_secrets(
    name: str, table: dict[str, Any], secrets: _Secrets, notes: list[str]
) -> dict[str, str]:
    """Replace literal secrets in `table` by `${VAR}`; the variables and their values."""
    prefix = name.upper()
    moved: dict[str, str] = {}

    def move(preferred: str, value: str, where: str) -> str:
        variable = secrets.variable(preferred, value)
        moved[variable] = value
        notes.append(f"{where}: the literal value was moved to .env as {variable}")
        return f"${{{variable}}}"

    env = table.get("env", {})
    for key, value in env.items():
        if names_a_secret(key) and _literal(value):
            env[key] = move(_variable_name(key), value, f"env {key}")
    headers = table.get("headers", {})
    for key, value in headers.items():
        if names_a_secret(key) and _literal(value):
            scheme, _, credential = value.partition(" ")
            if credential and scheme.lower() in ("bearer", "basic", "token"):
                headers[key] = f"{scheme} " + move(f"{prefix}_TOKEN", credential, f"headers {key}")
            else:
                headers[key] = move(f"{prefix}_{_variable_name(key)}", value, f"headers {key}")
    args = table.get("args", [])
    for i, arg in enumerate(args):
        option = _SECRET_OPTION.fullmatch(arg)
        before = _SECRET_OPTION.fullmatch(args[i - 1]) if i else None
        if option is not None and option.group(2) is not None:  # --token=VALUE
            if names_a_secret(option.group(1)) and _literal(option.group(2)):
                preferred = f"{prefix}_{_variable_name(option.group(1))}"
                args[i] = f"--{option.group(1)}=" + move(preferred, option.group(2), f"args {i + 1}")
        elif (  # --token VALUE
            before is not None
            and before.group(2) is None
            and names_a_secret(before.group(1))
            and option is None
            and _literal(arg)
        ):
            args[i] = move(f"{prefix}_{_variable_name(before.group(1))}", arg, f"args {i + 1}")
    return moved


# The plan


def plan_import(
    servers: Iterable[SourceServer],
    *,
    existing: Iterable[str] = (),
    only: Iterable[str] | None = None,
    replace: bool = False,
    sandbox: bool = False,
    dotenv: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ImportPlan:
    """What to write for `servers` into a workspace whose `ipybox.toml` has the servers `existing`.

    Args:
        servers: The source's servers (`read_source`).
        existing: The servers `ipybox.toml` has now.
        only: Import only these (source names or ipybox names); an unknown one is an error.
        replace: Replace servers `ipybox.toml` has already (else they are skipped).
        sandbox: Write `sandbox = true` for stdio servers (as `ipybox server add` does in a workspace
            whose kernels are sandboxed).
        dotenv: The workspace's `.env` variables now.
        environ: The environment (default `os.environ`): a variable set there wins over `.env`.

    Raises:
        ServerImportError: Two source names map to one ipybox name, or `only` names an unknown server.
    """
    servers = list(servers)
    environ = os.environ if environ is None else environ
    existing = set(existing)
    names: dict[str, str] = {}
    by_name: dict[str, str] = {}
    for server in servers:
        mapped = map_server_name(server.name)
        if mapped in by_name and by_name[mapped] != server.name:
            raise ServerImportError(
                f"{by_name[mapped]!r} and {server.name!r} would both be the server {mapped!r} in ipybox (a "
                "server's name is its Python package, mcptools.<name>); import one of them with --only, or "
                "rename one in the source"
            )
        names[server.name], by_name[mapped] = mapped, server.name
    if only is not None:
        wanted = set(only)
        unknown = sorted(wanted - set(names) - set(names.values()))
        if unknown:
            known = ", ".join(sorted(names)) or "none"
            raise ServerImportError(
                f"--only {', '.join(unknown)}: no such server in the source (it has {known})"
            )
        servers = [s for s in servers if s.name in wanted or names[s.name] in wanted]
    secrets = _Secrets({**dict(dotenv or {}), **dict(environ)})
    imported: list[ImportedServer] = []
    skipped: list[SkippedServer] = []
    for server in servers:
        name = names[server.name]
        if name in existing and not replace:
            mapped = f" ({server.name!r} maps to it)" if name != server.name else ""
            skipped.append(
                SkippedServer(
                    server.name, f"ipybox.toml has a server {name!r}{mapped} already (--force replaces it)"
                )
            )
            continue
        inputs = _input_prompts(server.entry)
        conversion = _Conversion(name, server.format, inputs)
        try:
            table = _table(server, conversion)
            if sandbox and "command" in table and "url" not in table:
                table["sandbox"] = True
            try:
                parsed = parse_server_section(table)
            except ValidationError as e:
                raise _Skip(describe_problems(e.errors())) from None
            table = dump_server_params(parsed)
        except _Skip as e:
            skipped.append(SkippedServer(server.name, str(e)))
            continue
        moved = _take_out_secrets(name, table, secrets, conversion.notes)
        transport = "stdio" if isinstance(parsed, StdioServerSection) else parsed.transport
        if name != server.name:
            reason = (
                "is reserved for rules"
                if server.name in RESERVED_SERVER_NAMES
                else "is not a Python identifier"
            )
            conversion.notes.insert(
                0, f"named {name} (its package mcptools.{name}): {server.name!r} {reason}"
            )
        imported.append(
            ImportedServer(server.name, name, transport, table, moved, tuple(conversion.notes), server.source)
        )
    return ImportPlan(imported, skipped)


def _input_prompts(entry: Any) -> dict[str, str]:
    if not isinstance(entry, dict) or not isinstance(entry.get(_INPUTS_KEY), list):
        return {}
    return {
        str(item["id"]): str(item.get("description", ""))
        for item in entry[_INPUTS_KEY]
        if isinstance(item, dict) and "id" in item
    }
