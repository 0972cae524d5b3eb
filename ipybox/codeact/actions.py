"""Saved code actions: `gentools/<category>/<name>/` (see `ipybox.codeact`).

An action is what an agent wrote and wants to call again: `api.py` (its interface: `Params` if `run()`
takes arguments, a result model, `run()` with a docstring) and `impl.py` (its composition of `mcptools`
and other `gentools`). `save_code_action` makes it a package:

    gentools/__init__.py                 index of categories (generated)
    gentools/<category>/__init__.py      index: one line per action (generated, like mcptools/<server>/)
    gentools/<category>/<name>/
        __init__.py                      re-exports `run`, `Params` and api.py's models (generated)
        api.py, impl.py                  exactly as given
        action.json                      the manifest: what a fresh kernel found in api.py (`run()`'s
                                         docstring and signature, input/output JSON Schemas), with the
                                         sha256 of the api.py it describes and the ipybox version

Contract of `save_code_action`:
- Everything that can be checked without a kernel is checked before the disk is touched: the names
  (`layout.name_problem`), sizes (`MAX_SOURCE_BYTES`), syntax (`ast`, with line and column), the layout
  of api.py (a top-level `def run` with a docstring, `Params` when `run()` takes an argument), an
  existing action (replaced only with `overwrite=True`) and a module the action would shadow
  (`gentools/<category>/<name>.py`).
- The package is written into a staging directory next to its target (`.<name>.tmp-<pid>_<hex>`, which
  `ipybox.mcp_apigen.package.remove_stale_work_dirs` removes when its process is gone) and imported
  there, under its final name, in a fresh kernel (`ipybox.codeact.checks`): the host parses agent code
  and never imports or runs it. Only a package that imports and matches the layout is renamed into
  place; a kernel never sees a half-written action. Any problem raises `CodeActionError` with every
  problem as `gentools/<category>/<name>/impl.py:LINE:COL: NameError: ...` (the staging directory never
  appears) and leaves nothing behind (directories it made on the way are removed again).
- `gentools/` may have been written by kernels: it is worked in through descriptors opened without
  following symlinks, files are created new (`O_EXCL|O_NOFOLLOW`) or replaced by rename. A symlink where
  ipybox writes (`gentools`, `gentools/<category>`, the action) raises `SymlinkRefusedError`, and
  nothing is written through it.
- Indexes are rewritten from what is on disk after each save: names that are not action names, symlinks
  and hidden entries are not listed; descriptions come from api.py's `run()` docstring by parsing, and
  reach the generated files only through `ipybox.mcp_apigen.literals`.

`read_actions` and `describe_actions` serve whoever lists actions (the MCP server's tools): a manifest is
untrusted (size-capped, validated); one that is missing, invalid or describes another api.py (edited by
hand) makes the action stale, and `describe_actions` describes stale ones in one fresh kernel.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import functools
import hashlib
import importlib.metadata
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final, Literal

import jinja2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ipybox.codeact import layout
from ipybox.codeact.analysis import ActionCalls, analyse_action
from ipybox.codeact.checks import CheckOutputError, CheckProblem, RunCheck, check_code, parse_check_output
from ipybox.errors import IpyboxError, KernelError
from ipybox.mcp_apigen.literals import docstring, first_line
from ipybox.mcp_apigen.package import make_temp_dir, remove_stale_work_dirs, swap_in, symlink_refused
from ipybox.mcp_apigen.parsers import module_bindings
from ipybox.mcp_apigen.render import template_environment
from ipybox.safefs import DIR_FLAGS, NEW_FILE_FLAGS, replace_file

__all__ = [
    "MAX_MANIFEST_BYTES",
    "MAX_SOURCE_BYTES",
    "ActionListing",
    "CodeActionError",
    "SavedAction",
    "api_digest",
    "describe_actions",
    "read_actions",
    "save_code_action",
]

logger = logging.getLogger(__name__)

MAX_SOURCE_BYTES: Final = 256 * 1024
"""The largest api.py or impl.py (UTF-8) `save_code_action` accepts, and the host ever reads."""
MAX_MANIFEST_BYTES: Final = 1 << 20
"""A manifest larger than this is not read (the action is stale)."""
MANIFEST_FORMAT: Final = 1

_API_FILE: Final = f"{layout.API_MODULE}.py"
_IMPL_FILE: Final = f"{layout.IMPL_MODULE}.py"
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block
_TEMPLATES: Final = Path(__file__).parent / "templates"
_SEGMENT: Final = "ipybox-describe-action:"
# The entries the action's `__init__.py` never re-exports: its own submodules' names.
_NOT_EXPORTED: Final = frozenset({layout.API_MODULE, layout.IMPL_MODULE})


@functools.cache
def _version() -> str:
    # Not `ipybox.__version__`: the root package re-exports the layers above this one.
    try:
        return importlib.metadata.version("ipybox")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class CodeActionError(IpyboxError, ValueError):
    """A code action was not saved: a bad name, code that does not match the layout or does not import,
    or an existing action without `overwrite=True`. The message says which, where (`path:line:col`) and
    what to do; nothing was written."""


@dataclass(frozen=True)
class SavedAction:
    """A saved action as its manifest describes it.

    Attributes:
        category, name: Its names (`gentools/<category>/<name>/`).
        path: Its directory.
        module: Its package (`gentools.<category>.<name>`).
        tool_name: Its MCP tool name (`<category>__<name>`).
        description: `run()`'s docstring.
        signature: `run(params: Params) -> Result`.
        input_schema: JSON Schema of `Params` (an empty object schema when it takes none).
        output_schema: JSON Schema of its result model, if `run()` returns one.
        takes_params: Whether `run()` takes `Params`.
        is_async: Whether `run()` is a coroutine function.
        calls: What it may call (`analysis.analyse_action`).
    """

    category: str
    name: str
    path: Path
    module: str
    tool_name: str
    description: str
    signature: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    takes_params: bool
    is_async: bool
    calls: ActionCalls = field(default_factory=ActionCalls)


@dataclass(frozen=True)
class ActionListing:
    """The actions under a `gentools/` directory: those whose manifest matches their `api.py`, and those
    (`stale`: `(category, name)`) whose manifest is missing or describes another `api.py` (edited by hand)."""

    actions: list[SavedAction]
    stale: list[tuple[str, str]]


class _Described(BaseModel):
    """What `ipybox.in_kernel.import_check` reports about an action's api (untrusted: kernel output)."""

    model_config = ConfigDict(extra="ignore")

    doc: str = Field(max_length=MAX_SOURCE_BYTES)
    signature: str = Field(max_length=MAX_SOURCE_BYTES)
    takes_params: bool
    is_async: bool
    returns: str | None = Field(default=None, max_length=MAX_SOURCE_BYTES)
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None


