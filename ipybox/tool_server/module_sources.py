"""`ModuleSources`: the generated packages' source files, served to kernels that do not share the host's files.

A kernel on another machine (a Jupyter Enterprise Gateway's) imports `mcptools`, `gentools` and `mcpparse`
through an import hook (`ipybox.in_kernel.remote_modules`) that asks the call channel for each module's
source (`source` op) and, before each cell, for the generation (`generation` op). This module answers both.

Contract:
- The roots are fixed at construction: a top-level package name (a dotted identifier's first part) and
  its directory, resolved then. Nothing else is served: with no roots, every request is refused.
- A module name is dotted ASCII identifiers (no keywords, no dunder names such as `__pycache__` or
  `__init__`, at most `MAX_NAME_CHARS`), the first being a root's name: so no `..`, no hidden name, no
  path separator ever reaches the file system.
- A name resolves as the import system's path finder does: `<dir>/__init__.py` (a package), else
  `<dir>.py` (a module), else a directory (a namespace package, no code), else nothing (`None`).
- Only regular `.py` files of at most `max_bytes` (2 MiB), in UTF-8, are read. A symlink inside a root is
  followed only when what it leads to stays inside that root (resolved and checked); the file is then
  opened along its resolved path from a descriptor of the root, every component without following a
  symlink (`O_NOFOLLOW`), so a symlink swapped in after the check is refused, never followed.
  Everything refused raises `ModuleRefusedError` with the reason; the kernel's import fails with it.
- `origin` is the file's path on the host, under the resolved root: the module's `__file__` there, and
  the package root a generated tool module sends with its calls (`PACKAGE_ROOT`), as in a local kernel.
- A code action being saved is checked in a fresh kernel before it is renamed into place
  (`ipybox.codeact.actions`): `source(module, staged=directory)` serves the package in its staging
  directory, `module` relative to it (`""` for its `__init__.py`, `"api"`, `"impl"`, ...). `directory`
  must be an absolute, normalized path named as `make_temp_dir` names an action's staging directory
  (`.<name>.tmp-<pid>_<12 hex>`, `STAGING_NAME`), whose parent is a category (an identifier) directly in
  the `staged_root` root (`gentools`), and which resolves to exactly `<root>/<category>/<staging>`: no
  symlink from the category on, no other root, no other hidden name. The files in it follow the rules
  above (`.py`, size, `O_NOFOLLOW`), a symlink followed only when it stays inside the staging directory;
  their `origin` is under `directory` as given, the path a local check's `__file__` would have.
- `generation()` is a digest of the served trees (the names of directories; names, inodes, sizes and
  mtimes of `.py` files; hidden names and `__pycache__` skipped; symlinked directories not descended into),
  recomputed at most every `generation_ttl` seconds: any write, add, rename or removal the reconciler or a
  code-action save makes changes it, and a cell that starts `generation_ttl` after the change sees it. The
  reconciler's own marker (`mcptools/.ipybox-generation`) covers `mcptools` and `mcpparse` only, not
  `gentools`, hence the digest.

Any kernel with a valid call token may read them: they are the workspace's generated code, which local
kernels read from disk anyway.
"""

from __future__ import annotations

import errno
import hashlib
import keyword
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ipybox.errors import IpyboxError
from ipybox.safefs import DIR_FLAGS, open_dir

__all__ = [
    "DEFAULT_GENERATION_TTL",
    "MAX_NAME_CHARS",
    "MAX_SOURCE_BYTES",
    "STAGED_ROOT",
    "STAGING_NAME",
    "ModuleRefusedError",
    "ModuleSource",
    "ModuleSources",
    "contained",
    "module_name_problem",
]

MAX_SOURCE_BYTES: Final = 2 * 1024 * 1024
"""The largest source file served (generated modules are a few KiB)."""
MAX_NAME_CHARS: Final = 512
DEFAULT_GENERATION_TTL: Final = 0.1
"""Seconds a computed generation is reused: many kernels asking at once cost one walk of the trees."""
# Deeper than any generated layout (gentools/<category>/<name>/api.py is 3): the walk stops there.
_MAX_DEPTH: Final = 16

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
STAGED_ROOT: Final = "gentools"
"""The root whose code actions' staging directories `source(..., staged=...)` serves."""
STAGING_NAME: Final = re.compile(r"\.[A-Za-z_][A-Za-z0-9_]*\.tmp-[0-9]+_[0-9a-f]{12}")
"""A code action's staging directory, as `ipybox.mcp_apigen.package.make_temp_dir` names it for
`ipybox.codeact.actions` (`.shout.tmp-4831_9f3a0c1b2d4e`)."""
_MAX_PATH_CHARS: Final = 4096
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ModuleRefusedError(IpyboxError, ValueError):
    """A module a kernel asked for is not served: the name is not one under the served roots, or its file
    is not one this tool server serves (the message says which and why)."""


