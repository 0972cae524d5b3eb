"""Which MCP tools a saved code action may call, found by parsing (never importing) its code.

An action's modules (`gentools/<category>/<name>/{__init__,api,impl}.py`, and any module of its own
package they import) are agent-written and kernel-writable: the host reads each at most `MAX_SOURCE_BYTES`,
never through a symlink (nor a FIFO), parses it with `ast` and never imports or runs it. What they import
is read as follows (names are bound per module, whatever the scope of the import):

- `from mcptools.<srv> import a, b` -> `srv.a`, `srv.b`; `from mcptools.<srv>.<tool> import run` and
  `import mcptools.<srv>.<tool> [as x]` -> `srv.<tool>`;
- a server package bound to a name (`from mcptools import srv`, `import mcptools.srv as m`, `import
  mcptools.srv`) -> `srv.<tool>` for each attribute use `m.<tool>`; `srv.*` when no attribute use is
  seen or the name is used otherwise (passed on, `getattr`): parsing cannot narrow that down;
  `from mcptools.<srv> import *` -> `srv.*`;
- `gentools.<category>.<name>` the same way -> the saved action `category.name`, whose calls are merged
  (followed transitively by `analyse_action`; a category used as a whole means each of its actions);
- relative imports resolve against the module's package: `from .impl import x` and `from . import impl`
  follow the action's own module, `from .. import other` is the action `category.other`;
- `ToolRunner`, `importlib`, `runpy`, `__import__`, `exec`, `eval`, a star import or other unnarrowable use
  of `mcptools`/`gentools` as a whole -> `dynamic`: the action may call any tool the rules allow.

The result is advice for people (status, the action's MCP tool description), not a security boundary:
approval rules apply to every call an action makes, whatever this says. Files that cannot be read or
parsed, cycles between actions and actions that do not exist are listed in `problems`
(`path:line:col: message`, paths relative to the workspace), never raised.
"""

from __future__ import annotations

import ast
import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ipybox.codeact.layout import API_MODULE, GENTOOLS, IMPL_MODULE, name_problem
from ipybox.safefs import DIR_FLAGS

MAX_SOURCE_BYTES: Final = 1 << 20
"""A module larger than this is not read (it is listed in `problems`); generated modules are ~2-6 KB."""

MAX_FOLLOWED_ACTIONS: Final = 256
"""At most this many saved actions are followed from one action (a bound on work, not a layout rule)."""

_MCPTOOLS: Final = "mcptools"
_DYNAMIC_NAMES: Final = frozenset({"ToolRunner", "__import__", "exec", "eval"})
_DYNAMIC_MODULES: Final = frozenset({"importlib", "runpy"})
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block
# The modules an action's package always has; more are followed when these import them.
_ACTION_MODULES: Final = ("__init__", API_MODULE, IMPL_MODULE)