class _Manifest(_Described):
    """`action.json` (untrusted when read back: a kernel may have written it)."""

    format: Literal[1] = MANIFEST_FORMAT
    ipybox: str = Field(default_factory=lambda: _version(), max_length=100)
    api_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


# -- checks without a kernel ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Api:
    """What parsing api.py found: the names its package re-exports, and how `run()` is called."""

    exports: tuple[str, ...]
    takes_params: bool
    is_async: bool
    doc: str


def _problem(where: str, node: ast.stmt | None, message: str) -> str:
    if node is None:
        return f"{where}: {message}"
    return f"{where}:{node.lineno}:{node.col_offset + 1}: {message}"


def _parse(source: object, where: str, problems: list[str]) -> ast.Module | None:
    """`source` parsed, or `None` with the reason in `problems`."""
    if not isinstance(source, str):
        problems.append(f"{where}: must be Python source text, not {type(source).__name__}")
        return None
    try:
        size = len(source.encode("utf-8"))
    except UnicodeEncodeError as e:
        problems.append(f"{where}: is not valid text ({e.reason} at character {e.start})")
        return None
    if size > MAX_SOURCE_BYTES:
        problems.append(
            f"{where}: is {size} bytes, more than the {MAX_SOURCE_BYTES} a saved action's file may have: "
            "split it into smaller actions"
        )
        return None
    try:
        return ast.parse(source, filename=where)
    except SyntaxError as e:
        position = f":{e.lineno}:{e.offset}" if e.lineno is not None and e.offset is not None else ""
        problems.append(f"{where}{position}: {type(e).__name__}: {e.msg}")
    except ValueError as e:  # null bytes (a SyntaxError from Python 3.12 on)
        problems.append(f"{where}: SyntaxError: {e}")
    return None


def _required_parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    required = [a.arg for a in positional[: len(positional) - len(arguments.defaults)]]
    required += [a.arg for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d is None]
    return required


