"""The package's shape, checked from its source: no import cycles, and in-kernel code that needs nothing but
the standard library.

The layers themselves (which package may import which) are `import-linter`'s contracts in pyproject.toml,
run by scripts/test as `lint-imports`. A layers contract does not see a cycle inside one package
(`ipybox.rules.models` <-> `ipybox.rules.engine`), so cycles are checked here over every module, once with
the imports that run and once with `TYPE_CHECKING` imports added: a cycle that only the type checker sees
still means the two modules can't be read, or moved, one without the other.

`ipybox.in_kernel` runs inside kernels, sandboxed or not, whose interpreter may have none of ipybox's
dependencies installed, and is imported by every generated tool module: it may import the standard library
and itself, nothing else.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
IN_KERNEL = ROOT / "ipybox" / "in_kernel"

# The one exception, by file: the kernels' entry point starts the kernel itself, so the kernel's own runtime
# is there by definition (and imported only inside `main()`, after the entry point has run).
KERNEL_RUNTIME = {"kernel_main.py": {"ipykernel"}}


def strongly_connected_components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (a deep import chain must not hit the recursion limit).

    Returns the components with more than one member, plus single modules that import themselves: exactly
    the import cycles. Members are sorted, components sorted by their first member, for stable messages.
    """
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0

    for start in sorted(graph):
        if start in index:
            continue
        # Each frame: the node and an iterator over its successors still to visit.
        work: list[tuple[str, Iterator[str]]] = []
        index[start] = lowlink[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(sorted(graph.get(start, ())))))
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = lowlink[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    advanced = True
                    break
                if succ in on_stack:
                    lowlink[node] = min(lowlink[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                lowlink[parent] = min(lowlink[parent], lowlink[node])
            if lowlink[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(sorted(component))
    return sorted(components)


def import_graph(*, with_type_checking: bool) -> dict[str, set[str]]:
    # cache_dir=None: the test writes nothing into the checkout.
    graph = grimp.build_graph("ipybox", exclude_type_checking_imports=not with_type_checking, cache_dir=None)
    return {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}


def describe_cycles(graph: Mapping[str, set[str]], components: list[list[str]]) -> str:
    """One line per cycle: its modules, and the imports between them that close it."""
    lines = []
    for component in components:
        members = set(component)
        edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
        lines.append(f"- {', '.join(component)}\n    via: {'; '.join(edges)}")
    return "\n".join(lines)


def test_strongly_connected_components_finds_exactly_the_cycles() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": {"e"},
        "e": set(),
        "f": {"f"},
        "g": {"e"},
    }
    assert strongly_connected_components(graph) == [["a", "b", "c"], ["f"]]


def test_strongly_connected_components_of_an_acyclic_graph_is_empty() -> None:
    chain = {f"m{i}": {f"m{i + 1}"} for i in range(5000)}  # deeper than the recursion limit
    assert strongly_connected_components(chain) == []


def test_no_module_imports_itself_back_at_run_time() -> None:
    graph = import_graph(with_type_checking=False)
    cycles = strongly_connected_components(graph)
    assert not cycles, (
        f"{len(cycles)} import cycle(s) among ipybox's modules (imports that run, function-level ones "
        f"included); move the shared part down a layer or import the defining module directly, not its "
        f"package:\n{describe_cycles(graph, cycles)}"
    )


def test_no_module_imports_itself_back_under_type_checking() -> None:
    graph = import_graph(with_type_checking=True)
    cycles = strongly_connected_components(graph)
    assert not cycles, (
        f"{len(cycles)} import cycle(s) among ipybox's modules once `if TYPE_CHECKING:` imports count; "
        f"a type-only import is still a dependency:\n{describe_cycles(graph, cycles)}"
    )


def imported_modules(source: str, module: str, *, is_package: bool) -> Iterable[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, relative ones resolved against `module`."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                yield node.lineno, ".".join([*base, *([node.module] if node.module else [])])
            else:
                assert node.module is not None
                yield node.lineno, node.module


def test_in_kernel_code_imports_only_the_standard_library_and_itself() -> None:
    files = sorted(IN_KERNEL.rglob("*.py"))
    assert files, f"no modules found under {IN_KERNEL}"
    offending = []
    for path in files:
        parts = path.relative_to(ROOT).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        for line, name in imported_modules(path.read_text(), module, is_package=is_package):
            top = name.split(".")[0]
            if name == "ipybox.in_kernel" or name.startswith("ipybox.in_kernel."):
                continue
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            if top in KERNEL_RUNTIME.get(path.name, set()):
                continue
            offending.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert not offending, (
        "ipybox.in_kernel runs inside kernels and may import only the standard library and "
        "ipybox.in_kernel; move what it needs into ipybox.in_kernel or import it on the host:\n"
        + "\n".join(offending)
    )


def test_the_in_kernel_import_check_sees_relative_and_third_party_imports() -> None:
    source = "import os\nfrom . import tool_runner\nfrom .. import paths\nimport pydantic\n"
    assert list(imported_modules(source, "ipybox.in_kernel.x", is_package=False)) == [
        (1, "os"),
        (2, "ipybox.in_kernel"),
        (3, "ipybox"),
        (4, "pydantic"),
    ]


# Packages where every background task belongs to a task group that outlives it (`ipybox.lifecycle`,
# docs/design.md "Threading and cancellation"); a package joins once its last bare task is gone.
STRUCTURED = (
    "supervisor",
    "reconcile",
    "approval",
    "tool_server",
    "mcp_client",
    "mcp_server",
    "executor",
    "cli",
    "kernels",
)


def bare_tasks(source: str) -> Iterator[tuple[int, str]]:
    """Where `source` starts a task no group owns: `asyncio.create_task`, `ensure_future`, or a loop's
    `create_task` (line, call)."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner, attr = node.func.value, node.func.attr
        loop_call = isinstance(owner, ast.Call) and ast.unparse(owner.func).endswith(
            ("get_running_loop", "get_event_loop")
        )
        loop = (isinstance(owner, ast.Name) and owner.id in ("asyncio", "loop")) or loop_call
        if attr == "ensure_future" or (attr == "create_task" and loop):
            yield node.lineno, ast.unparse(node.func)


def test_structured_packages_start_no_task_outside_a_task_group() -> None:
    offending = [
        f"{path.relative_to(ROOT)}:{line}: {call}"
        for package in STRUCTURED
        for path in sorted((ROOT / "ipybox" / package).rglob("*.py"))
        for line, call in bare_tasks(path.read_text())
    ]
    assert not offending, (
        "start background work in a task group that outlives it: a Service's spawn(), or task_scope() / "
        "first_of() for work of one call (ipybox/lifecycle.py):\n" + "\n".join(offending)
    )


def test_the_bare_task_check_sees_each_way_of_starting_one() -> None:
    source = (
        "asyncio.create_task(a())\nasyncio.ensure_future(b())\nloop.create_task(c())\n"
        "asyncio.get_running_loop().create_task(d())\ngroup.create_task(e())\nself.spawn(f())\n"
    )
    assert [line for line, _ in bare_tasks(source)] == [1, 2, 3, 4]
