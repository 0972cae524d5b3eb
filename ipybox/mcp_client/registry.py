"""`ServerRegistry`: the host's record of which MCP server stands behind which name.

`generate_mcp_sources` records each server it generates a package for, keyed by the package root, in a
file in the user's state directory ([registry_dir][ipybox.mcp_client.registry.registry_dir]:
`$XDG_STATE_HOME/ipybox`, default `~/.local/state/ipybox`). A tool server started later, in another
process, finds them there, so generated code keeps working across runs as in ipybox 0.9 while the kernel
still only ever sends a server *name*.

The registry names commands the host runs, so it is host-only state:

- the directory is created 0700, the file (and its lock) 0600; the sandbox keeps the directory read-only
  for kernels (and creates it before they start, so a kernel can't create it either);
- the directory and the file are opened without following symlinks (`O_NOFOLLOW`, the file through the
  directory's descriptor), and both must belong to the current user and be writable by nobody else;
- entries are written as the server-parameters model's dump (`ipybox.mcp_client.params`: what
  `generate_mcp_sources` was given, validated and normalised) and every entry read back is validated
  with the same model; a malformed one is skipped (with a warning), never used.

It holds names of secrets, never their values: each literal value of `env` and `headers` (one without a
`${VAR}` placeholder) is recorded as a placeholder ([recorded_form][ipybox.mcp_client.registry.recorded_form]:
`env.API_KEY` as `${API_KEY}`, a header as `${<SERVER>_<HEADER>}`, e.g. `${GITHUB_AUTHORIZATION}`), with a
warning naming the variables. The process that registered keeps the values in memory and reads its own
entry back as given, so generating and then running in one process works as in ipybox 0.9; an executor
in another process fills them in from its environment or `.env` when the server starts, and a missing
one is an error naming the variable. Entries that earlier versions wrote with literal values are served
as they are, to their own package root only (see below), and rewritten with placeholders, with a
warning, the next time the registry is written.

Next to the parameters, `generate_mcp_sources` records each tool's annotations (`readOnlyHint`, ...) as
the server listed them, so that the tool server knows them for a call decided before the server starts.
They are bound to the parameters they were listed with (a SHA-256 of their JSON) and used only for
those, and read back as what they must be (tool name -> {str: bool | str}, a `...Hint` a bool, within
size limits) or not at all. The file:

```json
{
  "/home/me/project/mcptools": {"filesystem": {"command": "npx", "args": ["..."]}},
  "tool_annotations": {
    "/home/me/project/mcptools": {
      "filesystem": {
        "params_sha256": "<sha256 of the parameters' canonical JSON>",
        "tools": {"read_file": {"readOnlyHint": true, "title": "Read File"}, "write_file": {}}
      }
    }
  }
}
```

Package roots are absolute paths, so `tool_annotations` can't be one. Entries without annotations (as
earlier versions wrote them) still load; their tools' annotations are unknown until the server starts.

Generated tool modules send the root they sit in with each call, so a package works from wherever it was
generated ([package_server][ipybox.mcp_client.registry.ServerRegistry.package_server]: the host looks that
root up here). A root is a path a kernel chose, so the tool server looks up only the roots that the host
gave it (`MCPServers.package_roots`: a `CodeExecutor`'s `mcptools_dir` and `package_roots`) and refuses
any other before reading this file: another project's entries, and the secrets they hold, are never
handed to a kernel that names that project's directory. Within those roots, a root (or name) not recorded
finds nothing, and nothing is started for it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipybox.errors import UnsafePathError
from ipybox.mcp_client.errors import ServerParamsError
from ipybox.mcp_client.params import PLACEHOLDER, ServerParams, dump_server_params, validate_server_params
from ipybox.paths import user_state_dir
from ipybox.safefs import open_own_dir, replace_file

logger = logging.getLogger(__name__)

REGISTRY_FILE = "mcp_servers.json"
ANNOTATIONS_KEY = "tool_annotations"
"""The registry's top-level section of recorded tool annotations (beside the package roots)."""

