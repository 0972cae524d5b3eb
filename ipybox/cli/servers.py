"""`ipybox server add / remove / list`: a workspace's MCP servers, from the command line.

```
ipybox server add NAME [--sandbox | --no-sandbox] [--env K=V]... [--cwd DIR] [--disabled] -- COMMAND ARGS...
ipybox server add NAME --url URL [-H 'K: V']... [--transport streamable_http|sse]
ipybox server remove NAME
ipybox server list
ipybox server import FILE | --from claude-code|claude-desktop|codex|cursor|vscode [--only NAME...] [--dry-run]
```

All take `-w/--workspace DIR` (default `.`: the positional arguments are the server's name and command)
and `--json`.

Contract:

- The parameters are checked with the one server-parameters model (`ipybox.config.servers`, as
  `register_mcp_server` checks them), its problems named by the option that gave the value; the table is
  written by `ipybox.config.server_writer` (the rest of `ipybox.toml` kept byte for byte, validated with
  the real loader, atomically). Nothing is written when anything is wrong, and then the command says what
  in one line and exits 1.
- As for `register_mcp_server`, a stdio server in a workspace whose kernels are sandboxed is written
  `sandbox = true` unless `--no-sandbox` is given. Unlike an MCP client, the person at the terminal may
  give `--no-sandbox` there: it is written `sandbox = false`, and the command says the server runs
  unsandboxed.
- `${VAR}` placeholders are written as given (filled in on the host when the server starts, never
  inside a kernel); one whose variable is set neither in this environment nor in the workspace's `.env`
  is a warning, not an error (it may be set where the workspace runs). A value under a secret's name
  (`--env GITHUB_TOKEN=...`, `--header 'Authorization: ...'`) given literally gets a one-line hint that
  a placeholder keeps it out of the file.
- A server of that name is replaced only with `--force`.
- Names as other clients write them (`my-server`, `my.server`) are taken and mapped to the server's name
  in ipybox (`my_server`: the name of its package, `mcptools.my_server`), which is what `ipybox.toml`
  holds and rules and kernels use; the command says so once (`map_server_name`).
- `import` reads another client's configuration (`ipybox.config.server_import`) and writes every server
  it can run in one edit of `ipybox.toml` (all or none), literal secrets into `.env` (written first, and
  put back as it was if `ipybox.toml` can't be written; `.gitignore` made to ignore `.env`); it prints
  what it imported (source name -> ipybox name, transport) and what it skipped and why, and exits 1 when
  a server was skipped for anything but being there already, or failed to start.
- When the workspace is up, the command waits for it to apply the file (`ControlClient.apply_server`,
  its steps drawn by `progress_on_terminal` on a terminal) and prints the generated modules, or the
  error and exits 1. The server then stays in `ipybox.toml`, as `claude mcp add` keeps what it added, and
  the command says how to fix or remove it.
- `--json` prints one JSON document on standard output (`ServerChangeReport`, `ServerListing`: dataclasses
  dumped) and draws no progress; warnings and errors still go to standard error.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from ipybox.cli.options import add_workspace_option, workspace_of
from ipybox.display_text import printable

if TYPE_CHECKING:
    from pydantic import ValidationError

    from ipybox.config import WorkspaceConfig
    from ipybox.progress import Progress
    from ipybox.running.status import ServerOutcome, WorkspaceStatus

EXIT_ERROR = 1

# `ipybox.config.server_import.SOURCES`, spelled out: importing it would load pydantic for every command.
SOURCES = ("claude-code", "claude-desktop", "codex", "cursor", "vscode")

# What a key of a server's table is called on the command line, for the model's messages.
_OPTIONS = {
    "command": "COMMAND",
    "args": "ARGS",
    "env": "--env",
    "cwd": "--cwd",
    "sandbox": "--sandbox",
    "url": "--url",
    "headers": "--header",
    "type": "--transport",
    "enabled": "--disabled",
}
_ADD_USAGE = (
    "ipybox server add NAME [-w DIR] [--sandbox | --no-sandbox] [--env K=V]... [--cwd DIR] [--disabled] "
    "[--force] [--json] -- COMMAND [ARGS...]\n"
    "       ipybox server add NAME [-w DIR] --url URL [-H 'K: V']... [--transport "
    "streamable_http|sse] [--disabled] [--force] [--json]"
)


class _Refused(Exception):
    """Bad input or a state the command can't act in: one line, exit 1."""


