"""Generated packages in a kernel that does not share the host's files: an import hook that loads `mcptools`,
`gentools` and `mcpparse` from the tool server, over the kernel's authenticated call channel.

`ipybox.in_kernel.remote.install` puts a [RemoteModules][ipybox.in_kernel.remote_modules.RemoteModules]
first on `sys.meta_path` and registers its `check_generation` on IPython's `pre_run_cell`.

Contract:
- The hook answers for its top-level names and their submodules only, before the kernel's own finders:
  a module the tool server has is always the host's; one it refuses is an `ImportError` (never looked up
  elsewhere); one it does not have is left to the other finders (as a finder's `None`, so
  `importlib.util.find_spec` keeps its meaning). Every other import is left to the other finders.
- Each module's source comes from the call channel's `source` op (`ipybox.in_kernel.call_protocol`),
  through the `ToolRunner`'s per-thread connection (`request_op`), and is compiled with the host path
  (`origin`) as its file name: `__file__`, tracebacks (the source is put in `linecache`) and the package
  root a generated tool module sends with its calls (`PACKAGE_ROOT`, from `__file__`) are what they are in
  a local kernel, so the tool server's check of that root passes. Packages get `__path__` (the host
  directory), so submodule imports come back here.
- Sources are cached for the generation they were read at. Before each cell, `check_generation` asks the
  `generation` op (one round trip; none when no module of these packages was imported since the last
  change) and, when it differs from the one the loaded modules were read at (or they were read at several),
  drops the cached sources and the packages' modules from `sys.modules` (`mcptools_refresh.forget_modules`,
  as a local kernel does after a regeneration), so the next import reads the new files. Names a cell bound
  earlier keep the old code until imported again.
- A code action being saved is checked before it is in place: `stage(name, directory)` makes the package
  `name` and its submodules come from the host's staging `directory` (the `source` op's `staged`), with
  `__file__` and tracebacks under it, as `import_check` registers it from disk in a local kernel. Staged
  packages are forgotten with the modules (`forget`). `installed()` finds the hook `install` put in place.
- A channel that cannot be reached, or answers an error, fails the import with an `ImportError` saying
  why, after at most `SOURCE_TIMEOUT` seconds (`GENERATION_TIMEOUT` for the check before a cell, which then
  lets the cell run and tries again at the next one): never a hang.

Runs inside kernels: standard library only.
"""

from __future__ import annotations

import importlib.machinery
import linecache
import sys
import threading
import types
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, cast

from ipybox.in_kernel.call_protocol import OP_GENERATION, OP_SOURCE
from ipybox.in_kernel.mcptools_refresh import forget_modules
from ipybox.in_kernel.tool_runner import ToolRunnerError, request_op

if TYPE_CHECKING:
    from importlib.abc import Loader

__all__ = ["GENERATION_TIMEOUT", "SERVED", "SOURCE_TIMEOUT", "RemoteModules", "installed"]

SERVED: Final = ("mcptools", "gentools", "mcpparse")
"""The top-level packages a kernel without the host's files imports from the tool server."""
SOURCE_TIMEOUT: Final = 30.0
"""Seconds to connect and to receive one module's source (at most 2 MiB)."""
GENERATION_TIMEOUT: Final = 5.0
"""Seconds to connect and to receive the generation before a cell."""


