"""`ipybox.errors`: one root for every exception ipybox raises, drawn in its docstring.

The drawing is parsed and held against the code: every public exception class of ipybox (outside
`ipybox.in_kernel`, whose exceptions are raised inside kernels) is drawn exactly once, imports from the
module drawn next to it, has the drawn parent as its first base, and keeps the drawn builtin base (the one
it had before the tree existed), so `except ValueError` and friends keep catching it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

import ipybox
import ipybox.errors
from ipybox.errors import IpyboxError
from tests.test_public_api import PUBLIC

# Modules not imported when looking for exception classes: code that runs inside kernels, and the
# command line's `python -m` entry point (importing it runs the command).
SKIPPED = ("ipybox.in_kernel", "ipybox.cli.__main__")

_LINE = re.compile(r"^(?P<prefix>[ │├└─]*)(?P<name>\w+)\s+(?P<module>[\w.]+)(?:\s+(?P<builtin>\w+))?$")


@dataclass(frozen=True)
class Node:
    name: str
    module: str
    builtin: str | None
    parent: str | None


def drawn_tree(doc: str) -> list[Node]:
    """The classes the docstring draws: the indented block that starts with `IpyboxError`."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("IpyboxError "))
    indent = len(lines[start]) - len(lines[start].lstrip())
    nodes: list[Node] = []
    ancestors: list[str] = []
    for line in lines[start:]:
        if not line.strip():
            break
        match = _LINE.match(line[indent:])
        assert match, f"not a line of the tree: {line!r}"
        depth = len(match["prefix"]) // 4  # each level is 4 characters: "├── " or "│   "
        ancestors[depth:] = [match["name"]]
        parent = ancestors[depth - 1] if depth else None
        nodes.append(Node(match["name"], match["module"], match["builtin"], parent))
    return nodes


def ipybox_modules() -> list[ModuleType]:
    modules = [ipybox]
    for info in pkgutil.walk_packages(ipybox.__path__, "ipybox."):
        if info.name.startswith(SKIPPED):
            continue
        modules.append(importlib.import_module(info.name))
    return modules


def public_exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in ipybox_modules():
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                assert name not in found, f"two exception classes named {name}"
                found[name] = value
    return found


TREE = drawn_tree(ipybox.errors.__doc__ or "")


def builtin_bases(cls: type[BaseException]) -> list[type]:
    """The builtin classes `cls` derives from, below `Exception`, nearest first."""
    return [
        base
        for base in cls.__mro__
        if base.__module__ == "builtins" and base not in (Exception, BaseException, object)
    ]


def test_the_drawing_names_exactly_the_public_exception_classes() -> None:
    drawn = [node.name for node in TREE]
    assert len(drawn) == len(set(drawn)), "a class is drawn twice"
    assert set(drawn) == set(public_exception_classes())


def test_every_public_exception_class_is_an_ipybox_error() -> None:
    for name, cls in public_exception_classes().items():
        assert issubclass(cls, IpyboxError), name


@pytest.mark.parametrize("node", TREE, ids=lambda node: node.name)
def test_each_class_is_drawn_under_its_parent_with_its_module_and_builtin_base(node: Node) -> None:
    cls = getattr(importlib.import_module(node.module), node.name)
    assert cls is public_exception_classes()[node.name]
    if node.parent is None:
        assert cls.__bases__ == (Exception,)
    else:
        assert cls.__bases__[0].__name__ == node.parent
    nearest = builtin_bases(cls)[:1]
    assert [base.__name__ for base in nearest] == ([node.builtin] if node.builtin else [])
    if node.builtin:
        assert issubclass(cls, getattr(builtins, node.builtin))


def test_except_value_error_still_catches_a_config_error() -> None:
    from ipybox.config import ConfigError
    from ipybox.config.errors import ConfigProblem

    problem = ConfigProblem("ipybox.toml", 3, 1, "unknown key 'comand' in [servers.fs]")
    with pytest.raises(ValueError) as caught:
        raise ConfigError(Path("ipybox.toml"), [problem])
    assert isinstance(caught.value, IpyboxError)
    assert str(caught.value) == "ipybox.toml:3:1: unknown key 'comand' in [servers.fs]"


def test_except_timeout_error_still_catches_an_execution_timeout() -> None:
    from ipybox.code_exec.client import ExecutionTimeoutError
    from ipybox.kernels.result import CodeExecutionResult

    with pytest.raises(TimeoutError):
        raise ExecutionTimeoutError(
            "ran past 1 s", kernel_restarted=False, result=CodeExecutionResult(text="")
        )


def test_an_os_error_leaf_keeps_its_errno_and_message() -> None:
    import errno

    from ipybox.mcp_client.registry import UnsafeRegistryError

    error = UnsafeRegistryError(errno.EACCES, "the registry is writable by others")
    assert isinstance(error, PermissionError) and isinstance(error, IpyboxError)
    assert error.errno == errno.EACCES and str(error) == "[Errno 13] the registry is writable by others"


def test_every_published_exception_is_an_ipybox_error_or_raised_in_kernels() -> None:
    for published, names in PUBLIC:
        module = importlib.import_module(published)
        for name in names:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                in_kernel = value.__module__.startswith("ipybox.in_kernel")
                assert issubclass(value, IpyboxError) != in_kernel, f"{published}.{name}"


def test_the_errors_module_imports_the_standard_library_only() -> None:
    tree = ast.parse(Path(ipybox.errors.__file__).read_text())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