@dataclass(frozen=True)
class ServerChangeReport:
    """What `ipybox server add --json` and `ipybox server remove --json` print.

    Attributes:
        name: The server.
        action: `added`, `replaced` or `removed`.
        config: The `ipybox.toml` written.
        line: The line of its `[servers.<name>]` (where it was, for `removed`).
        server: The table written (`None` for `removed`).
        running: Whether the workspace was up, so that it applied the change.
        outcome: The workspace's `ServerOutcome` (as `ipybox.running.status` dumps it) when it was up.
        modules: The modules generated for it (`mcptools.<name>.<module>`), when it is ready.
        ok: Whether the change took effect (`False`: the server is in the file but failed to start).
        warnings: Warnings and hints, as also printed on standard error.
    """

    name: str
    action: Literal["added", "replaced", "removed"]
    config: str
    line: int | None
    server: dict[str, Any] | None
    running: bool
    outcome: dict[str, Any] | None
    modules: list[str]
    ok: bool
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ServerEntry:
    """One server of `ipybox server list`.

    Attributes:
        name: Its name (`[servers.<name>]`).
        enabled: Whether the workspace uses it (`enabled = false` keeps it in the file only).
        kind: `stdio` (a command ipybox starts) or `url` (a remote server).
        command: The stdio server's command and arguments.
        url: The remote server's URL.
        transport: The remote server's transport (`streamable_http` or `sse`).
        sandboxed: Whether ipybox runs it in a sandbox (never for a remote server).
        line: Where its table starts in `ipybox.toml`.
        state: With the workspace up: `ready`, `starting`, `failed`, `disabled` or `not started` (not
            applied yet, or `ipybox.toml` has an error); `None` when the workspace is not up.
        tools: Tools in its generated package, when it has one.
        error: Why it failed, when it did.
    """

    name: str
    enabled: bool
    kind: Literal["stdio", "url"]
    command: list[str] | None
    url: str | None
    transport: str | None
    sandboxed: bool
    line: int | None
    state: str | None
    tools: int | None
    error: str | None


@dataclass(frozen=True)
class ServerListing:
    """What `ipybox server list --json` prints.

    Attributes:
        workspace: The workspace directory.
        running: Whether the workspace is up (then each server has its `state`).
        servers: The servers of `ipybox.toml`, in the order written.
        config_error: With the workspace up: why the file it watches does not load now (the last good
            configuration keeps running), else `None`.
    """

    workspace: str
    running: bool
    servers: list[ServerEntry]
    config_error: str | None = None


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`argv` of `ipybox server ...` cut at its first `--`: the arguments for argparse, and the server's
    command after it (`None` when there is no `--`, or it is another command).

    Argparse (3.11) takes a `--` after a sub-command's options for an unknown argument and drops the
    command's own `--`s, so the command is taken out before it parses.
    """
    if argv[:1] != ["server"] or "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `server add/remove/list` to the `ipybox` command's sub-commands."""
    server = commands.add_parser("server", help="add, remove and list the workspace's MCP servers")
    verbs = server.add_subparsers(dest="server_command", metavar="COMMAND", required=True)
    add = verbs.add_parser(
        "add",
        help="add an MCP server to ipybox.toml (and, when the workspace is up, start it)",
        usage=_ADD_USAGE,
        description="Write [servers.NAME] into the workspace's ipybox.toml. A stdio server's command "
        "comes after --; a remote server is given by --url. Values may be ${VAR} placeholders, filled in "
        "from the environment or the workspace's .env when the server starts.",
    )
    add.add_argument("name", metavar="NAME", help="the server's name: its package is mcptools.NAME")
    # `dest` is not `command`: the `ipybox` parser keeps the sub-command there.
    add.add_argument("server_argv", nargs="*", metavar="COMMAND", help=argparse.SUPPRESS)
    add.add_argument("--url", help="a remote server's URL (streamable HTTP or SSE)")
    add.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'K: V'",
        help="an HTTP header for a --url server (repeatable), e.g. 'Authorization: Bearer ${TOKEN}'",
    )
    add.add_argument(
        "--transport",
        metavar="streamable_http|sse",
        help="a --url server's transport (default: sse when the URL path contains /sse)",
    )
    add.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="an environment variable for a stdio server (repeatable), e.g. GITHUB_TOKEN='${GITHUB_TOKEN}'",
    )
    add.add_argument(
        "--cwd", metavar="DIR", help="a stdio server's working directory (relative to the workspace)"
    )
    add.add_argument(
        "--sandbox",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run a stdio server in a sandbox of its own (default: when the workspace's kernels are "
        "sandboxed)",
    )
    add.add_argument("--disabled", action="store_true", help="write it with enabled = false (not started)")
    add.add_argument("--force", action="store_true", help="replace a server of that name")
    remove = verbs.add_parser("remove", help="remove an MCP server from ipybox.toml (and its package)")
    remove.add_argument("name", metavar="NAME", help="the server's name")
    listing = verbs.add_parser("list", help="list the MCP servers of ipybox.toml (and their state when up)")
    importing = verbs.add_parser(
        "import",
        help="add the MCP servers of another client's configuration (.mcp.json, Claude, Codex, Cursor, "
        "VS Code) to ipybox.toml",
        usage="ipybox server import (FILE | --from CLIENT) [-w DIR] [--only NAME...] [--dry-run] [--force] "
        "[--json]",
        description="Read the MCP servers of an .mcp.json, claude_desktop_config.json, .cursor/mcp.json, "
        ".vscode/mcp.json or Codex config.toml and write them into the workspace's ipybox.toml in one "
        "edit (comments and layout kept; all or nothing). Names that are not Python identifiers are "
        "mapped (my-server -> my_server: a server's name is its package, mcptools.my_server). Literal "
        "secrets (tokens in env, headers or arguments) are written to the workspace's .env, which "
        "ipybox.toml refers to as ${VAR}; ${env:VAR} and ${VAR:-default} become ${VAR}. Servers "
        "ipybox.toml has already are skipped unless --force.",
    )
    importing.add_argument(
        "file", nargs="?", type=Path, metavar="FILE", help="the configuration file to read (or use --from)"
    )
    importing.add_argument(
        "--from",
        dest="source",
        choices=SOURCES,
        metavar="CLIENT",
        help="read the client's own configuration: claude-code (.mcp.json in the workspace, then "
        "~/.claude.json), claude-desktop (claude_desktop_config.json), codex ($CODEX_HOME/config.toml or "
        "~/.codex/config.toml), cursor (.cursor/mcp.json in the workspace, else ~/.cursor/mcp.json), "
        "vscode (.vscode/mcp.json in the workspace, else the user's mcp.json)",
    )
    importing.add_argument(
        "--only",
        nargs="+",
        action="extend",
        metavar="NAME",
        help="import only these servers (their names in the source, or in ipybox)",
    )
    importing.add_argument(
        "--dry-run", action="store_true", help="show what would be imported, and write nothing"
    )
    importing.add_argument("--force", action="store_true", help="replace servers ipybox.toml has already")
    for verb in (add, remove, listing, importing):
        add_workspace_option(verb)
        verb.add_argument("--json", action="store_true", help="machine-readable output, no progress")


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, command: list[str] | None) -> int:
    """Run `ipybox server <verb>`; `command` is what came after `--` (`split_command`)."""
    given = workspace_of(args, parser)
    directory = given.resolve()
    try:
        if command is not None and args.server_command != "add":
            raise _Refused(f"`ipybox server {args.server_command}` takes no command after --")
        if not directory.is_dir():
            raise _Refused(f"--workspace {given}: no such directory")
        if not (directory / "ipybox.toml").is_file():
            where = "" if given == Path(".") else f" -w {given}"
            raise _Refused(
                f"{directory} is not a workspace: it has no ipybox.toml (`ipybox init{where}` writes one)"
            )
        if args.server_command == "add":
            if command is not None and args.server_argv:
                raise _Refused(
                    f"give the server's command once: after -- (got {shlex.join(args.server_argv)!r} before it too)"
                )
            return _add(directory, args, command if command is not None else list(args.server_argv))
        if args.server_command == "remove":
            return _remove(directory, _mapped(args.name), as_json=args.json)
        if args.server_command == "import":
            return _import(directory, args)
        return _list(directory, as_json=args.json)
    except _Refused as e:
        _say(f"ipybox: {e}", file=sys.stderr)
        return EXIT_ERROR


