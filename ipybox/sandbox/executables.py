"""What the host executes from a workspace: derived from how it starts things, so kernels can't change it.

The protected names (`DEFAULT_DENY_WRITE`) are a fixed list; the host also runs code that lives in the
workspace under other names: an MCP server's command and script, the modules they import, the interpreter
ipybox itself runs on. A kernel that could write any of them runs its code on the host the next time that
starts (a `.pth` in a venv's site-packages, a rewritten `server.py`, a `__pycache__/*.pyc` whose header
matches the source), with the server's `${VAR}` secrets. This module derives those paths; the caller
makes them read-only to kernels (`denyWrite` entries of the kernels' policy, see `deny_write_entries`)
and to sandboxed servers, and refuses to start a server whose code a kernel could still write
(`kernel_writable`).

Derived, for a stdio server (`server_executables`); paths outside the workspace are listed too, to be
checked (a kernel writes there only in `allowWrite`), and those inside it are the ones to protect
(`Derived.protected`):

- its command, as the host resolves it: relative to its `cwd` when it holds a `/`, else through the `PATH`
  it runs with (every `PATH` entry in the workspace too: a kernel would plant the command in an earlier
  one); a command inside a virtual environment (`pyvenv.cfg` above its `bin/`) protects that environment;
- its file arguments (relative to its `cwd`): code (a script suffix, an executable file, the script an
  interpreter runs) protects its directory when that is a subdirectory of the workspace; at the
  workspace's top level it protects the file, `__pycache__` (a `.pyc` with a matching header is run
  instead of its source), the top-level files of its kind (`*.py`, ...) and the top-level packages a
  Python script imports by name (found with `ast`, never run); a JavaScript file also protects
  `node_modules` in each directory between it and the workspace (Node looks there first). Other files (a
  config file) are protected themselves;
- a `-m module`: its top-level package or module in the `cwd`, as a top-level script;
- its `cwd` when that is a subdirectory of the workspace (Python puts it on `sys.path` for `-m`, npx and
  uv read their project files there), and for a package runner (`npx`, `uv`, ...) its project files
  (`package.json`, `pyproject.toml`, locks, `.npmrc`) in every directory from its `cwd` up to the
  workspace;
- the `PYTHONPATH`, `NODE_PATH` and `LD_LIBRARY_PATH` entries and `LD_PRELOAD` files of its environment.

For the interpreter ipybox runs on (`interpreter_executables`): `sys.prefix`, `sys.exec_prefix`,
`sys.base_prefix`, the executable's directory (also behind symlinks), site-packages and each `sys.path`
entry strictly inside the workspace; for a `sys.path` entry that is the workspace itself (an editable
checkout), the top-level package or module of each loaded module that lives there (`ipybox/`).

What can't be derived is reported, not guessed (`Derived.unprotected`, which `ipybox doctor` prints): a
script at the workspace's top level resolves its imports from there first, so a kernel could turn any
top-level directory into a package its dependencies import; ipybox can't know them all, and says to move
the script into a directory of its own.

Paths are absolute and normalised, not resolved: a symlink is protected together with its target (see
[view][ipybox.sandbox.view]). Nothing here starts a process; it reads the filesystem (to resolve commands,
find `pyvenv.cfg`, list top-level files) and parses Python sources.
"""

from __future__ import annotations

import ast
import glob
import os
import posixpath
import re
import site
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from ipybox.sandbox.view import View

_PYTHON = re.compile(r"(python|pypy)[0-9.]*(\.exe)?")
_NODE = frozenset({"node", "nodejs", "bun", "deno", "tsx", "ts-node"})
# Package runners that read their project's files in the directory they run in and its parents.
_RUNNERS = frozenset(
    {"npx", "npm", "pnpm", "pnpx", "yarn", "bunx", "bun", "uv", "uvx", "poetry", "pdm", "hatch", "pipenv"}
)
_PROJECT_FILES = (
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "pnpm-lock.yaml",
    "yarn.lock",
    ".yarnrc.yml",
    ".npmrc",
    "bun.lock",
    "bun.lockb",
    "pyproject.toml",
    "uv.lock",
    "uv.toml",
    "poetry.lock",
    "pdm.lock",
    "Pipfile",
    "Pipfile.lock",
    ".python-version",
)
_PY_SUFFIXES = (".py", ".pyw")
_JS_SUFFIXES = (".js", ".mjs", ".cjs", ".ts", ".mts", ".cts")
_CODE_SUFFIXES = (*_PY_SUFFIXES, *_JS_SUFFIXES, ".sh", ".bash", ".rb", ".pl", ".php", ".lua")
# Python and Node options whose next argument is not the script.
_VALUE_OPTIONS = frozenset({"-W", "-X", "-Q", "--check-hash-based-pycs", "-r", "--require", "--import"})
# Search paths of the environment, with the kind of file found there.
_PATH_LISTS = {"PYTHONPATH": ".py", "NODE_PATH": ".js", "LD_LIBRARY_PATH": ".so"}
_FILE_LISTS = ("LD_PRELOAD",)


