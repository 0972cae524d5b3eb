"""`ipybox init [DIR]` (a new workspace's `ipybox.toml` and `.gitignore`) and `ipybox schema` (where the
installed JSON Schemas are, for editors).

`ipybox init` renders `ipybox.toml` from the template `ipybox/data/templates/ipybox.toml.jinja`: a
`#:schema ./.ipybox/ipybox.schema.json` line (the workspace's copy of the installed schema, which init and
every start of the workspace write: a committed file names no path of this machine; Taplo and Even Better
TOML read the line), a header pointing at the installed example, the
`[workspace]`, `[kernel]`, `[sandbox]` and `[approval]` tables with a few rules, and the servers of
`ipybox.config.server_catalog`: commented out, or active for each `--server NAME`. The catalog's deny
rules are active whatever servers are chosen (they can only refuse); its allow and ask rules come with
their server.

Contract:

- Nothing from outside reaches the file unencoded. Every `{{ ... }}` of the template goes through
  `_encoded` (the template's `finalize`): a value is written as a TOML literal unless it is `TomlText`,
  text this module built (TOML it encoded itself, or comment lines checked to hold no line break or
  control character). The template is TOML, so jinja2's HTML autoescape does not apply; this is its
  counterpart.
- The written file loads with the real loader: it is rendered, written to a temporary file in DIR,
  loaded with `load_config` (which also checks every rule's `match`/`not_match` examples) and only then
  moved into place. An existing `ipybox.toml` is never replaced without `--force` (the move is a hard
  link, which fails if the name exists, even when the file appeared meanwhile); with `--force` it is an
  atomic rename. No half-written file is ever seen under the name.
- `.gitignore` gets the line `.ipybox/` (created, or appended to when no line already ignores `.ipybox`),
  never twice.
- When this machine can't sandbox (`ipybox doctor`'s checks) and `--no-sandbox` is not given, the file
  still says `enabled = true` and a note on stderr says what to do: it never silently writes `false`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shlex
import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import jinja2
import tomlkit

from ipybox.config import CONFIG_FILE, load_config
from ipybox.config.schema import EXAMPLE_URL, WORKSPACE_SCHEMA, packaged_file, schema_path
from ipybox.config.server_catalog import CATALOG, CatalogServer
from ipybox.limits import unenforceable_defaults
from ipybox.running.state import StateDirError, StatePaths, prepare_state_dir

__all__ = [
    "GITIGNORE_LINE",
    "TomlText",
    "init",
    "render_config",
    "schema",
    "toml_value",
    "unknown_servers",
    "unknown_servers_message",
]

TEMPLATE = "ipybox.toml.jinja"
GITIGNORE_LINE = ".ipybox/"
# Lines that already keep the state directory out of git.
_IGNORES_STATE = {".ipybox", ".ipybox/", "/.ipybox", "/.ipybox/"}
_COMMENT_WIDTH = 108  # the file's lines stay within 110 columns, like ipybox.toml.example's
_RULE_KEYS = ("id", "server", "tool", "args", "annotations", "decision", "priority", "match", "not_match")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# What TOML forbids in comments and literal strings: control characters but tab.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

EXIT_ERROR = 1
# What to install for the catalog's commands.
_PROVIDERS = {"npx": "Node.js, which brings npx", "uvx": "uv, which brings uvx"}


class TomlText(str):
    """Text that is TOML already (built by this module): the template writes it as it is."""


def toml_key(key: str) -> str:
    """`key` as a TOML key: bare when it can be, else a quoted string."""
    return TomlText(key if _BARE_KEY.fullmatch(key) else toml_string(key))


def toml_string(value: str) -> str:
    """`value` as a TOML string. A literal string ('...') when it has a backslash it can hold as written
    (regexes read as they are meant), else a basic string with TOML's escapes."""
    if "\\" in value and "'" not in value and not _CONTROL.search(value):
        return f"'{value}'"
    return tomlkit.string(value).as_string()


def toml_value(value: Any) -> TomlText:
    """`value` (str, bool, int, float, list, mapping) as one line of TOML: mappings as inline tables
    written `{ a = 1 }`, as ipybox.toml.example writes them."""
    if isinstance(value, bool):
        return TomlText("true" if value else "false")
    if isinstance(value, int | float):
        return TomlText(tomlkit.item(value).as_string())
    if isinstance(value, str):
        return TomlText(toml_string(value))
    if isinstance(value, Mapping):
        if not value:
            return TomlText("{}")
        return TomlText("{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }")
    if isinstance(value, list | tuple):
        return TomlText("[" + ", ".join(toml_value(item) for item in value) + "]")
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _comment_text(text: str) -> TomlText:
    """`text` for one comment line, which it must fit in (no line break or control character)."""
    if _CONTROL.search(text):
        raise ValueError(f"a comment can't hold a line break or control character: {text!r}")
    return TomlText(text)


