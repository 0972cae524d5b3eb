"""Output parsers: agent-written modules that turn a tool's raw output into a model, kept apart from the
generated packages so that regenerating a server never erases them.

    mcptools/<server>/<module>.py     generated; gains `ParseResult`, `run_parsed()` and `arun_parsed()`
                                      when the parser below exists
    mcpparse/<server>/<module>.py     written by an agent: `class ParseResult(BaseModel)` and
                                      `def parse(raw: str) -> ParseResult`

`mcpparse/` sits next to the `mcptools/` directory (whose parent is on the kernels' import path), so a
generated module imports its parser as `mcpparse.<server>.<module>`. `raw` is the tool's text output (what
`run()` returns), or, for a tool with an output schema, its structured result as JSON text.

Contract (parsers are agent-written and kernel-writable: the host treats them as untrusted):
- The host never imports or runs a parser. Discovery is file existence only: a regular file
  `<module>.py` in `mcpparse/<server>/`, where `<module>` is a module name of the server's package. The
  directories and the file are looked at without following symlinks (a symlink is ignored, with a
  warning): a parser is only what lies in the workspace itself.
- `static_problems` reads a parser (at most `MAX_PARSER_BYTES`, never through a symlink, never a FIFO)
  and parses it with `ast`: a syntax error with its line and column, or a module that does not define
  `ParseResult` and `parse`. Whether it imports is checked in a fresh kernel (`ipybox.codeact.checks`),
  by whoever owns kernels (the workspace's reconciler).
- Generated code names a parser only through `PARSER_MODULE`/`PARSER_FILE` string literals built from the
  server's package name and the tool's module name (both sanitized identifiers), by `py_str`.
"""

from __future__ import annotations

import ast
import difflib
import errno
import keyword
import logging
import os
import stat
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ipybox.in_kernel.mcptools_refresh import PARSERS_PACKAGE
from ipybox.safefs import DIR_FLAGS

logger = logging.getLogger(__name__)

MCPPARSE: Final = PARSERS_PACKAGE
"""Directory (and top-level package) of output parsers, next to `mcptools/`."""

MAX_PARSER_BYTES: Final = 1 << 20
"""A parser larger than this is not read by the host (it is reported, and still imported by kernels)."""

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block


def parsers_dir(root_dir: Path) -> Path:
    """The `mcpparse/` directory that belongs to the generated packages' directory `root_dir`."""
    return root_dir.parent / MCPPARSE


def parser_module(server_name: str, module: str) -> str:
    """The dotted name a generated module imports its parser by (`mcpparse.github.search_repositories`)."""
    return f"{MCPPARSE}.{server_name}.{module}"


def parser_file(server_name: str, module: str) -> str:
    """The parser's file, relative to the directory holding `mcptools/` and `mcpparse/`."""
    return f"{MCPPARSE}/{server_name}/{module}.py"


def _is_module_name(name: str) -> bool:
    # What the generator makes of tool names (`names.module_name`): ASCII identifiers, never a keyword.
    return name.isidentifier() and name.isascii() and not keyword.iskeyword(name)