@dataclass(frozen=True)
class Executed:
    """A path the host (or a server it starts) executes or imports.

    Attributes:
        path: Absolute and normalised: a file or directory (everything below it counts), or the directory
            whose names `pattern` matches.
        why: What executes it, for messages (`server 'x': its command`).
        pattern: A glob of names directly in `path` (`*.py`), or empty for `path` itself.
    """

    path: str
    why: str
    pattern: str = ""

    def entry(self) -> str:
        """As a `denyWrite` entry: absolute, the path taken literally and `pattern` as a glob."""
        literal = glob.escape(self.path)
        return posixpath.join(literal, self.pattern) if self.pattern else literal

    def shown(self) -> str:
        return posixpath.join(self.path, self.pattern) if self.pattern else self.path


@dataclass
class Derived:
    """What was derived.

    Attributes:
        workspace: The workspace derived for.
        executed: Every path found, inside the workspace or not (`kernel_writable` checks them all).
        unprotected: What could not be derived, one line each naming the fix.
    """

    workspace: str
    executed: list[Executed] = field(default_factory=list)
    unprotected: list[str] = field(default_factory=list)

    @property
    def protected(self) -> list[Executed]:
        """The paths inside the workspace: the ones to make read-only to kernels."""
        return [item for item in self.executed if _under(item.path, self.workspace)]

    def extend(self, other: Derived) -> None:
        self.executed += other.executed
        self.unprotected += [line for line in other.unprotected if line not in self.unprotected]


def deny_write_entries(executed: Iterable[Executed]) -> list[str]:
    """`denyWrite` entries for `executed`, without duplicates, in order."""
    return list(dict.fromkeys(item.entry() for item in executed))


def server_executables(
    name: str,
    command: str,
    args: Sequence[str],
    environ: Mapping[str, str],
    cwd: str,
    workspace: str,
) -> Derived:
    """What a stdio server executes inside `workspace` (see the module).

    Args:
        name: The server's name, for `why`.
        command: Its command, placeholders filled in.
        args: Its arguments.
        environ: The whole environment it runs with (`PATH` included).
        cwd: Its working directory (absolute).
        workspace: The workspace (absolute).
    """
    ws = _norm(workspace)
    cwd = _norm(posixpath.join(ws, cwd))
    found = _Finder(ws, f"server {name!r}")
    if _strictly_under(cwd, ws):
        found.add(cwd, "its working directory (cwd)")
    path_dirs = [
        _norm(posixpath.join(cwd, entry or ".")) for entry in environ.get("PATH", os.defpath).split(":")
    ]
    for directory in path_dirs:
        found.directory(directory, "a PATH entry", "")
    program = _resolve_command(command, cwd, path_dirs)
    if program is not None:
        found.program(program)
    base = posixpath.basename(command)
    if base in _RUNNERS:
        directory = cwd
        while _under(directory, ws):
            for project_file in _PROJECT_FILES:
                found.add(posixpath.join(directory, project_file), f"a project file {base} reads")
            if directory == ws:
                break
            directory = posixpath.dirname(directory)
    interpreter = bool(_PYTHON.fullmatch(base)) or base in _NODE
    found.arguments(list(args), cwd, python=bool(_PYTHON.fullmatch(base)), interpreter=interpreter)
    for variable, suffix in _PATH_LISTS.items():
        for entry in filter(None, environ.get(variable, "").split(os.pathsep)):
            found.directory(_norm(posixpath.join(cwd, entry)), f"a {variable} entry", suffix)
    for variable in _FILE_LISTS:
        for entry in filter(None, re.split(r"[\s:]+", environ.get(variable, ""))):
            found.add(_norm(posixpath.join(cwd, entry)), f"a {variable} file")
    return found.derived