def _check_api(tree: ast.Module, where: str, problems: list[str]) -> _Api | None:
    """The layout of api.py (mirroring what a kernel checks in `import_check._describe`, with positions)."""
    names, star = module_bindings(tree.body)
    run = names.get("run")
    if not isinstance(run, ast.FunctionDef | ast.AsyncFunctionDef):
        problems.append(
            _problem(where, run, "run must be a function defined in api.py")
            if run is not None
            else f"{where}: defines no run(): an action's api.py defines `def run(params: Params) -> Result` "
            "(or `def run() -> Result` without arguments), with a docstring"
        )
        return None
    doc = ast.get_docstring(run) or ""
    before = len(problems)
    if not doc.strip():
        problems.append(
            _problem(
                where, run, "run() needs a docstring: it is what agents read (and the MCP tool's description)"
            )
        )
    required = _required_parameters(run)
    has_params = "Params" in names
    if has_params and len(required) != 1:
        problems.append(
            _problem(where, run, "run() must take one argument, params: Params (api.py defines Params)")
        )
    if not has_params and required and not star:
        problems.append(
            _problem(
                where,
                run,
                f"run() takes arguments ({', '.join(required)}), so api.py must define them as a pydantic model "
                "`class Params(BaseModel)` and run() must take `params: Params`",
            )
        )
    if len(problems) > before:
        return None
    exports = ["run"] + (["Params"] if has_params else [])
    returns = run.returns
    if isinstance(returns, ast.Constant) and isinstance(returns.value, str):  # a string annotation
        with contextlib.suppress(SyntaxError):
            returns = ast.parse(returns.value, mode="eval").body
    if isinstance(returns, ast.Name) and returns.id in names:
        exports.append(returns.id)
    exports += sorted(name for name, node in names.items() if isinstance(node, ast.ClassDef))
    exports = [n for n in dict.fromkeys(exports) if not n.startswith("_") and n not in _NOT_EXPORTED]
    return _Api(tuple(exports), has_params, isinstance(run, ast.AsyncFunctionDef), doc)


def _static_check(api: object, impl: object, shown: Callable[[str], str]) -> tuple[_Api | None, list[str]]:
    problems: list[str] = []
    api_tree = _parse(api, shown(_API_FILE), problems)
    info = _check_api(api_tree, shown(_API_FILE), problems) if api_tree is not None else None
    impl_tree = _parse(impl, shown(_IMPL_FILE), problems)
    if impl_tree is not None and not impl_tree.body:
        problems.append(
            f"{shown(_IMPL_FILE)}: is empty: it holds the action's composition of mcptools and gentools, "
            "which api.py's run() calls"
        )
    return info, problems


def _not_saved(
    category: str, name: str, problems: list[str], *, hint: str = "Fix the code and save it again."
) -> str:
    lines = "\n".join(f"  {p}" for p in problems)
    return f"code action {category}.{name} was not saved (nothing was written):\n{lines}\n{hint}"


def _shown(path: Path, root: Path) -> str:
    """`path` relative to the workspace, if it is under it (also through a symlinked workspace path)."""
    for candidate, base in ((path, root), (Path(os.path.realpath(path)), Path(os.path.realpath(root)))):
        with contextlib.suppress(ValueError):
            return str(candidate.relative_to(base))
    return str(path)


# -- the disk, through descriptors ------------------------------------------------------------------


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _open_dir(dir_fd: int | None, name: str | Path, shown: Path) -> int:
    """A descriptor of the directory `name` (in `dir_fd`), never through a symlink.

    Raises:
        SymlinkRefusedError: It is a symlink.
        OSError: It is missing or not a directory.
    """
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise symlink_refused(shown, "write in", _readlink(name, dir_fd)) from None
        raise


def _readlink(name: str | Path, dir_fd: int | None) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return None


def _read(dir_fd: int, name: str, limit: int) -> bytes:
    """The regular file `name` in `dir_fd`, never through a symlink or from a FIFO.

    Raises:
        OSError: It is missing, a symlink or not a regular file.
        ValueError: It is larger than `limit`.
    """
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise OSError(errno.EINVAL, f"{name} is not a regular file")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{name} is larger than {limit} bytes")
    return data