# Limits on recorded annotations: what is beyond them is not recorded, and not used when read back.
MAX_TOOLS = 1024
"""Tools per server whose annotations are recorded."""
MAX_ANNOTATIONS = 16
"""Annotations per tool."""
MAX_NAME_CHARS = 256
"""Characters of a tool name or an annotation's name."""
MAX_VALUE_CHARS = 256
"""Characters of a string annotation (`title`, a short human-readable name; a longer one is left out)."""

ToolAnnotations = dict[str, bool | str]


MAX_ROOT_CHARS = 4096
"""Characters of a package root a kernel may send (Linux's `PATH_MAX`); a longer one is not looked up."""


@dataclass(frozen=True)
class RegisteredServer:
    """A server as `generate_mcp_sources` recorded it for one package root.

    Attributes:
        root: The package root as recorded (resolved: one root reached by several paths is one root).
        params: Its parameters (the model's dump, `${VAR}` unresolved).
        annotations: Its tools' annotations recorded with exactly these parameters (tool name ->
            annotations), `None` when none were.
    """

    root: str
    params: dict[str, Any]
    annotations: dict[str, ToolAnnotations] | None = None


class UnsafeRegistryError(UnsafePathError, PermissionError):
    """The registry's directory or file is a symlink, not a regular directory or file, belongs to another
    user or is writable by others: it is not used."""


def registry_dir() -> Path:
    """The directory of the host's server registry: `$XDG_STATE_HOME/ipybox` (an absolute
    `XDG_STATE_HOME` only, as the XDG spec says), default `~/.local/state/ipybox`.

    Host-only state: kernels must not be able to write it (the sandbox mounts it read-only).
    """
    return user_state_dir()


def default_registry_path() -> Path:
    """The registry file: `mcp_servers.json` in [registry_dir][ipybox.mcp_client.registry.registry_dir]."""
    return registry_dir() / REGISTRY_FILE


def ensure_registry_dir(directory: Path | None = None) -> Path:
    """Create the registry directory (0700) if it is missing and check that it is safe to use.

    Returns:
        The directory (default: [registry_dir][ipybox.mcp_client.registry.registry_dir]).

    Raises:
        UnsafeRegistryError: It is a symlink, not a directory, or belongs to another user.
    """
    directory = directory or registry_dir()
    os.close(_open_dir(directory, create=True))
    return directory