def interpreter_executables(workspace: str) -> Derived:
    """What the interpreter ipybox runs on executes inside `workspace` (see the module)."""
    ws = _norm(workspace)
    found = _Finder(ws, "ipybox's Python")
    for prefix in dict.fromkeys((sys.prefix, sys.exec_prefix, sys.base_prefix)):
        found.directory(_norm(prefix), "its environment", ".py")
    for executable in dict.fromkeys((sys.executable, os.path.realpath(sys.executable))):
        if executable:
            found.directory(posixpath.dirname(_norm(executable)), "its interpreter's directory", "")
    packages = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    for directory in packages:
        found.directory(_norm(directory), "its site-packages", ".py")
    for entry in sys.path:
        if entry and _norm(entry) != ws:
            found.directory(_norm(entry), "an entry of its sys.path", ".py")
    if any(entry and _norm(entry) == ws for entry in sys.path):
        for module in list(sys.modules.values()):
            file = getattr(module, "__file__", None)
            if isinstance(file, str) and _strictly_under(_norm(file), ws):
                top = posixpath.join(ws, posixpath.relpath(_norm(file), ws).split("/")[0])
                found.add(top, "a module it imported from the workspace (on its sys.path)")
                if top.endswith(_PY_SUFFIXES):
                    found.add(posixpath.join(ws, "__pycache__"), "compiled modules it imports")
        found.derived.unprotected.append(
            f"the workspace {ws} is on the sys.path of the Python ipybox runs on (an editable install?): "
            "ipybox protects the modules it has imported from there, not ones it may import later; "
            "install ipybox elsewhere, or use another directory as the workspace"
        )
    return found.derived


def kernel_writable(executed: Iterable[Executed], view: View) -> list[str]:
    """The paths of `executed` that a process confined by `view` could write (or create), each once.

    A path is writable when it, or what it resolves to, lies in the view's workspace or writable paths and
    no protected or hidden rule covers it; a name missing at the workspace's top level is not (that
    listing is fixed). A pattern's existing matches are checked.
    """
    workspace = os.path.realpath(view.workspace)
    roots = [workspace, *(os.path.realpath(path) for path in view.writable)]
    rules = [
        (os.path.realpath(rule.base), rule.pattern.strip("/")) for rule in (*view.protected, *view.hidden)
    ]
    found: dict[str, None] = {}
    for item in executed:
        paths = [item.path]
        if item.pattern:
            paths = _glob_in(item.path, item.pattern)
        for path in paths:
            for candidate in dict.fromkeys((_norm(path), os.path.realpath(path))):
                if _may_write(candidate, workspace, roots, rules):
                    found.setdefault(item.shown() if item.pattern else path, None)
    return list(found)


def _may_write(path: str, workspace: str, roots: list[str], rules: list[tuple[str, str]]) -> bool:
    real_parent = os.path.realpath(posixpath.dirname(path))
    path = posixpath.join(real_parent, posixpath.basename(path))
    if not any(_under(path, root) for root in roots):
        return False
    if real_parent == workspace and not os.path.lexists(path):
        return False  # the workspace's top level is fixed when a sandbox starts
    return not any(_covers(base, pattern, path) for base, pattern in rules)


def _covers(base: str, pattern: str, path: str) -> bool:
    if not _under(path, base):
        return False
    if not pattern:
        return True
    parts = posixpath.relpath(path, base).split("/") if path != base else []
    wanted = pattern.split("/")
    return len(parts) >= len(wanted) and all(fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=False))