def discover_parsers(root_dir: Path, server_name: str) -> frozenset[str]:
    """The module names with a parser in `mcpparse/<server_name>/` next to `root_dir` (nothing is read or
    imported: a regular file `<module>.py` is a parser). Symlinks are ignored, with a warning; a missing
    directory has none.

    Example:
        ```python
        discover_parsers(Path("ws/mcptools"), "github")  # frozenset({"search_repositories"})
        ```
    """
    if not _is_module_name(server_name):
        return frozenset()
    base = parsers_dir(root_dir)
    try:
        base_fd = _open_dir(base)
    except OSError:
        return frozenset()
    try:
        server_fd = _open_dir(server_name, base_fd, base / server_name)
    except OSError:
        return frozenset()
    finally:
        os.close(base_fd)
    found: set[str] = set()
    try:
        with os.scandir(server_fd) as entries:
            names = [entry.name for entry in entries]
        for name in names:
            stem, dot, suffix = name.rpartition(".")
            if dot != "." or suffix != "py" or not _is_module_name(stem) or stem == "__init__":
                continue
            try:
                info = os.stat(name, dir_fd=server_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(info.st_mode):
                logger.warning("ignored the parser %s: it is a symlink", base / server_name / name)
            elif stat.S_ISREG(info.st_mode):
                found.add(stem)
    finally:
        os.close(server_fd)
    return frozenset(found)


def _open_dir(path: str | Path, dir_fd: int | None = None, shown: Path | None = None) -> int:
    try:
        return os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            logger.warning("ignored parsers in %s: it is a symlink or not a directory", shown or path)
        raise


@dataclass(frozen=True)
class ParserProblem:
    """Why a parser will not work, and where.

    Attributes:
        path: The parser's file, relative to the workspace (`mcpparse/<server>/<module>.py`).
        line: 1-based line, if known.
        column: 1-based column, if known.
        message: What is wrong (`SyntaxError: invalid syntax`, or what the file does not define).
    """

    path: str
    line: int | None
    column: int | None
    message: str

    def __str__(self) -> str:
        where = ":".join([self.path, *(str(n) for n in (self.line, self.column) if n is not None)])
        return f"{where}: {self.message}"


def read_parser(root_dir: Path, server_name: str, module: str) -> bytes:
    """The source of a parser (see `discover_parsers`), read without following a symlink.

    Raises:
        OSError: It is missing, a symlink, or not a regular file.
        ValueError: It is larger than `MAX_PARSER_BYTES`.
    """
    if not (_is_module_name(server_name) and _is_module_name(module)):
        raise ValueError(f"{server_name!r}/{module!r} is no parser name")
    base = parsers_dir(root_dir)
    base_fd = os.open(base, DIR_FLAGS)
    try:
        server_fd = os.open(server_name, DIR_FLAGS, dir_fd=base_fd)
    finally:
        os.close(base_fd)
    try:
        fd = os.open(f"{module}.py", _READ_FLAGS, dir_fd=server_fd)
    finally:
        os.close(server_fd)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = file.read(MAX_PARSER_BYTES + 1)
    if len(data) > MAX_PARSER_BYTES:
        raise ValueError(f"larger than {MAX_PARSER_BYTES} bytes: not read by ipybox")
    return data


_DEFINES = (
    ("ParseResult", "class ParseResult(BaseModel): the model parse() returns"),
    ("parse", "def parse(raw: str) -> ParseResult"),
)


def source_problems(source: bytes | str, path: str) -> list[ParserProblem]:
    """What `ast` finds wrong with a parser's source: a syntax error, or a module level that does not
    define `ParseResult` and `parse` (by a class, function, assignment or import; a `*` import is taken
    to define them). Nothing is imported or run."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        column = e.offset if e.lineno is not None else None
        return [ParserProblem(path, e.lineno, column, f"{type(e).__name__}: {e.msg}")]
    except ValueError as e:  # e.g. null bytes
        return [ParserProblem(path, None, None, f"SyntaxError: {e}")]
    bindings, star = module_bindings(tree.body)
    names = set(bindings)
    if star:
        return []
    return [
        ParserProblem(path, None, None, f"defines no {name}: a parser defines {what}")
        for name, what in _DEFINES
        if name not in names
    ]


def static_problems(root_dir: Path, server_name: str, module: str) -> list[ParserProblem]:
    """`source_problems` of the parser `mcpparse/<server_name>/<module>.py` next to `root_dir`, or why it
    could not be read."""
    path = parser_file(server_name, module)
    try:
        source = read_parser(root_dir, server_name, module)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return [ParserProblem(path, None, None, f"could not be read: {reason}")]
    return source_problems(source, path)


def unmatched_parsers(
    server_name: str, parsers: Iterable[str], modules: Collection[str]
) -> list[ParserProblem]:
    """A problem for each parser named after no module of the server's package (it is never used), with
    the closest module names."""
    problems = []
    for name in sorted(set(parsers) - set(modules)):
        close = difflib.get_close_matches(name, sorted(modules), n=3)
        hint = f"; did you mean {' or '.join(repr(m) for m in close)}?" if close else ""
        problems.append(
            ParserProblem(
                parser_file(server_name, name),
                None,
                None,
                f"server {server_name!r} has no tool module {name!r}{hint} (a parser is named after the "
                f"module it parses; mcptools/{server_name}/__init__.py lists them)",
            )
        )
    return problems


def module_bindings(body: list[ast.stmt]) -> tuple[dict[str, ast.stmt], bool]:
    """The module-level names of `body` (also inside `if`/`try`/`with` blocks), each with the statement that
    last binds it, and whether a `*` import binds names unknown here."""
    names: dict[str, ast.stmt] = {}
    star = False
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update((n.id, node) for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    star = True
                else:
                    names[alias.asname or alias.name.split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.AsyncWith):
            blocks: list[list[ast.stmt]] = [node.body]
            if isinstance(node, ast.If | ast.Try):
                blocks.append(node.orelse)
            if isinstance(node, ast.Try):
                blocks += [handler.body for handler in node.handlers] + [node.finalbody]
            for block in blocks:
                inner, inner_star = module_bindings(block)
                names.update(inner)
                star = star or inner_star
    return names, star