class ServerRegistry:
    """MCP server parameters by package root (`mcptools/`) and server name, as given (`${VAR}` unresolved).

    Reading never fails: a registry that is missing, unreadable, unsafe (see the module) or not JSON
    reads as empty, with a warning for the last two; names found only there are then unknown to the tool
    server, which refuses their calls and starts nothing. Refusing to read it, rather than failing, keeps
    a planted symlink from stopping every later `CodeExecutor` on the host. Writing an unsafe registry
    raises `UnsafeRegistryError` instead: a registration that silently went nowhere would leave
    generated code that can't run, and the user has to learn that their state directory is not theirs.

    Args:
        path: The registry file (default: [default_registry_path][ipybox.mcp_client.registry.default_registry_path]).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_registry_path()

    def register(
        self,
        root_dir: Path,
        server_name: str,
        server_params: Mapping[str, Any] | ServerParams,
        annotations: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Record (or replace) the parameters of `server_name` for the packages under `root_dir`.

        Args:
            root_dir: The package root (`mcptools/`).
            server_name: The server's name.
            server_params: Its parameters (`${VAR}` unresolved): recorded as the model's dump.
            annotations: Each tool's annotations as the server listed them with these parameters (tool
                name -> `{"readOnlyHint": True, ...}`); only `str` -> `bool | str` entries within the
                size limits are recorded. `None` forgets annotations recorded earlier.

        Raises:
            ServerParamsError: The parameters are not valid (nothing is recorded).
            UnsafeRegistryError: The registry's directory or file is not safe to use.
        """
        given = dump_server_params(validate_server_params(server_name, server_params))
        params, withheld = recorded_form(server_name, given)
        recorded = None
        if annotations is not None:
            recorded = {"params_sha256": _digest(params), "tools": _recordable(server_name, annotations)}
        with self._locked() as (dir_fd, data):
            key = _key(root_dir)
            _scrub(data, self.path)
            entries = data.get(key)
            if not isinstance(entries, dict):
                entries = data[key] = {}
            entries[server_name] = params
            if withheld:
                _given_here[str(self.path), key, server_name] = (params, given)
                logger.warning(
                    "MCP server %r: the server registry records %s, not the values given: an executor in "
                    "another process needs %s in its environment or .env (or the server in mcp_servers)",
                    server_name,
                    ", ".join(f"{where} as ${{{name}}}" for where, name in withheld.items()),
                    ", ".join(dict.fromkeys(withheld.values())),
                )
            else:
                _given_here.pop((str(self.path), key, server_name), None)
            _forget_annotations(data, key, server_name)
            if recorded is not None:
                section = data.get(ANNOTATIONS_KEY)
                if not isinstance(section, dict):
                    section = data[ANNOTATIONS_KEY] = {}
                by_server = section.get(key)
                if not isinstance(by_server, dict):
                    by_server = section[key] = {}
                by_server[server_name] = recorded
            self._write(dir_fd, data)

    def unregister(self, root_dir: Path, server_name: str) -> None:
        with self._locked() as (dir_fd, data):
            key = _key(root_dir)
            _given_here.pop((str(self.path), key, server_name), None)
            entries = data.get(key)
            removed = isinstance(entries, dict) and entries.pop(server_name, None) is not None
            if _forget_annotations(data, key, server_name) | removed | _scrub(data, self.path):
                self._write(dir_fd, data)

    def recorded_annotations(
        self, root_dir: Path, server_name: str, server_params: Mapping[str, Any]
    ) -> dict[str, ToolAnnotations] | None:
        """The tool annotations recorded for `server_name` under `root_dir` (tool name -> annotations),
        if they were recorded for exactly `server_params`; `None` otherwise, or when nothing usable was
        recorded. Malformed entries are ignored with a warning: a tool's malformed annotations leave out
        that tool, a malformed server entry all of them. Never fails, never starts anything.
        """
        section = self._read().get(ANNOTATIONS_KEY)
        if section is None:
            return None
        if not isinstance(section, dict):
            logger.warning("ignoring the tool annotations in %s: not a mapping", self.path)
            return None
        key = _key(root_dir)
        by_server = section.get(key)
        if by_server is None:
            return None
        if not isinstance(by_server, dict):
            logger.warning(
                "ignoring the tool annotations for %s in %s: not a mapping of servers", root_dir, self.path
            )
            return None
        entry = by_server.get(server_name)
        given = _given_here.get((str(self.path), key, server_name))
        if given is not None and given[1] == dict(server_params):
            server_params = given[0]  # as given in this process: recorded (and digested) with placeholders
        return None if entry is None else _read_annotations(server_name, entry, server_params, self.path)

    def package_server(self, package_root: str, server_name: str) -> RegisteredServer | None:
        """The server recorded as `server_name` for `package_root`, a root as a kernel sent it (a generated
        module's own location): its parameters and annotations, read in one go. `None` when the root is not
        an absolute path (of at most `MAX_ROOT_CHARS`) or names no root recorded here, or that root has no
        valid entry of that name. Never fails, never starts anything.
        """
        if not (0 < len(package_root) <= MAX_ROOT_CHARS and os.path.isabs(package_root)):
            return None
        try:
            key = _key(Path(package_root))  # recorded resolved: a symlinked path finds its target's entry
        except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
            return None
        data = self._read()
        entries = data.get(key)
        if not isinstance(entries, dict) or server_name not in entries:
            return None
        params = _loaded(server_name, entries[server_name], self.path)
        if params is None:
            return None
        section = data.get(ANNOTATIONS_KEY)
        by_server = section.get(key) if isinstance(section, dict) else None
        entry = by_server.get(server_name) if isinstance(by_server, dict) else None
        annotations = None if entry is None else _read_annotations(server_name, entry, params, self.path)
        return RegisteredServer(key, self._as_given(key, server_name, params), annotations)

    def servers(self, root_dir: Path) -> dict[str, dict[str, Any]]:
        """The valid servers recorded for `root_dir`: name -> parameters (the model's dump)."""
        entries = self._read().get(_key(root_dir), {})
        if not isinstance(entries, dict):
            logger.warning("ignoring the entry for %s in %s: not a mapping of servers", root_dir, self.path)
            return {}
        key = _key(root_dir)
        loaded = ((name, _loaded(name, params, self.path)) for name, params in entries.items())
        return {name: self._as_given(key, name, params) for name, params in loaded if params is not None}

    def _as_given(self, key: str, server_name: str, params: dict[str, Any]) -> dict[str, Any]:
        """The parameters as this process gave them to `register`, while the file still holds what it
        recorded of them then (another process may have registered the name anew since); else `params`."""
        given = _given_here.get((str(self.path), key, server_name))
        return given[1] if given is not None and given[0] == params else params

    def _read(self) -> dict[str, Any]:
        """The registry's content, `{}` (with a warning) when it can't or must not be read."""
        try:
            dir_fd = _open_dir(self.path.parent, create=False)
        except FileNotFoundError:
            return {}
        except OSError as e:
            logger.warning("not using the MCP server registry %s: %s", self.path, e)
            return {}
        try:
            return _load(dir_fd, self.path)
        except UnsafeRegistryError as e:
            logger.warning("not using the MCP server registry: %s", e)
            return {}
        except OSError as e:
            logger.warning("cannot read the MCP server registry %s: %s", self.path, e)
            return {}
        finally:
            os.close(dir_fd)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[tuple[int, dict[str, Any]]]:
        dir_fd = _open_dir(self.path.parent, create=True)
        try:
            lock_name = self.path.with_suffix(".lock").name
            lock = _open_file(lock_name, os.O_RDWR | os.O_CREAT, dir_fd, self.path.parent / lock_name)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield dir_fd, _load(dir_fd, self.path)
            finally:
                os.close(lock)
        finally:
            os.close(dir_fd)

    def _write(self, dir_fd: int, data: dict[str, Any]) -> None:
        replace_file(dir_fd, self.path.name, json.dumps(data, indent=2, sort_keys=True))