class _Finder:
    """Collects the paths of one derivation, each inside the workspace."""

    def __init__(self, workspace: str, who: str) -> None:
        self.ws = workspace
        self.who = who
        self.derived = Derived(workspace)

    def add(self, path: str, why: str, pattern: str = "") -> None:
        if path != self.ws or pattern:  # the workspace itself is never protected whole
            self.derived.executed.append(Executed(path, f"{self.who}: {why}", pattern))

    def directory(self, directory: str, why: str, suffix: str) -> None:
        """A directory whose contents run (`suffix`: the kind of file found there): itself, but for the
        workspace, which can't be protected whole: its top-level code is, and the rest is reported."""
        if directory != self.ws:
            self.add(directory, why)
            return
        self.top_level(suffix, why)
        self.derived.unprotected.append(
            f"{self.who}: {why} is the workspace itself, where a kernel can change every top-level "
            "directory and file that ipybox can't tell is code; name a directory of its own instead"
        )

    def program(self, program: str) -> None:
        """The command, resolved."""
        for path in dict.fromkeys((program, os.path.realpath(program))):
            venv = _venv_of(path)
            if venv is not None:
                self.add(venv, "the virtual environment of its command")
            else:
                self.code(path, "its command")

    def code(self, file: str, why: str) -> None:
        parent = posixpath.dirname(file)
        if not _under(file, self.ws):
            self.add(file, why)  # checked, not protected: outside, a kernel writes only allowWrite
            return
        if _strictly_under(parent, self.ws):
            self.add(parent, f"the directory of {why} ({posixpath.relpath(file, self.ws)})")
        else:
            self.add(file, why)
            suffix = posixpath.splitext(file)[1]
            self.top_level(suffix if suffix in _CODE_SUFFIXES else "", why)
            self.derived.unprotected.append(
                f"{self.who}: {why} {posixpath.relpath(file, self.ws)} is at the workspace's top level, "
                "where it finds the modules it imports first; ipybox protects the top-level files and "
                "packages it sees it use, not ones its dependencies import; move "
                f"{posixpath.basename(file)} into a directory of its own (and set cwd or its path to it)"
            )
        if file.endswith(_JS_SUFFIXES):
            directory = parent
            while _strictly_under(directory, self.ws):
                directory = posixpath.dirname(directory)
                if directory != self.ws:
                    self.add(directory, "where Node looks for the packages it imports", "node_modules")

    def top_level(self, suffix: str, why: str) -> None:
        """The top-level code that a program running from the workspace root finds there."""
        if suffix in _PY_SUFFIXES or suffix == "":
            self.add(posixpath.join(self.ws, "__pycache__"), f"compiled modules ({why})")
        if suffix in _PY_SUFFIXES:
            self.add(self.ws, f"top-level modules ({why})", "*.py")
            for name in _imported_packages(self.ws):
                self.add(posixpath.join(self.ws, name), f"a package imported at the top level ({why})")
        elif suffix:
            self.add(self.ws, f"top-level files of its kind ({why})", f"*{suffix}")

    def arguments(self, args: list[str], cwd: str, *, python: bool, interpreter: bool) -> None:
        script_seen = not interpreter
        skip_next = False
        module_next = False
        for arg in args:
            if skip_next:
                skip_next = False
                if arg and not arg.startswith("-"):
                    self.file(_norm(posixpath.join(cwd, arg)), "a module it preloads", code=True)
                continue
            if module_next:
                module_next = False
                self.module(arg, cwd)
                script_seen = True
                continue
            if python and arg == "-m":
                module_next = not script_seen
                continue
            if not script_seen and arg in _VALUE_OPTIONS:
                skip_next = True
                continue
            for value in _values(arg):
                path = _norm(posixpath.join(cwd, value))
                if not os.path.isfile(path):
                    continue
                is_script = not script_seen and not arg.startswith("-")
                self.file(path, "its script" if is_script else "a file it is given", code=is_script)
            if not arg.startswith("-"):
                script_seen = True

    def file(self, path: str, why: str, *, code: bool) -> None:
        executable = os.path.isfile(path) and os.access(path, os.X_OK)
        if code or path.endswith(_CODE_SUFFIXES) or executable:
            self.code(path, why)
        else:
            self.add(path, why)

    def module(self, module: str, cwd: str) -> None:
        """`-m module`: found in `cwd` first (in a subdirectory, the cwd itself is protected)."""
        top = module.split(".")[0]
        if not top or cwd != self.ws:
            return
        why = f"the module it runs (-m {module})"
        for candidate in (top, f"{top}.py"):
            self.add(posixpath.join(cwd, candidate), why)
        self.top_level(".py", why)
        self.derived.unprotected.append(
            f"{self.who}: {why} is found at the workspace's top level, like the modules it imports; ipybox "
            "protects the top-level files and packages it sees it use, not ones its dependencies import; "
            f"move {top} into a directory of its own and set cwd to it"
        )


def _values(arg: str) -> list[str]:
    if arg.startswith("-"):
        return [arg.split("=", 1)[1]] if "=" in arg else []
    return [arg]


def _resolve_command(command: str, cwd: str, path_dirs: list[str]) -> str | None:
    """The file the host runs for `command`, as `execvp` in `cwd` would find it (`None`: not found)."""
    if "/" in command:
        return _norm(posixpath.join(cwd, command))
    for directory in path_dirs:
        candidate = posixpath.join(directory, command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _venv_of(path: str) -> str | None:
    """The virtual environment whose `bin/` (or `Scripts/`) holds `path`, if any."""
    directory = posixpath.dirname(path)
    if posixpath.basename(directory) in ("bin", "Scripts"):
        root = posixpath.dirname(directory)
        if os.path.isfile(posixpath.join(root, "pyvenv.cfg")):
            return root
    return None


def _imported_packages(workspace: str) -> list[str]:
    """Top-level directories of `workspace` that its top-level Python files import by name (`ast`)."""
    names: set[str] = set()
    for file in _glob_in(workspace, "*.py"):
        try:
            tree = ast.parse(Path(file).read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return sorted(name for name in names if os.path.isdir(posixpath.join(workspace, name)))


def _glob_in(base: str, pattern: str) -> list[str]:
    return sorted(glob.glob(posixpath.join(glob.escape(base), pattern), include_hidden=True))


def _norm(path: str) -> str:
    return posixpath.normpath(os.path.abspath(path))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _strictly_under(path: str, root: str) -> bool:
    return path != root and _under(path, root)


__all__ = [
    "Derived",
    "Executed",
    "deny_write_entries",
    "interpreter_executables",
    "kernel_writable",
    "server_executables",
]