@dataclass(frozen=True)
class ModuleSource:
    """What the kernel's import hook needs to make a module: its code, whether it is a package, and where
    the file is on the host (for a namespace package: the directory, and `code` is empty)."""

    code: str
    package: bool
    origin: str


def module_name_problem(name: object) -> str | None:
    """Why `name` is not a module name this could serve (dotted ASCII identifiers, no keyword or dunder
    part, at most `MAX_NAME_CHARS`); `None` if it is one."""
    if not isinstance(name, str) or not name:
        return f"a module name must be a non-empty string, not {name!r}"
    if len(name) > MAX_NAME_CHARS:
        return f"a module name may have {MAX_NAME_CHARS} characters at most"
    for part in name.split("."):
        if not _IDENTIFIER.fullmatch(part):
            return f"{name!r} is not a dotted name of ASCII identifiers"
        if keyword.iskeyword(part):
            return f"{name!r} has the keyword {part!r} in it"
        if part.startswith("__") and part.endswith("__"):
            return f"{name!r} has the dunder name {part!r} in it, which is never a module that is served"
    return None


def contained(path: str, root: str) -> bool:
    """Whether the (resolved, absolute) `path` is `root` or inside it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class ModuleSources:
    """The sources of the packages under `roots`, for kernels' `source` and `generation` requests.

    Args:
        roots: Top-level package name -> its directory (e.g. `{"mcptools": ws / "mcptools"}`); resolved
            now. A directory need not exist yet (`gentools` before the first saved action).
        max_bytes: The largest file served.
        staged_root: The root whose code actions' staging directories are served (`STAGED_ROOT`).
        generation_ttl: Seconds a computed generation is reused.
        clock: Monotonic seconds (tests pass their own).

    Raises:
        ValueError: A root's name is not an identifier, or its path is not absolute.
    """

    def __init__(
        self,
        roots: Mapping[str, Path],
        *,
        max_bytes: int = MAX_SOURCE_BYTES,
        staged_root: str = STAGED_ROOT,
        generation_ttl: float = DEFAULT_GENERATION_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        resolved: dict[str, str] = {}
        for name, directory in roots.items():
            if module_name_problem(name) is not None or "." in name:
                raise ValueError(f"a served root's name must be a top-level package name, not {name!r}")
            if not Path(directory).is_absolute():
                raise ValueError(f"the served root {name!r} must be an absolute path, not {str(directory)!r}")
            resolved[name] = os.path.realpath(directory)
        self.roots: Mapping[str, str] = resolved
        self.max_bytes = max_bytes
        self.staged_root = staged_root
        self.generation_ttl = generation_ttl
        self._clock = clock
        self._generation: tuple[float, str] | None = None

    def source(self, module: object, staged: object = None) -> ModuleSource | None:
        """The source of `module`, or `None` when no such module exists under its root.

        Args:
            module: A dotted module name under a root; with `staged`, relative to that directory (`""`: the
                package's `__init__.py`).
            staged: The host path of a code action's staging directory (see the module's description).

        Raises:
            ModuleRefusedError: The name or its file is not served (see the module's description).
        """
        if not self.roots:
            raise ModuleRefusedError("no modules are served here (this tool server serves no package roots)")
        if staged is not None:
            return self._staged_source(module, staged)
        problem = module_name_problem(module)
        if problem is not None:
            raise ModuleRefusedError(problem)
        assert isinstance(module, str)
        top, *parts = module.split(".")
        root = self.roots.get(top)
        if root is None:
            served = ", ".join(sorted(self.roots))
            raise ModuleRefusedError(f"{module!r} is not in a served package (served: {served})")
        return self._resolve(module, root, os.path.join(root, *parts), top_level=not parts)

    def _staged_source(self, module: object, staged: object) -> ModuleSource | None:
        root = self.roots.get(self.staged_root)
        if root is None:
            raise ModuleRefusedError(f"no staged code actions are served here (no {self.staged_root} root)")
        directory = _staging_directory(staged, root)
        if module == "":
            parts: list[str] = []
        else:
            problem = module_name_problem(module)
            if problem is not None:
                raise ModuleRefusedError(problem)
            assert isinstance(module, str)
            parts = module.split(".")
        label = ".".join([os.path.basename(directory), *parts])
        # Its files may lead nowhere else: not to the rest of the root, whose hidden names are never served.
        within = os.path.realpath(directory)
        return self._resolve(label, root, os.path.join(directory, *parts), top_level=not parts, within=within)

    def _resolve(
        self, module: str, root: str, base: str, *, top_level: bool, within: str | None = None
    ) -> ModuleSource | None:
        limit = within or root
        init = os.path.join(base, "__init__.py")
        if os.path.lexists(init) and os.path.isdir(base):
            return ModuleSource(self._read(root, init, limit), True, init)
        if not top_level and os.path.lexists(base + ".py"):
            return ModuleSource(self._read(root, base + ".py", limit), False, base + ".py")
        if os.path.isdir(base):
            if not contained(os.path.realpath(base), limit):
                raise ModuleRefusedError(f"{module!r} is a directory that leads outside {limit}: not served")
            return ModuleSource("", True, base)
        return None

    def generation(self) -> str:
        """A marker that changes whenever a served file changes (see the module's description)."""
        now = self._clock()
        cached = self._generation
        if cached is not None and now - cached[0] < self.generation_ttl:
            return cached[1]
        digest = hashlib.sha256()
        for name, root in sorted(self.roots.items()):
            digest.update(f"root {name}\0".encode())
            _digest_tree(digest, root, "", 0)
        value = digest.hexdigest()[:32]
        self._generation = (now, value)
        return value

    def _read(self, root: str, path: str, limit: str) -> str:
        """The file at `path`, which must resolve inside `limit` (the root, or a directory in it)."""
        shown = os.path.relpath(path, os.path.dirname(root))
        real = os.path.realpath(path)
        if not contained(real, limit):
            raise ModuleRefusedError(f"{shown} is a symlink that leads outside {limit}: not served")
        if not real.endswith(".py"):
            raise ModuleRefusedError(f"{shown} leads to a file that is not a .py file: not served")
        try:
            data = _read_below(root, os.path.relpath(real, root), self.max_bytes)
        except _NotServed as e:
            raise ModuleRefusedError(f"{shown} {e}: not served") from None
        except OSError as e:
            raise ModuleRefusedError(f"{shown} cannot be read: {e.strerror or e}") from None
        if len(data) > self.max_bytes:
            raise ModuleRefusedError(
                f"{shown} is larger than {self.max_bytes} bytes, the most a module served to a kernel may be"
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModuleRefusedError(f"{shown} is not UTF-8 ({e.reason} at byte {e.start})") from None


class _NotServed(Exception):
    pass


def _staging_directory(staged: object, root: str) -> str:
    """`staged` if it is a code action's staging directory in the (resolved) gentools `root`."""
    if not isinstance(staged, str) or not staged or len(staged) > _MAX_PATH_CHARS or "\0" in staged:
        raise ModuleRefusedError(
            f"a staged package's directory must be an absolute path of at most {_MAX_PATH_CHARS} "
            f"characters, not {str(staged)[:200]!r}"
        )
    shown = f"{staged[:300]!r}"
    if not os.path.isabs(staged) or os.path.normpath(staged) != staged or staged.startswith("//"):
        raise ModuleRefusedError(f"{shown} is not an absolute, normalized path: not served")
    category_dir, staging = os.path.split(staged)
    category = os.path.basename(category_dir)
    if not STAGING_NAME.fullmatch(staging):
        raise ModuleRefusedError(
            f"{shown} is not a code action's staging directory (.<name>.tmp-<pid>_<hex>): not served"
        )
    if module_name_problem(category) is not None:
        raise ModuleRefusedError(f"{shown} is not in a category of {root} (an identifier): not served")
    # Resolved, it must be the very path inside the root: a symlink anywhere from the category on (or to
    # another tree) resolves elsewhere. What is read is then opened without following any (`_read_below`).
    if os.path.realpath(staged) != os.path.join(root, category, staging):
        raise ModuleRefusedError(
            f"{shown} is not a staging directory directly inside {root}/<category>/ (a symlink, or "
            "another directory): not served"
        )
    return staged


def _read_below(root: str, relative: str, max_bytes: int) -> bytes:
    """Read `root/relative` (a resolved path), every component opened without following a symlink: one
    swapped in after the path was resolved and checked is refused, never followed. Reads at most
    `max_bytes + 1` bytes, so a caller sees a file over the bound without reading all of it."""
    *dirs, name = relative.split(os.sep)
    fd = open_dir(Path(root))
    try:
        for part in dirs:
            try:
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _NotServed("changed while it was being read (a symlink on its way)") from None
                raise
            os.close(fd)
            fd = next_fd
        try:
            file_fd = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _NotServed("changed while it was being read (now a symlink)") from None
            raise
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise _NotServed("is not a regular file")
        return file.read(max_bytes + 1)


def _digest_tree(digest: hashlib._Hash, directory: str, relative: str, depth: int) -> None:
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        digest.update(f"missing {relative}\0".encode())
        return
    for entry in entries:
        name = entry.name
        if name.startswith(".") or name == "__pycache__":
            continue
        path = f"{relative}/{name}"
        try:
            if entry.is_dir():
                # By name only: a directory's mtime also moves when a kernel writes bytecode next to the
                # sources, which changes nothing served. What it holds is digested below.
                digest.update(f"{path}/\0".encode())
                if not entry.is_symlink() and depth < _MAX_DEPTH:
                    _digest_tree(digest, entry.path, path, depth + 1)
            elif name.endswith(".py"):
                info = entry.stat()
                digest.update(f"{path}\0{info.st_ino}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
        except OSError:
            continue  # removed meanwhile: its absence is the change