# What `register` was given in this process where the file holds placeholders in place of literal values:
# (registry file, root, server name) -> (the parameters as recorded, as given). Memory only, never written.
_given_here: dict[tuple[str, str, str], tuple[dict[str, Any], dict[str, Any]]] = {}


def recorded_form(server_name: str, params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """What the registry records of a server's parameters (the model's dump): each literal value of `env`
    and `headers` replaced by a `${VAR}` placeholder. A value that holds a placeholder already, or is
    empty, is kept as it is. `env.NAME` becomes `${NAME}` (the variable the server reads), a header
    `${<SERVER>_<HEADER>}` in capitals, `_` for what is not a letter or digit.

    Returns:
        The parameters to record, and where each value was withheld (`env.API_KEY` -> `API_KEY`).
    """
    recorded = dict(params)
    withheld: dict[str, str] = {}
    for field in ("env", "headers"):
        values = params.get(field)
        if not isinstance(values, dict):
            continue
        kept = {}
        for name, value in values.items():
            if not isinstance(value, str) or not value or PLACEHOLDER.search(value):
                kept[name] = value
                continue
            variable = _variable(name if field == "env" else f"{server_name}_{name}".upper())
            withheld[f"{field}.{name}"] = variable
            kept[name] = f"${{{variable}}}"
        recorded[field] = kept
    return recorded, withheld


def _variable(name: str) -> str:
    variable = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return variable if re.match(r"[A-Za-z_]", variable) else f"_{variable}"


def _scrub(data: dict[str, Any], path: Path) -> bool:
    """Replace the literal values that earlier versions recorded (see the module) by placeholders, in
    place; annotations recorded for the old parameters are kept for the new ones. Whether any were."""
    scrubbed: list[str] = []
    section = data.get(ANNOTATIONS_KEY)
    for key, entries in data.items():
        if key == ANNOTATIONS_KEY or not isinstance(entries, dict):
            continue
        for name, params in entries.items():
            if not isinstance(params, dict):
                continue
            recorded, withheld = recorded_form(str(name), params)
            if not withheld:
                continue
            entries[name] = recorded
            scrubbed.append(f"{name} ({key}): {', '.join(dict.fromkeys(withheld.values()))}")
            by_server = section.get(key) if isinstance(section, dict) else None
            entry = by_server.get(name) if isinstance(by_server, dict) else None
            if isinstance(entry, dict):
                with contextlib.suppress(TypeError, ValueError):
                    if entry.get("params_sha256") == _digest(params):
                        entry["params_sha256"] = _digest(recorded)
    if scrubbed:
        logger.warning(
            "the MCP server registry %s held literal values of secrets, now recorded as placeholders: an "
            "executor needs these variables in its environment or .env: %s",
            path,
            "; ".join(scrubbed),
        )
    return bool(scrubbed)


def _open_dir(directory: Path, *, create: bool) -> int:
    """A descriptor of `directory`, opened without following a symlink, checked to be the current
    user's and writable by nobody else (tightened to 0700 when `create`: the caller is about to write)."""
    return open_own_dir(directory, create=create, unsafe=UnsafeRegistryError, name="the registry directory")


def _open_file(name: str, flags: int, dir_fd: int, path: Path) -> int:
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeRegistryError(f"{path} is a symlink") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeRegistryError(f"{path} is not a regular file")
        _check(info, path, "file", fix_mode=0o600 if flags & os.O_CREAT else None, fd=fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check(info: os.stat_result, path: Path, what: str, *, fix_mode: int | None, fd: int) -> None:
    if info.st_uid != os.geteuid():
        raise UnsafeRegistryError(
            f"the registry {what} {path} is owned by uid {info.st_uid}, not by this user"
        )
    if stat.S_IMODE(info.st_mode) & 0o022:
        if fix_mode is None:
            raise UnsafeRegistryError(f"the registry {what} {path} is writable by other users")
        os.fchmod(fd, fix_mode)


def _load(dir_fd: int, path: Path) -> dict[str, Any]:
    """The registry's content: `{}` when there is none or it is not a JSON object (with a warning).

    Raises:
        UnsafeRegistryError: The file is a symlink, not a regular file, or not the user's alone.
    """
    try:
        fd = _open_file(path.name, os.O_RDONLY, dir_fd, path)
    except FileNotFoundError:
        return {}
    with os.fdopen(fd, "rb") as f:
        content = f.read()
    try:
        data = json.loads(content)
    except ValueError:
        logger.warning("ignoring the MCP server registry %s: not valid JSON", path)
        return {}
    if not isinstance(data, dict):
        logger.warning("ignoring the MCP server registry %s: not a JSON object", path)
        return {}
    return data


def _loaded(name: Any, params: Any, path: Path) -> dict[str, Any] | None:
    """An entry's parameters, loaded back with the model (and dumped again); `None` (with a warning)
    for one that is not valid."""
    if not isinstance(name, str) or not name:
        logger.warning("skipping an entry of the MCP server registry %s: bad server name %r", path, name)
        return None
    if not isinstance(params, dict):
        logger.warning(
            "skipping MCP server %r in the registry %s: its parameters are not a mapping", name, path
        )
        return None
    try:
        return dump_server_params(validate_server_params(name, params))
    except ServerParamsError as e:
        logger.warning("skipping MCP server %r in the registry %s: %s", name, path, e)
        return None


def _key(root_dir: Path) -> str:
    return str(Path(root_dir).resolve())


def _digest(server_params: Mapping[str, Any]) -> str:
    """SHA-256 of the parameters' canonical JSON: the same for a dict and its JSON round trip.

    Raises:
        TypeError: The parameters are not JSON.
    """
    canonical = json.dumps(server_params, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _forget_annotations(data: dict[str, Any], key: str, server_name: str) -> bool:
    """Drop the annotations recorded for a server (and sections left empty); whether there were any."""
    section = data.get(ANNOTATIONS_KEY)
    if not isinstance(section, dict):
        return False
    by_server = section.get(key)
    if not isinstance(by_server, dict) or by_server.pop(server_name, None) is None:
        return False
    if not by_server:
        del section[key]
    if not section:
        del data[ANNOTATIONS_KEY]
    return True


def _name_ok(name: Any) -> bool:
    return isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS


def _annotation_ok(name: Any, value: Any) -> bool:
    """A name and a bool or a short string; a hint (`readOnlyHint`, ...) a bool, never a (truthy) string."""
    if not _name_ok(name):
        return False
    if isinstance(value, bool):
        return True
    return isinstance(value, str) and len(value) <= MAX_VALUE_CHARS and not name.endswith("Hint")


def _recordable(server_name: str, annotations: Mapping[str, Mapping[str, Any]]) -> dict[str, ToolAnnotations]:
    """What is recorded of a listing's annotations: `str -> bool | str` entries within the limits, hints
    bools (and kept before strings when a tool declares too many); tools beyond `MAX_TOOLS` or with a
    bad name, not at all."""
    recorded: dict[str, ToolAnnotations] = {}
    for tool_name, values in annotations.items():
        if len(recorded) == MAX_TOOLS:
            logger.warning(
                "MCP server %r lists more than %d tools: the annotations of the others are not recorded",
                server_name,
                MAX_TOOLS,
            )
            break
        if not _name_ok(tool_name):
            continue
        kept = [(k, v) for k, v in values.items() if _annotation_ok(k, v)]
        kept.sort(key=lambda item: not isinstance(item[1], bool))  # stable: hints first, in their order
        recorded[tool_name] = dict(kept[:MAX_ANNOTATIONS])
    return recorded


def _read_annotations(
    server_name: str, entry: Any, server_params: Mapping[str, Any], path: Path
) -> dict[str, ToolAnnotations] | None:
    digest, tools = (
        (entry.get("params_sha256"), entry.get("tools")) if isinstance(entry, dict) else (None, None)
    )
    if not isinstance(digest, str) or not isinstance(tools, dict) or len(tools) > MAX_TOOLS:
        logger.warning(
            "ignoring the recorded tool annotations of MCP server %r in %s: malformed or too large",
            server_name,
            path,
        )
        return None
    try:
        # Compared as recorded: the model's dump of the parameters.
        if digest != _digest(dump_server_params(validate_server_params(server_name, server_params))):
            return None  # recorded for other parameters: another server may stand behind the name now
    except (TypeError, ValueError, ServerParamsError):
        return None
    valid: dict[str, ToolAnnotations] = {}
    bad: list[str] = []
    for tool_name, values in tools.items():
        if (
            _name_ok(tool_name)
            and isinstance(values, dict)
            and len(values) <= MAX_ANNOTATIONS
            and all(_annotation_ok(k, v) for k, v in values.items())
        ):
            valid[tool_name] = dict(values)
        else:
            bad.append(tool_name)
    if bad:
        logger.warning(
            "ignoring the recorded annotations of %d tool(s) of MCP server %r in %s (malformed): %s",
            len(bad),
            server_name,
            path,
            ", ".join(repr(name[:MAX_NAME_CHARS]) for name in bad[:5]) + (", ..." if len(bad) > 5 else ""),
        )
    return valid