@dataclass(frozen=True)
class ActionCalls:
    """What an action's code may call.

    Attributes:
        tools: `server.tool` for each generated tool module it uses, `server.*` where it uses a server
            package in a way parsing cannot narrow down; sorted.
        actions: `category.name` of the saved actions it uses (whose calls are included in `tools`);
            `category.*` from `analyse_source` for a category used as a whole.
        dynamic: It calls tools in a way parsing cannot follow (`ToolRunner`, `importlib`, `__import__`,
            `exec`/`eval`): it may call anything the rules allow.
        problems: Files that could not be parsed (`path:line:col: message`).
    """

    tools: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    dynamic: bool = False
    problems: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for status and tool descriptions: `github.search_repositories, github.list_commits`,
        with `, and any tool (dynamic calls)` when `dynamic`, or `no MCP tools`."""
        if self.tools:
            text = ", ".join(self.tools)
            if self.dynamic:
                text += ", and any tool (dynamic calls)"
        else:
            text = "any tool (dynamic calls)" if self.dynamic else "no MCP tools"
        if self.problems:
            count = len(self.problems)
            text += f" (incomplete: {count} problem{'s' if count != 1 else ''} analysing its code)"
        return text


def analyse_source(source: str, filename: str = "<impl.py>", *, module: str | None = None) -> ActionCalls:
    """The calls of one module's source (its `gentools` imports listed in `actions`, not followed).

    Args:
        source: The module's text.
        filename: Its path as problems name it.
        module: Its dotted name (`gentools.github.top_repos.impl`), to resolve relative imports; without
            it they are ignored.
    """
    found = _analyse(source, filename, module)
    actions = set(found.actions)
    actions.update(f"{category}.*" for category in found.categories)
    return ActionCalls(
        tools=tuple(sorted(found.tools)),
        actions=tuple(sorted(actions)),
        dynamic=found.dynamic,
        problems=tuple(found.problems),
    )


def analyse_action(gentools_dir: Path, category: str, name: str) -> ActionCalls:
    """The calls of the saved action `gentools_dir/category/name` (its `api.py` and `impl.py`), following
    the saved actions it uses (cycles and missing ones are problems, not errors)."""
    return _ActionWalk(gentools_dir).calls(category, name)


# -- One module.


@dataclass
class _Found:
    """What one module (or one action, merged) refers to."""

    tools: set[str] = field(default_factory=set)
    actions: dict[str, str] = field(default_factory=dict)  # `category.name` -> `path:line:col` of its import
    categories: dict[str, str] = field(default_factory=dict)  # used as a whole -> where
    own_modules: set[str] = field(default_factory=set)  # modules of the module's own action package
    dynamic: bool = False
    problems: list[str] = field(default_factory=list)


@dataclass
class _Binding:
    """A name an import bound: uses through it (`name.attr...`) are resolved at the end."""

    target: tuple[str, ...]  # e.g. ("mcptools",), ("mcptools", "github"), ("gentools", "cat", "name")
    # A package the import reached but did not narrow down (`import mcptools.srv`): a whole package
    # unless a use through the name reaches a tool (or action) in it.
    pending: tuple[str, ...] | None
    node: ast.stmt  # the import, for locations


def _analyse(source: str, filename: str, module: str | None) -> _Found:
    found = _Found()
    try:
        tree = ast.parse(source, filename=filename)
        _Module(found, module, filename).scan(tree)
    except SyntaxError as e:
        where = f"{filename}:{e.lineno or 1}:{e.offset or 1}"
        found.problems.append(f"{where}: SyntaxError: {e.msg}")
    except (RecursionError, MemoryError):
        found.problems.append(f"{filename}:1:1: too deeply nested to analyse")
    except ValueError as e:
        # Null bytes in the source: a SyntaxError from Python 3.11.4 on, a ValueError before (Debian 12's
        # 3.11.2), reported the same either way.
        found.problems.append(f"{filename}:1:1: SyntaxError: {e}")
    return found


class _Module:
    """Collects one module's imports and the uses of the names they bind (`ast.walk` is iterative: no
    recursion on deep trees)."""

    def __init__(self, found: _Found, module: str | None, filename: str) -> None:
        self.found = found
        self.filename = filename
        parts = tuple(module.split(".")) if module else ()
        # Relative imports resolve against the package (for a module in an action: the action's package).
        self.package = parts[:-1]
        self.own = self.package if len(self.package) == 3 and self.package[0] == GENTOOLS else None
        self.bindings: dict[str, list[_Binding]] = {}

    def scan(self, tree: ast.AST) -> None:
        nodes = list(ast.walk(tree))
        inner = {id(node.value) for node in nodes if isinstance(node, ast.Attribute)}
        uses: dict[str, list[tuple[str, ...]]] = {}  # bound name -> attribute chains used on it (() = bare)
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.import_(tuple(alias.name.split(".")), alias.asname, node)
            elif isinstance(node, ast.ImportFrom):
                self.import_from(node)
            elif isinstance(node, ast.Attribute):
                if node.attr == "ToolRunner":
                    self.found.dynamic = True
                if id(node) not in inner:
                    chain, root = _chain(node)
                    if root is not None:
                        uses.setdefault(root, []).append(chain)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in _DYNAMIC_NAMES:
                    self.found.dynamic = True
                if id(node) not in inner:
                    uses.setdefault(node.id, []).append(())
        for bound, bindings in self.bindings.items():
            chains = uses.get(bound, [])
            for binding in bindings:
                reached = [(*binding.target, *chain) for chain in chains]
                narrowed = False
                for path in reached:
                    self.reach(path, binding.node)
                    pending = binding.pending
                    if (
                        pending is not None
                        and path[: len(pending)] == pending
                        and len(path) >= self._narrow(path)
                    ):
                        narrowed = True
                if binding.pending is not None and not narrowed:
                    self.reach(binding.pending, binding.node)

    def import_(self, parts: tuple[str, ...], asname: str | None, node: ast.stmt) -> None:
        if parts[0] in _DYNAMIC_MODULES:
            self.found.dynamic = True
        if parts[0] not in (_MCPTOOLS, GENTOOLS):
            return
        # `import a.b.c as x` binds x to a.b.c; `import a.b.c` binds `a` (a.b.c reached through it).
        if asname is not None:
            self.bind(asname, parts, node)
        else:
            self.bind(parts[0], parts, node, target=parts[:1])

    def import_from(self, node: ast.ImportFrom) -> None:
        if node.level:
            if not self.package or node.level > len(self.package):
                return  # no package known to resolve against (or above the top): nothing to follow
            base = self.package[: len(self.package) - node.level + 1]
            parts = (*base, *(node.module.split(".") if node.module else ()))
        else:
            parts = tuple((node.module or "").split("."))
        if parts[0] in _DYNAMIC_MODULES:
            self.found.dynamic = True
        if any(alias.name == "ToolRunner" for alias in node.names):
            self.found.dynamic = True
        if parts[0] not in (_MCPTOOLS, GENTOOLS):
            return
        for alias in node.names:
            if alias.name == "*":
                self.reach(parts, node)
            else:
                # `from pkg import x`: x is a submodule of pkg or a name it defines.
                self.bind(alias.asname or alias.name, (*parts, alias.name), node)

    def bind(
        self, name: str, imported: tuple[str, ...], node: ast.stmt, target: tuple[str, ...] | None = None
    ) -> None:
        """An import of `imported`, binding `name` to `target` (by default `imported` itself)."""
        if len(imported) >= self._narrow(imported):
            # A tool module or an action (or something in one): reached by the import itself.
            self.reach(imported, node)
            pending = None
        else:
            pending = imported  # a package: narrowed down by the uses of `name`, if any
        self.bindings.setdefault(name, []).append(_Binding(target or imported, pending, node))

    def _narrow(self, parts: tuple[str, ...]) -> int:
        """How long a path must be to name one tool module, action or own module (what a use narrows to)."""
        if self.own is not None and parts[:3] == self.own:
            return 4
        return 3

    def reach(self, parts: tuple[str, ...], node: ast.stmt) -> None:
        """Record that the code reaches the dotted path `parts`: a tool module or an action (or a name in
        one), or a package as a whole."""
        where = f"{self.filename}:{node.lineno}:{node.col_offset + 1}"
        if not parts or parts[0] not in (_MCPTOOLS, GENTOOLS):
            return
        if self.own is not None and parts[:3] == self.own:
            if len(parts) > 3 and not parts[3].startswith("__"):
                self.found.own_modules.add(parts[3])
            else:  # the package as a whole, or a name it defines: all its modules
                self.found.own_modules.update(_ACTION_MODULES)
            return
        dunder = len(parts) > 2 and parts[2].startswith("__")
        if len(parts) == 1:
            self.found.dynamic = True  # all of mcptools/gentools, used in a way parsing cannot follow
        elif parts[0] == _MCPTOOLS:
            self.found.tools.add(f"{parts[1]}.{'*' if len(parts) == 2 or dunder else parts[2]}")
        elif len(parts) == 2 or dunder:
            self.found.categories.setdefault(parts[1], where)
        else:
            self.found.actions.setdefault(f"{parts[1]}.{parts[2]}", where)


def _chain(node: ast.Attribute) -> tuple[tuple[str, ...], str | None]:
    """`a.b.c` -> (("b", "c"), "a"); the root is None when the chain starts on something else."""
    attrs: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        attrs.append(current.attr)
        current = current.value
    root = current.id if isinstance(current, ast.Name) else None
    return tuple(reversed(attrs)), root


# -- An action, and the actions it uses.


class _ActionWalk:
    """Analyses one action under a `gentools/` directory and, depth first, the actions it uses."""

    def __init__(self, gentools_dir: Path) -> None:
        self.gentools_dir = gentools_dir
        self.shown = Path(GENTOOLS)  # problems name paths relative to the workspace
        self.problems: list[str] = []

    def calls(self, category: str, name: str) -> ActionCalls:
        root = f"{category}.{name}"
        tools: set[str] = set()
        actions: set[str] = set()
        dynamic = False
        seen: set[str] = set()
        # An explicit stack (no recursion on long chains of actions). Each entry: the action, the chain
        # of actions that led to it (to name a cycle), and where the last of them imports it.
        stack: list[tuple[str, tuple[str, ...], str | None]] = [(root, (), None)]
        while stack:
            action, chain, where = stack.pop()
            if action in chain:
                cycle = " -> ".join((*chain[chain.index(action) :], action))
                self.problems.append(f"{where}: import cycle between saved actions: {cycle}")
                continue
            if action in seen:
                continue
            if len(seen) >= MAX_FOLLOWED_ACTIONS:
                self.problems.append(
                    f"{where}: more than {MAX_FOLLOWED_ACTIONS} saved actions used: the rest were not analysed"
                )
                dynamic = True
                break
            seen.add(action)
            found = self._action(action, where)
            if found is None:
                continue
            tools |= found.tools
            dynamic |= found.dynamic
            if action != root:
                actions.add(action)
            used = dict(found.actions)
            for category_name, used_at in found.categories.items():
                for member in self._category_members(category_name, used_at):
                    used.setdefault(f"{category_name}.{member}", used_at)
            # Pushed in reverse, so the first (sorted) is analysed first: problems come in a stable order.
            for other in sorted(used, reverse=True):
                stack.append((other, (*chain, action), used[other]))
        return ActionCalls(
            tools=tuple(sorted(tools)),
            actions=tuple(sorted(actions)),
            dynamic=dynamic,
            problems=tuple(dict.fromkeys(self.problems)),
        )

    def _action(self, action: str, imported_at: str | None) -> _Found | None:
        """One action's modules, merged (`None` if it does not exist: a problem)."""
        category, _, name = action.partition(".")
        shown = self.shown / category / name
        where = imported_at or str(shown)
        problem = name_problem(category, "category") or name_problem(name, "action name")
        if problem is not None:  # never a path built from it
            self.problems.append(f"{where}: no such saved action {action!r}: {problem}")
            return None
        try:
            dir_fd = _open_dirs(self.gentools_dir, category, name)
        except OSError as e:
            reason = "a symlink, not followed" if e.errno in (errno.ELOOP, errno.ENOTDIR) else "missing"
            self.problems.append(f"{where}: no such saved action {action!r} ({shown}: {reason})")
            return None
        found = _Found()
        try:
            queue = list(_ACTION_MODULES)
            done: set[str] = set()
            while queue:
                module = queue.pop(0)
                if module in done:
                    continue
                done.add(module)
                path = str(shown / f"{module}.py")
                try:
                    source = _read_source(dir_fd, f"{module}.py")
                except FileNotFoundError:
                    # Other names its modules import from the package may be names `__init__` defines.
                    if module in (API_MODULE, IMPL_MODULE):
                        self.problems.append(f"{path}:1:1: missing: an action has api.py and impl.py")
                    continue
                except (OSError, ValueError) as e:
                    self.problems.append(f"{path}:1:1: not analysed: {_reason(e)}")
                    continue
                # `__init__` is the package itself: its relative imports resolve against the package too.
                one = _analyse(source, path, f"{GENTOOLS}.{category}.{name}.{module}")
                found.tools |= one.tools
                found.dynamic |= one.dynamic
                for key, at in one.actions.items():
                    found.actions.setdefault(key, at)
                for key, at in one.categories.items():
                    found.categories.setdefault(key, at)
                self.problems.extend(one.problems)
                queue.extend(sorted(m for m in one.own_modules - done if m.isidentifier()))
        finally:
            os.close(dir_fd)
        return found

    def _category_members(self, category: str, used_at: str) -> list[str]:
        """The actions of a category used as a whole (directories with a valid name, not symlinks)."""
        if name_problem(category, "category") is None:
            try:
                category_fd = _open_dirs(self.gentools_dir, category)
            except OSError:
                pass
            else:
                try:
                    with os.scandir(category_fd) as entries:
                        names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
                finally:
                    os.close(category_fd)
                return sorted(n for n in names if name_problem(n, "action name") is None)
        self.problems.append(f"{used_at}: no such category of saved actions {category!r}")
        return []


def _open_dirs(base: Path, *names: str) -> int:
    """A descriptor of `base/names...`, opened one directory at a time, never through a symlink."""
    fd = os.open(base, DIR_FLAGS)
    for name in names:
        try:
            next_fd = os.open(name, DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = next_fd
    return fd


def _read_source(dir_fd: int, filename: str) -> str:
    """A module's text: a regular file in `dir_fd` (not through a symlink), at most `MAX_SOURCE_BYTES`.

    Raises:
        FileNotFoundError: It does not exist.
        OSError: It is a symlink or not a regular file.
        ValueError: It is too large, or not UTF-8.
    """
    fd = os.open(filename, _READ_FLAGS, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if info.st_size > MAX_SOURCE_BYTES:
            raise ValueError(f"larger than {MAX_SOURCE_BYTES} bytes")
        data = file.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise ValueError(f"larger than {MAX_SOURCE_BYTES} bytes")
    return data.decode("utf-8")


def _reason(error: OSError | ValueError) -> str:
    if isinstance(error, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(error, OSError):
        if error.errno == errno.ELOOP:
            return "a symlink (not followed)"
        return error.strerror or str(error)
    return str(error)