class RemoteModules:
    """A `sys.meta_path` finder and loader for the packages `names`, reading them from the tool server.

    Args:
        names: The top-level package names served (default `SERVED`).
        address: The call channel's address (default: the kernel's `IPYBOX_TOOL_SERVER`).
        token: The kernel's call token (default: its `IPYBOX_TOOL_TOKEN`).
    """

    def __init__(
        self, names: Iterable[str] = SERVED, *, address: str | None = None, token: str | None = None
    ) -> None:
        self.names = frozenset(names)
        self.address = address
        self.token = token
        self._lock = threading.Lock()
        self._sources: dict[str, dict[str, Any] | None] = {}
        # The generation the loaded modules were read at; `None`: nothing read since the last drop.
        self._generation: str | None = None
        self._mixed = False  # read at more than one generation: dropped at the next check
        self._staged: dict[str, str] = {}  # package name -> the host's staging directory it comes from

    # -- the finder

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.names:
            return None
        source = self._source(fullname)
        if source is None:
            return None  # not on the host: `ModuleNotFoundError` once no other finder has it either
        origin, package = source["origin"], source["package"]
        namespace = package and not origin.endswith(".py")
        spec = importlib.machinery.ModuleSpec(
            fullname, cast("Loader", self), origin=None if namespace else origin, is_package=package
        )
        if package:
            directory = origin if namespace else origin.rpartition("/")[0]
            spec.submodule_search_locations = [directory]
        spec.has_location = not namespace  # sets `__file__` to the host path
        return spec

    def invalidate_caches(self) -> None:
        """`importlib.invalidate_caches()`: forget the sources read (the modules stay loaded)."""
        with self._lock:
            self._sources.clear()

    # -- the loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        spec = module.__spec__
        assert spec is not None
        source = self._source(spec.name)
        if source is None or not source["code"]:
            return  # a namespace package (or an empty module)
        origin = source["origin"]
        code = source["code"]
        # Tracebacks and `inspect` read the host path, which does not exist here: the source is in the cache,
        # and an entry without an mtime is never checked against the disk.
        linecache.cache[origin] = (len(code), None, code.splitlines(keepends=True), origin)
        exec(compile(code, origin, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname: str) -> str | None:
        """The module's source (for `linecache` and `inspect`)."""
        source = self._source(fullname)
        return None if source is None else str(source["code"])

    def is_package(self, fullname: str) -> bool:
        source = self._source(fullname)
        return bool(source and source["package"])

    # -- staged packages

    def serves(self, name: str) -> bool:
        """Whether this hook answers for the module `name`."""
        return name.partition(".")[0] in self.names

    def stage(self, name: str, directory: str) -> importlib.machinery.ModuleSpec | None:
        """Serve the package `name` and its submodules from the host's `directory`, a code action's staging
        directory (see the module's description); the package's spec, or `None` when the host has no such
        package there. The caller makes the module (`importlib.util.module_from_spec`) and puts it in
        `sys.modules`, as `import_check` does with a local one.

        Raises:
            ValueError: `name` is not one of this hook's packages.
            ImportError: The tool server refused the directory or cannot be reached (the reason).
        """
        if not self.serves(name):
            raise ValueError(f"{name!r} is not in a package this import hook serves ({sorted(self.names)})")
        with self._lock:
            self._staged[name] = directory
            for cached in [n for n in self._sources if n == name or n.startswith(name + ".")]:
                del self._sources[cached]  # read from the final place earlier: not what is staged
        return self.find_spec(name)

    def _staged_request(self, fullname: str) -> dict[str, str] | None:
        with self._lock:
            for name in sorted(self._staged, key=len, reverse=True):  # the innermost staged package
                if fullname == name or fullname.startswith(name + "."):
                    return {"module": fullname[len(name) + 1 :], "staged": self._staged[name]}
        return None

    # -- the generation

    def check_generation(self, info: object = None) -> list[str]:
        """The `pre_run_cell` callback: drop the packages' modules when the served files changed since
        they were read. Never fails the cell: an unreachable channel is tried again at the next one.

        Returns:
            The module names dropped from `sys.modules` (sorted).
        """
        if self._generation is None:
            return []  # nothing imported since the last drop: no round trip
        try:
            answer = request_op(
                OP_GENERATION, timeout=GENERATION_TIMEOUT, address=self.address, token=self.token
            )
        except ToolRunnerError:
            return []
        with self._lock:
            if answer.get("generation") == self._generation and not self._mixed:
                return []
        return self.forget()

    def forget(self) -> list[str]:
        """Drop the packages' modules from `sys.modules` (and the sources read), so the next import reads
        them anew."""
        with self._lock:
            self._sources.clear()
            self._staged.clear()
            self._generation, self._mixed = None, False
        return forget_modules(sorted(self.names))

    # -- reading sources

    def _source(self, fullname: str) -> dict[str, Any] | None:
        with self._lock:
            if fullname in self._sources:
                return self._sources[fullname]
        try:
            answer = request_op(
                OP_SOURCE,
                self._staged_request(fullname) or {"module": fullname},
                timeout=SOURCE_TIMEOUT,
                address=self.address,
                token=self.token,
            )
        except ToolRunnerError as e:
            raise ImportError(
                f"cannot import {fullname} from the ipybox tool server: {e}", name=fullname
            ) from None
        source = answer.get("source")
        generation = answer.get("generation")
        if not (source is None or _valid(source)) or not isinstance(generation, str):
            raise ImportError(
                f"cannot import {fullname}: unexpected answer from the ipybox tool server: {str(answer)[:200]}",
                name=fullname,
            )
        with self._lock:
            if self._generation is None:
                self._generation = generation
            elif generation != self._generation:
                # The files changed between two reads: what this cell loaded may mix both; dropped before
                # the next cell, and the sources of the older generation are not reused meanwhile.
                self._mixed = True
                self._sources.clear()
            self._sources[fullname] = source
        return source


def installed() -> RemoteModules | None:
    """The import hook on `sys.meta_path` (`ipybox.in_kernel.remote.install` puts one there), if any."""
    for finder in sys.meta_path:
        if isinstance(finder, RemoteModules):
            return finder
    return None


def _valid(source: object) -> bool:
    return (
        isinstance(source, dict)
        and isinstance(source.get("code"), str)
        and isinstance(source.get("package"), bool)
        and isinstance(source.get("origin"), str)
        and source["origin"].startswith("/")
    )
