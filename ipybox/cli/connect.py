"""`ipybox connect [CLIENT]` and `ipybox token rotate`: what an MCP client needs to reach a workspace.

`connect` prints the client's entry for the workspace (what to type or paste on stdout, notes on stderr),
or with `--write` merges it into the client's own file (`ipybox.cli.client_config` renders and merges):

- stdio (the default): the client starts `ipybox mcp --workspace <absolute DIR>`. The command is the bare
  `ipybox` when the `ipybox` on `PATH` is this installation: such an entry works on every machine that has
  ipybox installed (a committed `.mcp.json`) and follows upgrades. Otherwise (no `ipybox` on `PATH`, or
  another installation's, which would serve another version) it is the absolute path of this `ipybox`, or
  this interpreter with `-m ipybox.cli`. Claude Desktop always gets the absolute path: it starts servers
  with the desktop session's `PATH`, not the shell's.
- `--http`: the running workspace's streamable HTTP endpoint and `Authorization: Bearer <token>`. The token
  is the workspace's persisted one (`ipybox.running.mcp_token`); with `[endpoints] port` pinned the URL
  stays the same too, so the entry keeps working across `ipybox down`/`up`, and it can be written before
  the workspace runs. Without a pinned port the workspace must be running (its port changes at each start:
  said on stderr).

`--write` reads the client's file, merges the entry (other entries untouched), copies the file as it was
to `<file>.bak` (mode 0600) and replaces it atomically (a new file renamed over it: `ipybox.safefs`); a
file that holds a token is written 0600. It refuses a file that is a symlink (it would replace the link),
an unreadable file, and a different `ipybox` entry without `--force`; a file with the same entry is left
alone. Project files (`.mcp.json`, `.cursor/`, `.vscode/`) go into the current directory (where the client
is opened); Codex's and Claude Desktop's are the user's.

`token rotate` makes a new token: through the running supervisor (which refuses the old one at once), or
in the state directory when nothing runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from ipybox.cli.client_config import (
    DESKTOP_STDIO_ONLY,
    Client,
    ConflictError,
    ConnectError,
    Http,
    Stdio,
    Transport,
    claude_add_command,
    entry,
    merge,
    snippet,
    stdio_args,
)
from ipybox.display_text import printable
from ipybox.errors import IpyboxError
from ipybox.safefs import LinkInPathError, open_dir, replace_file

EXIT_ERROR = 1

CLIENT_NAMES: dict[Client, str] = {
    "claude": "Claude Code",
    "codex": "Codex",
    "cursor": "Cursor",
    "vscode": "VS Code",
    "desktop": "Claude Desktop",
    "json": "an MCP client",
}


def _note(line: str) -> None:
    print(printable(line, lines=True), file=sys.stderr)


def _fail(message: str) -> int:
    print(f"ipybox: {printable(message, lines=True)}", file=sys.stderr)
    return EXIT_ERROR


# -- the transport ---------------------------------------------------------------------------------------


def ipybox_command(*, absolute: bool = False) -> tuple[str, tuple[str, ...]]:
    """How a client starts this ipybox: the command and the arguments before `mcp` (see the module's
    docstring for why the bare name when it can be)."""
    own = _own_executable()
    if own is None:  # not run as the `ipybox` script: this interpreter runs the same ipybox
        return sys.executable, ("-m", "ipybox.cli")
    found = shutil.which("ipybox")
    if not absolute and found is not None and _same_file(found, own):
        return "ipybox", ()
    return own, ()


def _own_executable() -> str | None:
    """The `ipybox` script this process runs from (absolute, not resolved: a venv's `bin/ipybox`)."""
    candidates = [Path(sys.argv[0]), Path(sys.executable).parent / "ipybox"]
    for path in candidates:
        if path.name == "ipybox" and path.is_file() and os.access(path, os.X_OK):
            return str(path.absolute())
    return None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class NoEndpointError(IpyboxError, RuntimeError):
    """The workspace has no HTTP endpoint to name now; the message says what to do."""


@dataclass(frozen=True)
class Endpoint:
    http: Http
    pinned: bool  # `[endpoints] port` is set: the URL stays the same across restarts


def http_endpoint(workspace: Path) -> Endpoint:
    """The workspace's HTTP endpoint: the running one's, or (with a pinned port) the one `ipybox up`
    will serve, with the persisted token.

    Raises:
        ConfigError: ipybox.toml can't be loaded.
        NoEndpointError: It serves none, or nothing runs and the port is not pinned.
    """
    from ipybox.config import CONFIG_FILE, load_config
    from ipybox.running import mcp_token
    from ipybox.running.state import NotRunningError, StatePaths, read_state

    endpoints = load_config(workspace / CONFIG_FILE).endpoints
    if not endpoints.mcp:
        raise NoEndpointError(
            f"{workspace} serves no HTTP endpoint ([endpoints] mcp = false in its ipybox.toml): connect over "
            "stdio (without --http), or set it to true and restart the workspace"
        )
    try:
        state = read_state(workspace)
    except NotRunningError:
        state = None
    if state is not None:
        if state.mcp_url is None or state.mcp_token is None:
            raise NoEndpointError(
                f"the workspace running in {workspace} (pid {state.pid}) serves no HTTP endpoint (`ipybox mcp` "
                "started it, or [endpoints] mcp was false then): connect over stdio (without --http), or "
                "stop it and start it with `ipybox up -d`"
            )
        return Endpoint(Http(state.mcp_url, state.mcp_token), pinned=endpoints.port != 0)
    if endpoints.port == 0:
        raise NoEndpointError(
            f"ipybox is not running in {workspace}, and its HTTP endpoint gets a new port at each start: "
            f"`ipybox up -d {workspace}` first (and pin the port with `[endpoints] port = N` in ipybox.toml "
            "so the entry survives restarts), or connect over stdio (without --http)"
        )
    host = endpoints.host
    url = f"http://{'[' + host + ']' if ':' in host else host}:{endpoints.port}/mcp"
    return Endpoint(Http(url, mcp_token.load_or_create(StatePaths.of(workspace))), pinned=True)


# -- where each client's file is -------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientFile:
    """A client's configuration file: the trusted directory it is under (resolved), and its place there."""

    base: Path
    relative: Path
    create_mode: int  # of missing directories below `base`

    @property
    def path(self) -> Path:
        return self.base / self.relative


def client_file(client: Client, project: Path, home: Path, platform: str = sys.platform) -> ClientFile:
    """Where `client` keeps its MCP servers: in the project for Claude Code (`.mcp.json`), Cursor and VS
    Code; the user's for Codex and Claude Desktop."""
    if client == "claude":
        return ClientFile(project.resolve(), Path(".mcp.json"), 0o755)
    if client == "cursor":
        return ClientFile(project.resolve(), Path(".cursor/mcp.json"), 0o755)
    if client == "vscode":
        return ClientFile(project.resolve(), Path(".vscode/mcp.json"), 0o755)
    if client == "codex":
        codex_home = os.environ.get("CODEX_HOME")
        directory = Path(codex_home) if codex_home else home / ".codex"
        return _user_file(directory, "config.toml")
    if client == "desktop":
        if platform == "darwin":
            directory = home / "Library" / "Application Support" / "Claude"
        elif platform == "win32":
            directory = Path(os.environ.get("APPDATA", home / "AppData" / "Roaming")) / "Claude"
        else:
            config_home = os.environ.get("XDG_CONFIG_HOME")
            directory = (Path(config_home) if config_home else home / ".config") / "Claude"
        return _user_file(directory, "claude_desktop_config.json")
    raise ConnectError("`ipybox connect json` prints the entry only: name a client to --write its file")


def _user_file(directory: Path, name: str) -> ClientFile:
    # The user's own directories may be symlinks (a dotfiles checkout): followed, as far as they exist.
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return ClientFile(existing.resolve(), directory.relative_to(existing) / name, 0o700)


# -- the command -----------------------------------------------------------------------------------------


def connect(
    client: Client,
    workspace: Path,
    *,
    http: bool,
    write: bool,
    force: bool,
    project: Path | None = None,
    home: Path | None = None,
) -> int:
    """`ipybox connect`: print `client`'s entry for `workspace` (absolute), or write it into its file."""
    try:
        transport = _transport(client, workspace, http)
        new = entry(client, transport)
        if not write:
            _print(client, transport)
            return 0
        where = client_file(client, project or Path.cwd(), home or Path.home())
        return _write(client, where, new, transport, force=force)
    except ConnectError as e:
        return _fail(str(e))


def _transport(client: Client, workspace: Path, http: bool) -> Transport:
    if not http:
        command, prefix = ipybox_command(absolute=client == "desktop")
        return Stdio(command, stdio_args(workspace, prefix))
    if client == "desktop":
        raise ConnectError(DESKTOP_STDIO_ONLY)
    found = http_endpoint(workspace)
    if not found.pinned:
        _note(
            f"note: this URL's port changes at each `ipybox up`; pin it with `[endpoints] port = "
            f"{_port(found.http.url)}` in {workspace / 'ipybox.toml'} to keep the entry working across restarts"
        )
    return found.http


def _port(url: str) -> str:
    return url.rsplit(":", 1)[-1].split("/", 1)[0]


def _print(client: Client, transport: Transport) -> None:
    if client == "claude":
        print(claude_add_command(transport))
        _note(
            "Claude Code keeps it for you in this project (local scope); with `--scope project` after `add` "
            "it goes into .mcp.json for everyone who opens the project, as `ipybox connect claude --write` "
            "writes it"
        )
    else:
        print(snippet(client, transport), end="")
        if client != "json":
            try:
                where = client_file(client, Path.cwd(), Path.home()).path
            except ConnectError:
                where = None
            if where is not None:
                _note(
                    f"for {CLIENT_NAMES[client]}: merge this into {where} (`--write` does, backing it up first)"
                )
    if isinstance(transport, Http):
        _note(
            "this holds the workspace's bearer token: keep it out of shared files (`ipybox token rotate` replaces it)"
        )


def _write(
    client: Client, where: ClientFile, new: dict[str, object], transport: Transport, *, force: bool
) -> int:
    path = where.path
    try:
        dir_fd = open_dir(path.parent, create_mode=where.create_mode)
    except (LinkInPathError, OSError) as e:
        return _fail(f"can't write {path}: {e}")
    try:
        existing, mode = _read(dir_fd, path)
        try:
            merged = merge(client, existing, new, force=force)
        except ConflictError as e:
            return _fail(f"{path} {e}")
        except ConnectError as e:
            return _fail(f"{path} {e}:\n{snippet(client, transport)}")
        if merged.unchanged:
            print(f"{path} already has this ipybox entry: nothing written")
            return 0
        backup = None
        # A token is for the owner's eyes only; otherwise the file keeps its mode (0644 when new).
        holds_token = isinstance(transport, Http)
        try:
            if existing is not None:
                backup = path.with_name(path.name + ".bak")
                replace_file(dir_fd, backup.name, existing, 0o600)
            replace_file(dir_fd, path.name, merged.text, 0o600 if holds_token else (mode or 0o644))
        except OSError as e:  # the file is as it was: replaced by a rename, or not at all
            return _fail(f"can't write {path}: {e.strerror or e}")
    finally:
        os.close(dir_fd)
    did = "replaced the ipybox entry in" if merged.replaced else "added the ipybox entry to"
    print(f"{did} {path}" + (f" (the file as it was is in {backup})" if backup is not None else ""))
    if holds_token:
        _note(f"{path} holds the workspace's bearer token (mode 0600): keep it out of version control")
    if client == "claude":
        _note(
            "Claude Code asks once whether to use the servers of a project's .mcp.json; `claude mcp list` checks it"
        )
    return 0


def _read(dir_fd: int, path: Path) -> tuple[str | None, int | None]:
    """The file's text and mode (`None`, `None` when there is none); a symlink or non-file is refused."""
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        if os.path.islink(path):
            raise ConnectError(
                f"{path} is a symlink (to {os.readlink(path)}): ipybox replaces the file, which would replace "
                "the link; add the entry (`ipybox connect` without --write prints it) to the file it points to"
            ) from None
        raise ConnectError(f"can't read {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConnectError(f"{path} is not a regular file")
        data = file.read()
    try:
        return data.decode(), stat.S_IMODE(info.st_mode)
    except UnicodeDecodeError:
        raise ConnectError(f"{path} is not UTF-8 text: add the entry by hand") from None


def rotate_token(workspace: Path) -> int:
    """`ipybox token rotate`: a new bearer token for the workspace's HTTP endpoint."""
    from ipybox.running import mcp_token
    from ipybox.running.control_client import ControlClient
    from ipybox.running.state import NotRunningError, StatePaths, read_state

    try:
        state = read_state(workspace)
    except NotRunningError:
        state = None
    if state is None:
        mcp_token.rotate(StatePaths.of(workspace))
        print(f"a new bearer token for {workspace}'s HTTP endpoint: the next `ipybox up` serves it")
    else:

        async def rotate() -> bool:
            async with ControlClient(state) as control:
                return (await control.rotate_mcp_token()).live

        live = asyncio.run(rotate())
        print(
            f"a new bearer token for {workspace}'s HTTP endpoint: "
            + ("it serves with it now and refuses the old one" if live else "the next `ipybox up` serves it")
        )
    _note(
        "clients configured with the old token need the new one: `ipybox connect CLIENT --http` prints it "
        "(`--write --force` replaces it in the client's file)"
    )
    return 0
