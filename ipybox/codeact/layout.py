"""Where code-as-tool files live, and the names they may have.

`mcpparse/` and `gentools/` sit next to the `mcptools/` directory (its parent is on the kernels' import
path, so `import mcpparse.<server>.<tool>` and `import gentools.<category>.<name>` work wherever
`import mcptools.<server>` does).

Names of categories and actions become directories, package names and parts of MCP tool names
(`<category>__<name>`), so they are checked before anything touches the disk: lowercase ASCII
identifiers starting with a letter, no double underscore (it separates category and name in tool names),
no keyword, no builtin, not `api`/`impl` (the action's own modules), at most 48 characters.
"""

from __future__ import annotations

import builtins
import keyword
import re
from pathlib import Path
from typing import Final

# The directory of output parsers, next to `mcptools/` (`mcpparse/<server>/<tool module>.py`): the
# generator's constant, since it writes the modules that import them.
from ipybox.mcp_apigen.parsers import MCPPARSE as MCPPARSE

GENTOOLS: Final = "gentools"
"""Directory of saved code actions, next to `mcptools/`: `gentools/<category>/<name>/`."""
API_MODULE: Final = "api"
IMPL_MODULE: Final = "impl"
ACTION_MANIFEST: Final = "action.json"
"""What a fresh kernel found in a saved action's `api.py` (input/output schema, `run()`'s docstring), with
the hash of the `api.py` it describes: written by the host when the action is saved."""
TOOL_NAME_SEPARATOR: Final = "__"

_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,47}")
_RESERVED: Final = frozenset({API_MODULE, IMPL_MODULE})


def parsers_dir(mcptools_dir: Path) -> Path:
    """The `mcpparse/` directory that belongs to `mcptools_dir`."""
    return mcptools_dir.parent / MCPPARSE


def gentools_dir(mcptools_dir: Path) -> Path:
    """The `gentools/` directory that belongs to `mcptools_dir`."""
    return mcptools_dir.parent / GENTOOLS


def name_problem(name: object, what: str) -> str | None:
    """Why `name` cannot be a category or action name (`what` says which, for the message); `None` if it
    can."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return (
            f"{what} {name!r} must be a lowercase Python identifier starting with a letter (a-z, 0-9, _; "
            "at most 48 characters), e.g. 'github' or 'commits_of_top_repos'"
        )
    if TOOL_NAME_SEPARATOR in name:
        return f"{what} {name!r} must not contain '__' (it separates category and name in MCP tool names)"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"{what} {name!r} is a Python keyword"
    if hasattr(builtins, name):
        return f"{what} {name!r} would shadow the Python builtin {name!r}"
    if name in _RESERVED:
        return f"{what} {name!r} is reserved for an action's own modules (api.py, impl.py)"
    return None


def action_tool_name(category: str, name: str) -> str:
    """The MCP tool name of a saved action (`github__commits_of_top_repos`)."""
    return f"{category}{TOOL_NAME_SEPARATOR}{name}"


def action_module(category: str, name: str) -> str:
    """The package of a saved action (`gentools.github.commits_of_top_repos`)."""
    return f"{GENTOOLS}.{category}.{name}"


def module_roots(mcptools_dir: Path) -> dict[str, Path]:
    """The generated packages kernels import, by top-level package name: `mcptools` (whatever its
    directory is called), `gentools` and `mcpparse` next to it. A remote kernel imports them from the tool
    server (`ipybox.in_kernel.remote_modules`), which serves these directories and nothing else."""
    return {
        mcptools_dir.name: mcptools_dir,
        GENTOOLS: gentools_dir(mcptools_dir),
        MCPPARSE: parsers_dir(mcptools_dir),
    }