def _comment_lines(text: str) -> list[TomlText]:
    """A paragraph as comment lines, wrapped at spaces only (a long URL or path stays whole)."""
    lines = textwrap.wrap(text, _COMMENT_WIDTH, break_long_words=False, break_on_hyphens=False)
    return [_comment_text(line) for line in lines]


def _encoded(value: Any) -> TomlText:
    # The template's `finalize`: see the module's contract.
    return value if isinstance(value, TomlText) else toml_value(value)


@dataclass(frozen=True)
class _Block:
    """A commented table for the template: its comment lines and its TOML lines, active or commented out."""

    comment: list[TomlText]
    lines: list[TomlText]
    active: bool
    server: TomlText


def _server_block(server: CatalogServer, active: bool) -> _Block:
    lines = [TomlText(f"[servers.{server.name}]")]
    lines += [TomlText(f"{toml_key(key)} = {toml_value(value)}") for key, value in server.params.items()]
    comment = _comment_lines(server.summary) + (_comment_lines(server.note) if server.note else [])
    return _Block(comment, lines, active, TomlText(server.name))


def _rule_lines(table: Mapping[str, Any]) -> list[TomlText]:
    lines = [TomlText("[[approval.rules]]")]
    for key in sorted(table, key=lambda k: _RULE_KEYS.index(k) if k in _RULE_KEYS else len(_RULE_KEYS)):
        value = table[key]
        if key in ("match", "not_match") and len(value) > 1:
            lines.append(TomlText(f"{key} = ["))
            lines += [TomlText(f"  {toml_value(call)},") for call in value]
            lines.append(TomlText("]"))
        else:
            lines.append(TomlText(f"{toml_key(key)} = {toml_value(value)}"))
    return lines


def unknown_servers(names: Sequence[str]) -> list[str]:
    """The names in `names` that the catalog doesn't have."""
    return [name for name in dict.fromkeys(names) if name not in CATALOG]


def unknown_servers_message(unknown: Sequence[str]) -> str:
    """The one error for `--server` names the catalog doesn't have: which, the known ones, and what to do
    for any other server."""
    names = ", ".join(repr(name) for name in unknown)
    return (
        f"--server {names}: not an example server (known: {', '.join(CATALOG)}); add any other server "
        "after `ipybox init` with `ipybox server add NAME -- COMMAND [ARGS...]`"
    )


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(packaged_file("templates")),
        autoescape=False,  # TOML, not HTML: `_encoded` is the escaping (see the module's contract)
        finalize=_encoded,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def render_config(
    workspace: Path,
    servers: Sequence[str] = (),
    *,
    sandbox: bool = True,
    lifted: Mapping[str, str] | None = None,
) -> str:
    """The text of a new `ipybox.toml` for `workspace` (its rules name it as `{workspace}`, which the loader
    fills in wherever the file is), with the catalog's `servers` active and the kernels sandboxed unless `sandbox` is false; the
    default limits in `lifted` (name -> why: `unenforceable_defaults`) are set to "unlimited", with why.

    Raises:
        KeyError: A name in `servers` is not in the catalog.
    """
    for name in servers:
        if name not in CATALOG:
            raise KeyError(name)
    rules: list[_Block] = []
    for server in CATALOG.values():
        for rule in server.rules:  # `{workspace}` as it is: the loader fills it in wherever the file is
            active = server.name in servers or rule.decision == "deny"
            rules.append(
                _Block(_comment_lines(rule.comment), _rule_lines(rule.table), active, TomlText(server.name))
            )
    return (
        _environment()
        .get_template(TEMPLATE)
        .render(
            schema_uri=TomlText(f"./{WORKSPACE_SCHEMA}"),  # the workspace's copy: no path of this machine
            example_path=_comment_text(EXAMPLE_URL),  # published: no path of this machine
            sandbox=sandbox,
            rules=rules,
            servers=[_server_block(server, server.name in servers) for server in CATALOG.values()],
            lifted=[(TomlText(name), _comment_lines(why)) for name, why in (lifted or {}).items()],
        )
    )


def _sandbox_available() -> bool:
    from ipybox.sandbox.doctor import run_checks, sandbox_ready

    return sandbox_ready(run_checks())