def _say(text: str, *, file: TextIO | None = None) -> None:
    """Print a line of the human-readable output: server names, their errors and output, tool names come
    from ipybox.toml and the servers themselves, so they are shown escaped (`ipybox.display_text`)."""
    print(printable(text, lines=True), file=file if file is not None else sys.stdout)


# add


def _add(directory: Path, args: argparse.Namespace, command: list[str]) -> int:
    from ipybox.config import CONFIG_FILE, write_server

    config = _load(directory)
    name = _mapped(args.name)
    _check_name(name)
    table = _table(args, command, sandboxed_workspace=config.sandbox.enabled)
    notes = _notes(directory, name, table, sandboxed_workspace=config.sandbox.enabled)
    path = directory / CONFIG_FILE
    if not args.force and (line := _configured(path).get(name, -1)) != -1:
        at = f" (line {line})" if line is not None else ""
        given = f" (the name {args.name!r} maps to)" if name != args.name else ""
        raise _Refused(
            f"{path} has a server {name!r}{given} already{at}: --force replaces it, `ipybox server remove "
            f"{name}` removes it"
        )
    for note in notes:
        _say(f"ipybox: {note}", file=sys.stderr)
    edit = write_server(path, name, table, replace=args.force)
    disabled = table.get("enabled") is False
    if not args.json:
        into = "to" if edit.action == "added" else "in"
        _say(f"{edit.action} [servers.{name}] {into} {path}:{edit.line}" + (" (disabled)" * disabled))
    outcome = _apply(directory, name, quiet=args.json)
    modules = _modules(config, name) if outcome is not None and outcome.state == "ready" else []
    ok = outcome is None or outcome.state == "ready" or (disabled and outcome.state == "absent")
    if args.json:
        report = ServerChangeReport(
            name=name,
            action=edit.action,
            config=str(path),
            line=edit.line,
            server=table,
            running=outcome is not None,
            outcome=outcome.model_dump(mode="json") if outcome is not None else None,
            modules=modules,
            ok=ok,
            warnings=notes,
        )
        print(json.dumps(asdict(report), indent=2))
    elif outcome is None:
        start = (
            "it stays off until enabled = true"
            if disabled
            else f"`ipybox up` starts it and generates {_package(config, name)}"
        )
        _say(f"ipybox is not running in {directory}: {start}")
    elif ok and disabled:
        _say("it is disabled, so the workspace does not start it (set enabled = true to start it)")
    elif ok:
        package = _package(config, name)
        _say(f"{package}: {', '.join(modules)}")
        example = f"from {package} import {modules[0]}" if modules else f"import {package}"
        _say(
            f"  in the workspace's kernels: `{example}`; `import {package}; help({package})` lists its tools"
        )
    if not ok and outcome is not None:
        _say(f"ipybox: {_failure(path, name, outcome)}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _mapped(name: str) -> str:
    """The server's name in ipybox for `name` as given (`my-server` -> `my_server`), said once when it
    differs."""
    from ipybox.config.servers import RESERVED_SERVER_NAMES, map_server_name

    # A reserved name typed here is refused (`_check_name` says which to use), not renamed behind one's back.
    mapped = name if name in RESERVED_SERVER_NAMES else map_server_name(name)
    if mapped != name:
        _say(
            f"ipybox: {name!r} is the server {mapped!r} in ipybox: a server's name is its Python package "
            f"(mcptools.{mapped}), so ipybox.toml, rules and `ipybox server` use {mapped!r}",
            file=sys.stderr,
        )
    return mapped


def _check_name(name: str) -> None:
    from pydantic import TypeAdapter, ValidationError

    from ipybox.config.servers import ServerName

    try:
        TypeAdapter(ServerName).validate_python(name)
    except ValidationError as e:
        raise _Refused(e.errors()[0]["msg"].removeprefix("Value error, ")) from None


def _table(args: argparse.Namespace, command: list[str], *, sandboxed_workspace: bool) -> dict[str, Any]:
    """The server's table from the options, validated with the server model (and normalised by it)."""
    from pydantic import ValidationError

    from ipybox.config.servers import parse_server_section
    from ipybox.mcp_client.params import dump_server_params

    name: str = args.name
    stdio_only = [
        option
        for option, given in (
            ("--env", bool(args.env)),
            ("--cwd", args.cwd is not None),
            ("--sandbox" if args.sandbox else "--no-sandbox", args.sandbox is not None),
        )
        if given
    ]
    table: dict[str, Any]
    if args.url is not None:
        if command:
            raise _Refused(
                "give either --url URL (a remote server) or a command after -- (a stdio server), not both"
            )
        if stdio_only:
            raise _Refused(
                f"{stdio_only[0]} is for stdio servers (a command after --); a --url server takes --header "
                "and --transport"
            )
        table = {"url": args.url}
        if args.header:
            table["headers"] = _pairs(args.header, ":", "--header", "'Authorization: Bearer ${TOKEN}'")
        if args.transport is not None:
            table["type"] = args.transport
    else:
        if not command:
            raise _Refused(
                f"give the server's command after --, e.g. `ipybox server add {name} -- uvx mcp-server-time`, "
                "or --url URL for a remote server"
            )
        url_only = [
            option for option, given in (("--header", args.header), ("--transport", args.transport)) if given
        ]
        if url_only:
            raise _Refused(
                f"{url_only[0]} is for --url servers, and this is a stdio server (a command after --)"
            )
        table = {"command": command[0]}
        if command[1:]:
            table["args"] = command[1:]
        if args.env:
            table["env"] = _pairs(args.env, "=", "--env", "GITHUB_TOKEN='${GITHUB_TOKEN}'")
        if args.cwd is not None:
            table["cwd"] = args.cwd
        sandbox = args.sandbox if args.sandbox is not None else (True if sandboxed_workspace else None)
        if sandbox is not None:
            table["sandbox"] = sandbox
    if args.disabled:
        table["enabled"] = False
    try:
        section = parse_server_section(table)
    except ValidationError as e:
        raise _Refused(_problems(e)) from None
    dumped: dict[str, Any] = dump_server_params(section)
    return dumped


def _pairs(items: list[str], separator: str, option: str, example: str) -> dict[str, str]:
    form = "NAME=VALUE" if separator == "=" else "'NAME: VALUE'"
    pairs: dict[str, str] = {}
    for item in items:
        key, found, value = item.partition(separator)
        key = key.strip()
        if not found or not key:
            raise _Refused(f"{option} {item!r}: expected {form}, e.g. {option} {example}")
        if key in pairs:
            raise _Refused(f"{option} {key} is given twice")
        pairs[key] = value.strip() if separator == ":" else value
    return pairs


def _problems(error: ValidationError) -> str:
    from ipybox.mcp_client.params import problem_items

    problems = []
    for key, message in problem_items(error.errors()):
        first, _, rest = key.partition(".")  # named by the command-line option that gave it
        where = " ".join(part for part in (_OPTIONS.get(first, first), rest) if part)
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


# Commands that download the server's package when they start (a sandboxed server has no network).
_PACKAGE_RUNNERS = frozenset({"npx", "uvx", "pipx", "bunx", "pnpx", "dlx"})


def _notes(
    directory: Path,
    name: str,
    table: dict[str, Any],
    *,
    sandboxed_workspace: bool,
    also_set: Mapping[str, str] | None = None,
) -> list[str]:
    """Warnings about what was given: placeholders whose variables are set nowhere, secrets given
    literally, an unsandboxed server in a sandboxed workspace, a working directory that isn't there."""
    from dotenv import dotenv_values

    from ipybox.mcp_client.params import PLACEHOLDER
    from ipybox.rules.audit import names_a_secret

    dotenv_path = directory / ".env"
    dotenv = dotenv_values(dotenv_path) if dotenv_path.is_file() else {}
    known = {*os.environ, *(key for key, value in dotenv.items() if value is not None), "IPYBOX_WORKSPACE"}
    known |= set(also_set or ())
    notes = []
    for where, value in _strings(table):
        for match in PLACEHOLDER.finditer(value):
            if match.group(1) not in known:
                notes.append(
                    f"warning: ${{{match.group(1)}}} (in {where}) is set neither in this environment nor in "
                    f"{dotenv_path}: the server starts once it is set where the workspace runs"
                )
    for key, value in table.get("env", {}).items():
        if names_a_secret(key) and value and PLACEHOLDER.search(value) is None:
            notes.append(
                f"hint: --env {key} is written into ipybox.toml as given; --env {key}='${{{key}}}' with "
                f"{key} in {dotenv_path} keeps the secret out of the file"
            )
    for key, value in table.get("headers", {}).items():
        if names_a_secret(key) and value and PLACEHOLDER.search(value) is None:
            scheme = value.split(" ", 1)[0] + " " if " " in value else ""
            variable = f"{name.upper()}_TOKEN"
            notes.append(
                f"hint: --header {key} is written into ipybox.toml as given; --header '{key}: "
                f"{scheme}${{{variable}}}' with {variable} in {dotenv_path} keeps the secret out of the file"
            )
    if sandboxed_workspace and table.get("sandbox") is False:
        notes.append(
            "note: this workspace's kernels are sandboxed, and this server runs unsandboxed on the host "
            "(--no-sandbox)"
        )
    runner = Path(str(table.get("command", ""))).name
    if table.get("sandbox") not in (None, False) and runner in _PACKAGE_RUNNERS:
        notes.append(
            f"warning: {runner} fetches the server's package over the network when it starts, and a "
            f"sandboxed server has no network: install the server first and give its own command (e.g. "
            f"`pip install mcp-server-time`, then `-- mcp-server-time`), allow the hosts it needs under "
            f"[servers.{name}.sandbox] network.allowedDomains, or add it with --no-sandbox"
        )
    cwd = table.get("cwd")
    if isinstance(cwd, str) and PLACEHOLDER.search(cwd) is None and not (directory / cwd).is_dir():
        notes.append(f"warning: --cwd {cwd}: {directory / cwd} is not a directory (yet)")
    command = table.get("command")
    if isinstance(command, str) and PLACEHOLDER.search(command) is None:
        notes.extend(_command_note(directory, command, cwd if isinstance(cwd, str) else None))
    return notes


def _command_note(directory: Path, command: str, cwd: str | None) -> list[str]:
    """A warning when the command is not found where the server will look for it: a relative path is
    taken relative to the server's working directory (the workspace by default), not to where
    `ipybox server add` runs; a bare name is looked up on `PATH`."""
    import shutil

    from ipybox.mcp_client.params import PLACEHOLDER

    if "/" not in command:
        if shutil.which(command) is None:
            return [f"warning: COMMAND {command} is not on this PATH (the server starts once it is)"]
        return []
    if Path(command).is_absolute() or (cwd is not None and PLACEHOLDER.search(cwd) is not None):
        return []
    base = directory / cwd if cwd is not None else directory
    if (base / command).exists():
        return []
    here = Path(command).resolve()
    instead = f"; give {here}" if here.exists() else ""
    return [
        f"warning: COMMAND {command} is relative to the server's working directory {base}, where there is "
        f"no such file{instead}"
    ]


def _strings(table: dict[str, Any]) -> list[tuple[str, str]]:
    """Each string value of a server's table, with the option that gave it."""
    found: list[tuple[str, str]] = []
    for key, value in table.items():
        if isinstance(value, str):
            found.append((_OPTIONS.get(key, key), value))
        elif isinstance(value, list):
            found.extend(
                (f"{_OPTIONS.get(key, key)} {i + 1}", v) for i, v in enumerate(value) if isinstance(v, str)
            )
        elif isinstance(value, dict):
            found.extend((f"{_OPTIONS.get(key, key)} {k}", v) for k, v in value.items() if isinstance(v, str))
    return found


def _configured(path: Path) -> dict[str, int | None]:
    """The servers written in `path` and the line of each one's table (`None`: not known)."""
    import tomllib

    from ipybox.config.positions import key_positions

    text = path.read_text(encoding="utf-8")
    servers = tomllib.loads(text).get("servers")
    if not isinstance(servers, dict):
        return {}
    positions = key_positions(text)
    return {
        name: (positions[("servers", name)][0] if ("servers", name) in positions else None)
        for name in servers
    }


def _failure(path: Path, name: str, outcome: ServerOutcome) -> str:
    if outcome.state == "config_error":
        problems = "\n".join(f"  {problem}" for problem in outcome.problems)
        why = f"the workspace could not load it:\n{problems or outcome.error}\n"
    elif outcome.state == "absent":
        why = f"the workspace does not run it: {outcome.error or 'it is not among its enabled servers'}\n"
    else:
        why = f"the server failed to start: {outcome.error}\n"
    return (
        f"[servers.{name}] is in {path}, but {why}  Fix it there (or `ipybox server add {name} --force ...`), "
        f"or `ipybox server remove {name}` removes it."
    )


# import


@dataclass(frozen=True)
class ImportedEntry:
    """One server of `ipybox server import --json`.

    Attributes:
        original: Its name in the source.
        name: Its name in ipybox (`[servers.<name>]`, `mcptools.<name>`).
        transport: `stdio`, `streamable_http` or `sse`.
        action: `added` or `replaced` (`None` with `--dry-run`).
        line: The line of its table in `ipybox.toml` (`None` with `--dry-run`).
        server: Its table as written.
        dotenv: The variables written to `.env` for it (names only: the values are secrets).
        notes: What was changed on the way, and warnings.
        state: With the workspace up, its state once applied (`ready`, `failed`, ...), else `None`.
        error: Why it failed to start, when it did.
    """

    original: str
    name: str
    transport: str
    action: str | None
    line: int | None
    server: dict[str, Any]
    dotenv: list[str]
    notes: list[str]
    state: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class ImportReport:
    """What `ipybox server import --json` prints.

    Attributes:
        sources: The files read.
        config: The `ipybox.toml` written (or that would be, with `--dry-run`).
        dry_run: Whether nothing was written.
        imported: The servers imported.
        skipped: The servers not imported: `{"original", "reason"}`.
        dotenv: The `.env` written to, when secrets were moved there.
        gitignore: What was done to `.gitignore` so that it ignores `.env`, if anything.
        ok: Whether every server was imported (or was there already) and started, when the workspace is up.
    """

    sources: list[str]
    config: str
    dry_run: bool
    imported: list[ImportedEntry]
    skipped: list[dict[str, str]]
    dotenv: str | None
    gitignore: str | None
    ok: bool


def _import(directory: Path, args: argparse.Namespace) -> int:
    from dotenv import dotenv_values

    from ipybox.config import CONFIG_FILE, ServerWriteError
    from ipybox.config.server_import import ServerImportError, plan_import, read_source, source_paths
    from ipybox.config.server_writer import write_servers

    config = _load(directory)
    path = directory / CONFIG_FILE
    if (args.file is None) == (args.source is None):
        raise _Refused(
            "give the configuration to import: a FILE (e.g. .mcp.json) or --from CLIENT "
            f"({', '.join(SOURCES)}), not both"
        )
    dotenv_path = directory / ".env"
    try:
        paths = [args.file] if args.file is not None else source_paths(args.source, directory)
        found: dict[str, Any] = {}
        for source in paths:
            for entry in read_source(source, workspace=directory):
                found.setdefault(entry.name, entry)  # the project's .mcp.json wins over ~/.claude.json
        dotenv = dotenv_values(dotenv_path) if dotenv_path.is_file() else {}
        plan = plan_import(
            found.values(),
            existing=_configured(path),
            only=args.only,
            replace=args.force,
            sandbox=config.sandbox.enabled,
            dotenv={k: v for k, v in dotenv.items() if v is not None},
        )
    except ServerImportError as e:
        raise _Refused(str(e)) from None
    secrets = plan.dotenv
    notes = {
        server.name: [
            *server.notes,
            *_notes(
                directory,
                server.name,
                server.table,
                sandboxed_workspace=config.sandbox.enabled,
                also_set=secrets,
            ),
        ]
        for server in plan.servers
    }
    edits: dict[str, Any] = {}
    wrote_dotenv: str | None = None
    gitignore: str | None = None
    if plan.servers and not args.dry_run:
        restore = _write_dotenv(directory, secrets) if secrets else None
        try:
            written = write_servers(path, {s.name: s.table for s in plan.servers}, replace=args.force)
        except ServerWriteError as e:
            if restore is not None:
                restore()
            raise _Refused(str(e)) from None
        edits = {edit.name: edit for edit in written}
        if secrets:
            wrote_dotenv = str(dotenv_path)
            gitignore = _ignore_dotenv(directory)
    outcomes = {}
    if edits:
        for server in plan.servers:
            outcomes[server.name] = _apply(directory, server.name, quiet=args.json)
    entries = [
        ImportedEntry(
            original=server.original,
            name=server.name,
            transport=server.transport,
            action=edits[server.name].action if server.name in edits else None,
            line=edits[server.name].line if server.name in edits else None,
            server=server.table,
            dotenv=sorted(server.dotenv),
            notes=notes[server.name],
            state=_state(outcomes.get(server.name)),
            error=_error(outcomes.get(server.name)),
        )
        for server in plan.servers
    ]
    already = [s for s in plan.skipped if "already" in s.reason]
    failed = [
        e for e in entries if e.state is not None and e.state != "ready" and e.server.get("enabled", True)
    ]
    ok = len(already) == len(plan.skipped) and not failed
    if args.json:
        report = ImportReport(
            sources=[str(p) for p in paths],
            config=str(path),
            dry_run=args.dry_run,
            imported=entries,
            skipped=[{"original": s.original, "reason": s.reason} for s in plan.skipped],
            dotenv=wrote_dotenv,
            gitignore=gitignore,
            ok=ok,
        )
        print(json.dumps(asdict(report), indent=2))
        return 0 if ok else EXIT_ERROR
    _print_import(directory, path, paths, entries, plan.skipped, args.dry_run, wrote_dotenv)
    if gitignore is not None:
        _say(gitignore)
    return 0 if ok else EXIT_ERROR


def _state(outcome: ServerOutcome | None) -> str | None:
    return outcome.state if outcome is not None else None


def _error(outcome: ServerOutcome | None) -> str | None:
    if outcome is None or outcome.state == "ready":
        return None
    return outcome.error or "; ".join(str(problem) for problem in outcome.problems) or None


def _print_import(
    directory: Path,
    path: Path,
    paths: list[Path],
    entries: list[ImportedEntry],
    skipped: list[Any],
    dry_run: bool,
    dotenv: str | None,
) -> None:
    sources = ", ".join(str(p) for p in paths)
    count = f"{len(entries)} server{'s' * (len(entries) != 1)}"
    if dry_run:
        _say(f"would import {count} from {sources} into {path} (--dry-run: nothing written)")
    elif entries:
        _say(f"imported {count} from {sources} into {path}")
    else:
        _say(f"imported nothing from {sources}")
    width = max((len(e.original) for e in entries), default=0)
    named = max((len(e.name) for e in entries), default=0)
    for entry in entries:
        state = f"  {entry.state}" if entry.state is not None else ""
        line = f"  (line {entry.line})" if entry.line is not None else ""
        _say(f"  {entry.original:<{width}} -> {entry.name:<{named}}  {entry.transport}{line}{state}")
        for note in entry.notes:
            _say(f"  {'':<{width}}    {note}")
        if entry.error:
            _say(f"  {'':<{width}}    error: {entry.error}")
    if skipped:
        _say("skipped:")
        width = max(len(s.original) for s in skipped)
        for server in skipped:
            _say(f"  {server.original:<{width}}  {server.reason}")
    if dotenv:
        _say(f"secrets written to {dotenv} (git-ignored; ipybox.toml refers to them as ${{VAR}})")
    if entries and not dry_run and all(e.state is None for e in entries):
        _say(f"ipybox is not running in {directory}: `ipybox up` starts them")


def _write_dotenv(directory: Path, values: dict[str, str]) -> Any:
    """Add `values` to the workspace's `.env` (created 0600), atomically; a function that puts the file
    back as it was."""
    from dotenv import dotenv_values

    from ipybox.safefs import DIR_FLAGS, read_file, replace_file

    path = directory / ".env"
    try:
        old: bytes | None = read_file(path)
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        old, mode = None, 0o600
    except OSError as e:
        raise _Refused(f"{path} can't be read ({e}); nothing was written") from None
    text = (old or b"").decode("utf-8")
    lines = [text] if text.endswith("\n") or not text else [text, "\n"]
    lines.append("# Added by `ipybox server import`: secrets of the servers it imported\n")
    for key, value in values.items():
        quoted = value.replace("\\", "\\\\").replace("'", "\\'")
        lines.append(f"{key}='{quoted}'\n")
    new = "".join(lines)
    parsed = dotenv_values(stream=io.StringIO(new))  # as `${VAR}` placeholders are filled in from it
    for key, value in values.items():
        if (
            parsed.get(key) != value
        ):  # never expected (a `${...}` is a placeholder, not moved): checked anyway
            raise _Refused(
                f"the value for {key} would not read back from {path} as it is (does it contain '${{'?); "
                "nothing was written: add that server by hand, with the value in .env"
            )
    dir_fd = os.open(directory, DIR_FLAGS)
    try:
        replace_file(dir_fd, ".env", new, mode, durable=True)
    finally:
        os.close(dir_fd)

    def restore() -> None:
        dir_fd = os.open(directory, DIR_FLAGS)
        try:
            if old is None:
                os.unlink(".env", dir_fd=dir_fd)
            else:
                replace_file(dir_fd, ".env", old, mode, durable=True)
        finally:
            os.close(dir_fd)

    return restore


def _ignore_dotenv(directory: Path) -> str | None:
    """Make `.gitignore` ignore `.env` (it now holds secrets); what was done, or `None` when it did."""
    path = directory / ".gitignore"
    try:
        existing = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        existing = ""
    if any(line.strip() in (".env", "/.env", ".env*", "*.env", ".env.*") for line in existing.splitlines()):
        return None
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(("" if existing.endswith("\n") or not existing else "\n") + ".env\n")
    return f"added .env to {path} (it holds secrets now)"


# remove


def _remove(directory: Path, name: str, *, as_json: bool) -> int:
    from ipybox.config import CONFIG_FILE, remove_server

    config = _load(directory)
    path = directory / CONFIG_FILE
    edit = remove_server(path, name)
    if not as_json:
        _say(f"removed [servers.{name}] from {path}")
    outcome = _apply(directory, name, quiet=as_json)
    ok = outcome is None or outcome.state == "absent"
    if as_json:
        report = ServerChangeReport(
            name=name,
            action=edit.action,
            config=str(path),
            line=edit.line,
            server=None,
            running=outcome is not None,
            outcome=outcome.model_dump(mode="json") if outcome is not None else None,
            modules=[],
            ok=ok,
        )
        print(json.dumps(asdict(report), indent=2))
    elif ok and outcome is not None:
        _say(f"the workspace stopped it and removed its package {_package(config, name)}")
    if not ok and outcome is not None:
        problem = (
            "\n".join(f"  {p}" for p in outcome.problems) or outcome.error or f"it is still {outcome.state}"
        )
        _say(
            f"ipybox: [servers.{name}] is no longer in {path}, but the workspace did not drop it:\n{problem}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return 0


# list


def _list(directory: Path, *, as_json: bool) -> int:
    from ipybox.config import CONFIG_FILE
    from ipybox.config.servers import StdioServerSection

    config = _load(directory)
    lines = _configured(directory / CONFIG_FILE)
    status = _status(directory)
    live = status.reconciler.servers if status is not None else {}
    entries = []
    for name, server in config.servers.items():
        stdio = isinstance(server, StdioServerSection)
        state = error = tools = None
        if status is not None:
            now = live.get(name)
            if not server.enabled:
                state = "disabled"
            elif now is None:
                state = "not started"
            else:
                state, tools, error = now.state, now.tools, now.error
        entries.append(
            ServerEntry(
                name=name,
                enabled=server.enabled,
                kind="stdio" if stdio else "url",
                command=[server.command, *server.args] if isinstance(server, StdioServerSection) else None,
                url=None if isinstance(server, StdioServerSection) else server.url,
                transport=None if isinstance(server, StdioServerSection) else server.transport,
                sandboxed=server.sandbox_policy() is not None,
                line=lines.get(name),
                state=state,
                tools=tools,
                error=error,
            )
        )
    listing = ServerListing(
        str(directory), status is not None, entries, status.config_error if status is not None else None
    )
    if as_json:
        print(json.dumps(asdict(listing), indent=2))
        return 0
    if not entries:
        _say(f"no servers in {directory / CONFIG_FILE}; `ipybox server add NAME -- COMMAND ARGS...` adds one")
    width = max((len(entry.name) for entry in entries), default=0)
    for entry in entries:
        _say(f"{entry.name:<{width}}  {_describe(entry)}")
        if entry.error:
            _say(f"{'':<{width}}  error: {entry.error}")
    if status is None:
        _say(f"ipybox is not running in {directory} (`ipybox up` starts these servers)")
    elif status.config_error:
        _say(
            f"ipybox.toml has an error (the last good configuration keeps running):\n  {status.config_error}"
        )
    return 0


def _describe(entry: ServerEntry) -> str:
    if entry.kind == "stdio":
        what = f"stdio{', sandboxed' if entry.sandboxed else ''}: {shlex.join(entry.command or [])}"
    else:
        what = f"url ({entry.transport}): {entry.url}"
    if entry.state is None:
        state = "enabled" if entry.enabled else "disabled"
    elif entry.state == "ready":
        state = f"ready, {entry.tools} tool{'s' * (entry.tools != 1)}" if entry.tools is not None else "ready"
    else:
        state = entry.state
    return f"{state:<16}  {what}"


# shared


def _load(directory: Path) -> WorkspaceConfig:
    from ipybox.config import CONFIG_FILE, ConfigError, load_config

    try:
        return load_config(directory / CONFIG_FILE)
    except ConfigError as e:
        raise _Refused(f"{directory / CONFIG_FILE} does not load; fix it first:\n{e}") from None


def _package(config: WorkspaceConfig, name: str) -> str:
    return f"{Path(config.workspace.mcptools_dir).name}.{name}"


def _modules(config: WorkspaceConfig, name: str) -> list[str]:
    package = config.resolve(config.workspace.mcptools_dir) / name
    return sorted(path.stem for path in package.glob("*.py") if path.stem != "__init__")


def _apply(directory: Path, name: str, *, quiet: bool) -> ServerOutcome | None:
    """Have the running workspace apply `ipybox.toml` and return the server's outcome; `None` when the
    workspace is not up."""
    from ipybox.cli.progress import progress_on_terminal
    from ipybox.cli.workspace import is_running
    from ipybox.running.control_client import ControlRequestError
    from ipybox.running.state import NotRunningError

    if not is_running(directory):
        return None

    async def apply(progress: Progress | None) -> ServerOutcome:
        from ipybox.running.control_client import ControlClient

        async with ControlClient.of(directory) as control:
            return await control.apply_server(name, progress)

    try:
        with progress_on_terminal(quiet=quiet) as progress:
            return asyncio.run(apply(progress))
    except NotRunningError:  # it stopped meanwhile: the file is written, and applies when it is up again
        return None
    except ControlRequestError as e:  # e.g. still starting: it applies the file once it is up
        raise _Refused(
            f"ipybox.toml is written, but the running workspace did not apply it now: {e}"
        ) from None
    except TimeoutError:
        raise _Refused(
            f"[servers.{name}] is written, but the workspace did not answer in time; `ipybox server list` "
            "shows whether it started"
        ) from None


def _status(directory: Path) -> WorkspaceStatus | None:
    from ipybox.cli.workspace import is_running
    from ipybox.running.state import NotRunningError

    if not is_running(directory):
        return None

    async def status() -> WorkspaceStatus:
        from ipybox.running.control_client import ControlClient

        async with ControlClient.of(directory) as control:
            return await control.status()

    try:
        return asyncio.run(status())
    except NotRunningError:
        return None