def _write_new(dir_fd: int, name: str, data: str) -> None:
    fd = os.open(name, NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(data)


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _entries(dir_fd: int) -> list[str]:
    """The names in `dir_fd` that are real directories with an action or category name, sorted."""
    with os.scandir(dir_fd) as scan:
        names = sorted(entry.name for entry in scan)
    found = []
    for name in names:
        if layout.name_problem(name, "name") is not None:
            continue
        info = _lstat(dir_fd, name)
        if info is not None and stat.S_ISDIR(info.st_mode):
            found.append(name)
    return found


def _action_names(category_fd: int) -> list[str]:
    """The actions of a category: directories with an action name holding a regular api.py."""
    found = []
    for name in _entries(category_fd):
        with (
            contextlib.suppress(OSError),
            _closing(os.open(name, DIR_FLAGS, dir_fd=category_fd)) as action_fd,
        ):
            info = _lstat(action_fd, _API_FILE)
            if info is not None and stat.S_ISREG(info.st_mode):
                found.append(name)
    return found


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- generated files --------------------------------------------------------------------------------


@cache
def _environment() -> jinja2.Environment:
    return template_environment(_TEMPLATES)


def _usage(module: str, api: _Api) -> str:
    imports = ", ".join(["Params", "run"] if api.takes_params else ["run"])
    call = f"{'await ' if api.is_async else ''}run({'Params(...)' if api.takes_params else ''})"
    return f"    from {module} import {imports}\n    result = {call}"


def _render_action_init(category: str, name: str, api: _Api) -> str:
    """The action's `__init__.py`: `run()`'s docstring, how to call it, and the re-exports of api.py."""
    module = layout.action_module(category, name)
    lines = [
        api.doc,
        "",
        f"Saved code action {module} (MCP tool {layout.action_tool_name(category, name)}), written by ipybox.",
        "Do not edit this file: save the action again (overwrite=true) to change it. Its interface is",
        f"{_API_FILE} (`run()`, `Params` and the result model); {_IMPL_FILE} composes the tools. Usage:",
        "",
        _usage(module, api),
    ]
    exports = [n for n in api.exports if n.isidentifier() and n.isascii()]
    return (
        _environment()
        .get_template("action_init.py.jinja")
        .render(package_doc=docstring("\n".join(lines)), exports=exports)
    )


def _summary(category_fd: int, name: str) -> str:
    """The first line of `run()`'s docstring in an action's api.py, by parsing it (never importing)."""
    try:
        with _closing(os.open(name, DIR_FLAGS, dir_fd=category_fd)) as action_fd:
            source = _read(action_fd, _API_FILE, MAX_SOURCE_BYTES)
        tree = ast.parse(source)
    except (OSError, ValueError, SyntaxError):
        return ""
    run = module_bindings(tree.body)[0].get("run")
    if isinstance(run, ast.FunctionDef | ast.AsyncFunctionDef):
        return first_line(ast.get_docstring(run))
    return ""


def _render_category_init(category: str, actions: list[tuple[str, str]]) -> str:
    """A category's `__init__.py`: one line per action (`- <name>: <first line of run()'s docstring>`)."""
    lines = [
        f"Saved code actions of category {category!r}, written by ipybox. Do not edit: save_code_action",
        "rewrites this index.",
        "",
        f"Each action is a package: read its {_API_FILE} for the interface (`Params`, the result model and",
        "`run()`'s docstring). Usage:",
        "",
        f"    from {layout.GENTOOLS}.{category}.<action> import Params, run",
        "",
        "Actions (name: description):",
        "",
        *(f"- {name}" + (f": {summary}" if summary else "") for name, summary in actions),
    ]
    return (
        _environment()
        .get_template("category_init.py.jinja")
        .render(package_doc=docstring("\n".join(lines)), actions=[name for name, _ in actions])
    )


def _render_root_init(categories: list[tuple[str, list[str]]]) -> str:
    """`gentools/__init__.py`: the categories, each with its actions' names."""
    lines = [
        "Saved code actions by category, written by ipybox. Do not edit: save_code_action rewrites this",
        "index.",
        "",
        "Each category's __init__.py lists its actions with one line each. Usage:",
        "",
        f"    from {layout.GENTOOLS}.<category>.<action> import Params, run",
        "",
        "Categories (category: actions):",
        "",
        *(f"- {category}: {', '.join(actions) or '(none)'}" for category, actions in categories),
    ]
    return (
        _environment()
        .get_template("root_init.py.jinja")
        .render(package_doc=docstring("\n".join(lines)), categories=[category for category, _ in categories])
    )


def _write_indexes(gentools_fd: int, category_fd: int, category: str) -> None:
    # From what is on disk now (no await in between: one event loop's saves never interleave here).
    actions = [(name, _summary(category_fd, name)) for name in _action_names(category_fd)]
    replace_file(category_fd, "__init__.py", _render_category_init(category, actions), 0o644)
    categories = []
    for name in _entries(gentools_fd):
        with contextlib.suppress(OSError), _closing(os.open(name, DIR_FLAGS, dir_fd=gentools_fd)) as fd:
            categories.append((name, _action_names(fd)))
    replace_file(gentools_fd, "__init__.py", _render_root_init(categories), 0o644)


# -- saving -----------------------------------------------------------------------------------------


class _Staged:
    """Where an action is being written, and how to show its paths without the staging directory."""

    def __init__(self, gentools: Path, category: str, name: str, staging: str, root: Path) -> None:
        self.final = gentools / category / name
        self.path = gentools / category / staging
        self.staging = staging
        self.name = name
        self.root = root
        self._prefixes = sorted({str(self.path), os.path.realpath(self.path)}, key=len, reverse=True)

    def unstage(self, text: str) -> str:
        """`text` with the staging directory replaced by the action's own."""
        for prefix in self._prefixes:
            text = text.replace(prefix, str(self.final))
        return text.replace(self.staging, self.name)

    def describe(self, problem: CheckProblem) -> str:
        path = problem.path
        if path is not None:
            path = _shown(Path(self.unstage(path)), self.root)
        moved = CheckProblem(
            problem.module, path, problem.line, problem.column, self.unstage(problem.message)
        )
        return moved.describe()


def _check_failure(staged: _Staged, error: BaseException, timeout_hint: bool) -> str:
    where = _shown(staged.final, staged.root) + "/"
    if timeout_hint:
        return f"{where}: importing it did not finish in time (module code that waits or loops at import?)"
    # `ipybox.kernels.result.KernelDiedError`, by name: `ipybox.kernels` is a layer above this one.
    if type(error).__name__ == "KernelDiedError":
        return f"{where}: the kernel died while importing it (module code that exits or crashes the interpreter?)"
    text = staged.unstage(str(error)).strip()
    tail = "\n".join(text.splitlines()[-5:])
    return f"{where}: the check in a fresh kernel failed: {tail}"


async def save_code_action(
    run: RunCheck,
    mcptools_dir: Path,
    category: str,
    name: str,
    *,
    api: str,
    impl: str,
    root: Path,
    overwrite: bool = False,
) -> SavedAction:
    """Check and save a code action as `gentools/<category>/<name>/` (next to `mcptools_dir`).

    Args:
        run: Executes code in a fresh kernel (sandboxed as the workspace's kernels are); see `RunCheck`.
        mcptools_dir: The generated packages' directory; `gentools/` is next to it.
        category, name: The action's names (`layout.name_problem`); its MCP tool is `<category>__<name>`.
        api: The source of api.py: `run()` with a docstring, `Params` (a pydantic model) if it takes an
            argument, its result model.
        impl: The source of impl.py.
        root: The workspace: paths in messages are relative to it, and kernel tracebacks in files under it
            locate a problem.
        overwrite: Replace an action of that name.

    Raises:
        CodeActionError: See the class; nothing was written.
        SymlinkRefusedError: `gentools/`, the category or the action is a symlink (nothing is written).

    Example:
        ```python
        api = 'from pydantic import BaseModel\\nfrom .impl import hello\\n\\n' \\
              'def run() -> str:\\n    \"\"\"Say hello.\"\"\"\\n    return hello()\\n'
        impl = 'def hello() -> str:\\n    return "hello"\\n'
        action = await save_code_action(run, ws / "mcptools", "demo", "hello", api=api, impl=impl, root=ws)
        assert action.tool_name == "demo__hello"
        ```
    """
    for value, what in ((category, "category"), (name, "action name")):
        problem = layout.name_problem(value, what)
        if problem is not None:
            raise CodeActionError(f"code action not saved: {problem}")
    gentools = layout.gentools_dir(mcptools_dir)
    final = gentools / category / name
    info, problems = _static_check(api, impl, lambda file: _shown(final / file, root))
    if problems or info is None:
        raise CodeActionError(_not_saved(category, name, problems))
    assert isinstance(api, str) and isinstance(impl, str)

    made: list[tuple[int | None, str]] = []  # directories made here, removed again when the save fails
    with contextlib.ExitStack() as stack:
        gentools_fd = _open_checked(gentools, category, name, root, overwrite=overwrite)
        if gentools_fd is None:
            gentools_fd = _make_dir(None, gentools, gentools, made)
        stack.callback(os.close, gentools_fd)
        category_fd = _make_dir(gentools_fd, category, gentools / category, made)
        stack.callback(os.close, category_fd)
        _remove_stale(category_fd, gentools / category)

        staging = make_temp_dir(category_fd, f".{name}.tmp-")
        staged = _Staged(gentools, category, name, staging, root)
        saved = False
        try:
            with _closing(os.open(staging, DIR_FLAGS, dir_fd=category_fd)) as staging_fd:
                _write_new(staging_fd, "__init__.py", _render_action_init(category, name, info))
                _write_new(staging_fd, _API_FILE, api)
                _write_new(staging_fd, _IMPL_FILE, impl)
            described = await _check_staged(run, staged, category, name)
            manifest = _Manifest(**described.model_dump(), api_sha256=_sha256(api.encode()))
            with _closing(os.open(staging, DIR_FLAGS, dir_fd=category_fd)) as staging_fd:
                # Replaced, not created: the checked code ran in a kernel that could write there.
                replace_file(
                    staging_fd, layout.ACTION_MANIFEST, manifest.model_dump_json(indent=2) + "\n", 0o644
                )
            _put_in_place(category_fd, gentools / category, staging, name, overwrite, root)
            saved = True
        finally:
            if not saved:
                shutil.rmtree(staging, dir_fd=category_fd, ignore_errors=True)
                for parent_fd, made_name in reversed(made):
                    with contextlib.suppress(OSError):  # not empty: a concurrent save put something there
                        os.rmdir(made_name, dir_fd=parent_fd)
        _write_indexes(gentools_fd, category_fd, category)
    return _saved_action(gentools, category, name, manifest)


def _remove_stale(category_fd: int, category_dir: Path) -> None:
    """Leftovers of saves killed half-way in a category (`remove_stale_work_dirs` reopens it by path: only
    when the path still is the directory `category_fd` is)."""
    with contextlib.suppress(OSError):
        info = os.stat(category_dir, follow_symlinks=False)
        if (info.st_dev, info.st_ino) == (os.fstat(category_fd).st_dev, os.fstat(category_fd).st_ino):
            remove_stale_work_dirs(category_dir)


def _open_checked(gentools: Path, category: str, name: str, root: Path, *, overwrite: bool) -> int | None:
    """`gentools/`'s descriptor (`None` if it does not exist yet), after checking, before anything is
    written, that the action may be saved there: no existing action (unless `overwrite`), no module it
    would shadow, no symlink on the way."""
    try:
        gentools_fd = _open_dir(None, gentools, gentools)
    except FileNotFoundError:
        return None
    try:
        problems: list[str] = []
        shadowed = _lstat(gentools_fd, f"{category}.py")
        if shadowed is not None:
            problems.append(
                f"{_shown(gentools / f'{category}.py', root)} exists: a category {category!r} would shadow that "
                "module; choose another category (or remove the file)"
            )
        entry = _lstat(gentools_fd, category)
        if entry is not None and not stat.S_ISLNK(entry.st_mode) and not stat.S_ISDIR(entry.st_mode):
            problems.append(f"{_shown(gentools / category, root)} exists and is not a directory: remove it")
        if entry is not None and stat.S_ISLNK(entry.st_mode):
            raise symlink_refused(gentools / category, "write in", _readlink(category, gentools_fd))
        if entry is not None and stat.S_ISDIR(entry.st_mode) and not problems:
            with _closing(_open_dir(gentools_fd, category, gentools / category)) as category_fd:
                action = _lstat(category_fd, name)
                shown = _shown(gentools / category / name, root)
                if action is not None and stat.S_ISLNK(action.st_mode):
                    raise symlink_refused(gentools / category / name, "replace", _readlink(name, category_fd))
                if action is not None and not overwrite:
                    problems.append(
                        f"{shown}/ exists: pass overwrite=true to replace the action {category}.{name}"
                    )
                if _lstat(category_fd, f"{name}.py") is not None:
                    problems.append(
                        f"{shown}.py exists: an action named {name!r} would shadow that module; choose another "
                        "name (or remove the file)"
                    )
        if problems:
            raise CodeActionError(_not_saved(category, name, problems, hint="Nothing was changed."))
    except BaseException:
        os.close(gentools_fd)
        raise
    return gentools_fd


def _make_dir(
    parent_fd: int | None, name: str | Path, shown: Path, made: list[tuple[int | None, str]]
) -> int:
    """A descriptor of the directory `name` in `parent_fd`, made if missing (recorded in `made`)."""
    if parent_fd is None:
        Path(name).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(name, 0o777, dir_fd=parent_fd)
        made.append((parent_fd, str(name)))
    except FileExistsError:
        pass
    return _open_dir(parent_fd, name, shown)


def _modules(category: str, name: str) -> list[str]:
    """What a check imports: the action's package, its api and its impl."""
    module = layout.action_module(category, name)
    return [module, f"{module}.{layout.API_MODULE}", f"{module}.{layout.IMPL_MODULE}"]


async def _check_staged(run: RunCheck, staged: _Staged, category: str, name: str) -> _Described:
    """Import the staged package in a fresh kernel; what it offers, or `CodeActionError`."""
    module = layout.action_module(category, name)
    code = check_code(
        _modules(category, name), root=staged.root, staged={module: staged.path}, describe=module
    )
    try:
        report = parse_check_output(await run(code))
    except TimeoutError as e:
        raise CodeActionError(_not_saved(category, name, [_check_failure(staged, e, True)])) from None
    except (KernelError, CheckOutputError) as e:
        raise CodeActionError(_not_saved(category, name, [_check_failure(staged, e, False)])) from None
    if not report.ok:
        raise CodeActionError(_not_saved(category, name, [staged.describe(p) for p in report.problems]))
    try:
        return _Described.model_validate(report.action)
    except ValidationError as e:
        where = _shown(staged.final / _API_FILE, staged.root)
        raise CodeActionError(
            _not_saved(category, name, [f"{where}: the kernel's description of it could not be read: {e}"])
        ) from None


def _put_in_place(
    category_fd: int, category_dir: Path, staging: str, name: str, overwrite: bool, root: Path
) -> None:
    if overwrite:
        swap_in(category_fd, category_dir, staging, name)
        return
    try:
        # Fails on a non-empty directory (any action) or another entry: an action saved meanwhile is never
        # replaced without `overwrite`.
        os.rename(staging, name, src_dir_fd=category_fd, dst_dir_fd=category_fd)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise
        shown = _shown(category_dir / name, root)
        category = category_dir.name
        raise CodeActionError(
            _not_saved(
                category,
                name,
                [
                    f"{shown}/ exists (saved meanwhile): pass overwrite=true to replace the action {category}.{name}"
                ],
                hint="Nothing was changed.",
            )
        ) from None


def _saved_action(gentools: Path, category: str, name: str, manifest: _Described) -> SavedAction:
    return SavedAction(
        category=category,
        name=name,
        path=gentools / category / name,
        module=layout.action_module(category, name),
        tool_name=layout.action_tool_name(category, name),
        description=manifest.doc,
        signature=manifest.signature,
        input_schema=manifest.input_schema,
        output_schema=manifest.output_schema,
        takes_params=manifest.takes_params,
        is_async=manifest.is_async,
        calls=analyse_action(gentools, category, name),
    )


# -- listing ----------------------------------------------------------------------------------------


def _read_action(category_fd: int, name: str) -> tuple[str | None, _Manifest | None]:
    """(sha256 of api.py or `None` if it can't be read, the manifest or `None` if missing or invalid)."""
    try:
        with _closing(os.open(name, DIR_FLAGS, dir_fd=category_fd)) as action_fd:
            try:
                sha = _sha256(_read(action_fd, _API_FILE, MAX_SOURCE_BYTES))
            except (OSError, ValueError):
                return None, None
            try:
                data = _read(action_fd, layout.ACTION_MANIFEST, MAX_MANIFEST_BYTES)
                return sha, _Manifest.model_validate_json(data)
            except (OSError, ValueError):  # ValidationError is a ValueError
                return sha, None
    except OSError:
        return None, None


def read_actions(gentools_dir: Path) -> ActionListing:
    """The saved actions under `gentools_dir` (parsing manifests and `impl.py`s only).

    Symlinked categories and actions are ignored; directories without an api.py are not actions.
    """
    actions: list[SavedAction] = []
    stale: list[tuple[str, str]] = []
    try:
        gentools_fd = os.open(gentools_dir, DIR_FLAGS)
    except OSError:
        return ActionListing(actions, stale)
    with _closing(gentools_fd):
        for category in _entries(gentools_fd):
            try:
                category_fd = os.open(category, DIR_FLAGS, dir_fd=gentools_fd)
            except OSError:
                continue
            with _closing(category_fd):
                for name in _action_names(category_fd):
                    sha, manifest = _read_action(category_fd, name)
                    if manifest is None or sha is None or manifest.api_sha256 != sha:
                        stale.append((category, name))
                    else:
                        actions.append(_saved_action(gentools_dir, category, name, manifest))
    return ActionListing(actions, stale)


def _api_sha(gentools: Path, category: str, name: str) -> str | None:
    try:
        with (
            _closing(os.open(gentools, DIR_FLAGS)) as gentools_fd,
            _closing(os.open(category, DIR_FLAGS, dir_fd=gentools_fd)) as category_fd,
        ):
            return _read_action(category_fd, name)[0]
    except OSError:
        return None


def api_digest(gentools_dir: Path, category: str, name: str) -> str | None:
    """The sha256 of an action's `api.py` (`None` when it can't be read): what its manifest describes."""
    return _api_sha(gentools_dir, category, name)


def _write_manifest(gentools: Path, category: str, name: str, manifest: _Manifest) -> None:
    with (
        _closing(_open_dir(None, gentools, gentools)) as gentools_fd,
        _closing(_open_dir(gentools_fd, category, gentools / category)) as category_fd,
        _closing(_open_dir(category_fd, name, gentools / category / name)) as action_fd,
    ):
        replace_file(action_fd, layout.ACTION_MANIFEST, manifest.model_dump_json(indent=2) + "\n", 0o644)


def _segments(output: str, nonce: str, count: int) -> list[str]:
    """The output of each action's check (between the lines `_SEGMENT<nonce>:<i>`)."""
    parts: list[list[str]] = [[] for _ in range(count)]
    current: int | None = None
    for line in output.splitlines():
        if line.startswith(f"{_SEGMENT}{nonce}:"):
            index = line.rpartition(":")[2]
            current = int(index) if index.isdigit() and int(index) < count else None
        elif current is not None:
            parts[current].append(line)
    return ["\n".join(part) for part in parts]


async def describe_actions(
    run: RunCheck, mcptools_dir: Path, actions: list[tuple[str, str]], *, root: Path
) -> list[SavedAction]:
    """Describe `actions` (stale ones) in one fresh kernel and rewrite their manifests; those that do not
    import are left out (logged). When the kernel fails as a whole (an action's import kills it or never
    ends), each action is described in a kernel of its own, so one bad action does not hide the others."""
    gentools = layout.gentools_dir(mcptools_dir)
    wanted: list[tuple[str, str, str]] = []
    for category, name in dict.fromkeys(actions):
        if layout.name_problem(category, "category") or layout.name_problem(name, "action name"):
            logger.warning("not describing %r/%r: not an action name", category, name)
            continue
        sha = _api_sha(gentools, category, name)
        if sha is None:
            logger.warning("not describing %s: its api.py can't be read", gentools / category / name)
            continue
        wanted.append((category, name, sha))
    if not wanted:
        return []
    nonce = secrets.token_hex(8)
    code = ""
    for i, (category, name, _) in enumerate(wanted):
        # A line of its own before each action's report, so each report is read as that action's.
        code += f"print({chr(10) + _SEGMENT + nonce + ':' + str(i)!r})\n"
        code += check_code(_modules(category, name), root=root, describe=layout.action_module(category, name))
    try:
        output = await run(code)
    except (KernelError, TimeoutError) as e:
        if len(wanted) == 1:
            logger.warning("describing %s failed: %s", gentools / wanted[0][0] / wanted[0][1], e)
            return []
        described: list[SavedAction] = []
        for category, name, _ in wanted:
            described += await describe_actions(run, mcptools_dir, [(category, name)], root=root)
        return described
    described = []
    for (category, name, sha), segment in zip(wanted, _segments(output, nonce, len(wanted)), strict=True):
        where = gentools / category / name
        try:
            report = parse_check_output(segment)
            if not report.ok:
                logger.warning(
                    "saved action %s does not import: %s",
                    where,
                    "; ".join(p.describe(root) for p in report.problems),
                )
                continue
            manifest = _Manifest(**_Described.model_validate(report.action).model_dump(), api_sha256=sha)
        except (CheckOutputError, ValidationError) as e:
            logger.warning("saved action %s could not be described: %s", where, e)
            continue
        if _api_sha(gentools, category, name) != sha:
            logger.warning("saved action %s changed while it was described: left stale", where)
            continue
        try:
            _write_manifest(gentools, category, name, manifest)
        except OSError as e:
            logger.warning("the manifest of %s could not be written: %s", where, e)
            continue
        described.append(_saved_action(gentools, category, name, manifest))
    return described