def _write_new(target: Path, text: str, *, replace: bool) -> None:
    """Write `text` to `target` through a temporary file in its directory, after loading it with the real
    loader; never over an existing file unless `replace`.

    Raises:
        FileExistsError: `target` exists and not `replace`.
        ConfigError: The text does not load (a bug in the template or the catalog, or `IPYBOX_*`
            variables in the environment or `.env` that don't fit).
    """
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        load_config(temporary)
        if replace:
            os.replace(temporary, target)
        else:
            _link_new(temporary, target)
        _fsync_directory(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def _link_new(source: Path, target: Path) -> None:
    # A hard link fails if the name exists: the check and the write are one step.
    try:
        os.link(source, target)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # A filesystem without hard links: create the name exclusively and copy the text into it.
        with open(target, "x", encoding="utf-8") as stream:
            stream.write(source.read_text(encoding="utf-8"))


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ignore_state_dir(directory: Path) -> str | None:
    """Make `.gitignore` ignore `.ipybox/`; what was done, or `None` when it already did."""
    path = directory / ".gitignore"
    try:
        existing = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        with open(path, "x", encoding="utf-8") as stream:
            stream.write(GITIGNORE_LINE + "\n")
        return f"wrote {path}"
    if any(line.strip() in _IGNORES_STATE for line in existing.splitlines()):
        return None
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(("" if existing.endswith("\n") or not existing else "\n") + GITIGNORE_LINE + "\n")
    return f"added {GITIGNORE_LINE} to {path}"


def init(
    directory: Path,
    servers: Sequence[str] = (),
    *,
    sandbox: bool = True,
    force: bool = False,
    shown_as: str | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
    """`ipybox init`: write `directory`'s `ipybox.toml` and `.gitignore` (creating the directory), print
    what was written and what to do next; the exit status.

    Args:
        directory: The workspace.
        servers: Catalog servers to write active (checked by the caller: see `unknown_servers`).
        sandbox: Write `[sandbox] enabled = true` (else `false`).
        force: Replace an existing `ipybox.toml`.
        shown_as: How the user named the directory, for the next steps (`None`: the current directory).
        out: Where the report goes (default: stdout).
        err: Where errors and notes go (default: stderr).
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    if directory.exists() and not directory.is_dir():
        print(f"ipybox: {directory} is not a directory: name a new or existing directory", file=err)
        return EXIT_ERROR
    target = directory / CONFIG_FILE
    if (target.exists() or target.is_symlink()) and not force:
        print(f"ipybox: {target} already exists: edit it, or pass --force to replace it", file=err)
        return EXIT_ERROR
    chosen = list(dict.fromkeys(servers))  # each once, in the order given
    try:
        directory.mkdir(parents=True, exist_ok=True)
        workspace = directory.resolve()
        text = render_config(
            workspace, chosen, sandbox=sandbox, lifted=unenforceable_defaults(sandboxed=sandbox)
        )
        _write_new(workspace / CONFIG_FILE, text, replace=force)
        ignored = _ignore_state_dir(workspace)
        # The state directory with the schema copy the `#:schema` line names (and its own .gitignore).
        try:
            prepare_state_dir(StatePaths.of(workspace))
        except StateDirError as e:  # `ipybox up` says so too; the file itself is written
            print(f"ipybox: note: {e}", file=err)
    except FileExistsError:
        print(f"ipybox: {target} already exists: edit it, or pass --force to replace it", file=err)
        return EXIT_ERROR
    except OSError as e:
        print(f"ipybox: can't write the workspace {directory}: {e.strerror or e} ({e.filename})", file=err)
        return EXIT_ERROR

    what = f"sandbox {'on' if sandbox else 'off'}, servers: {', '.join(chosen) if chosen else 'none yet'}"
    print(f"Wrote {workspace / CONFIG_FILE} ({what})", file=out)
    if ignored is not None:
        print(ignored[0].upper() + ignored[1:], file=out)
    if sandbox and not _sandbox_available():
        print(
            "ipybox: note: this machine can't sandbox kernels (`ipybox doctor` says what is missing), so "
            "`ipybox up` will stop until it can; to run kernels unsandboxed instead, set [sandbox] "
            "enabled = false, or run `ipybox init --no-sandbox --force`",
            file=err,
        )
    for name in chosen:
        command = CATALOG[name].params.get("command")
        if isinstance(command, str) and shutil.which(command) is None:
            install = CATALOG[name].install
            how = (
                f"run `{install}`: the server runs in a sandbox without network, so npx can't fetch it"
                if install
                else f"install {_PROVIDERS.get(command, command)}"
            )
            print(
                f"ipybox: note: `{command}` is not on PATH, so the server {name} can't start until it is "
                f"({how})",
                file=err,
            )
    option = "" if shown_as is None else " -w " + shlex.quote(shown_as)
    print("Next:", file=out)
    if not chosen:
        print(f"  ipybox server add NAME{option} -- COMMAND [ARGS...]   add an MCP server", file=out)
        print(f"    (or uncomment one in {CONFIG_FILE}: {', '.join(CATALOG)})", file=out)
    print(f"  ipybox up{option}   run the workspace", file=out)
    return 0


def schema(*, sandbox_policy: bool = False, out: IO[str] | None = None) -> int:
    """`ipybox schema`: print the installed JSON Schema's path; the exit status."""
    print(schema_path(sandbox_policy=sandbox_policy), file=out if out is not None else sys.stdout)
    return 0
