"""The rules package reads bottom-up: calls and annotations, the regex engine, then matching, then the engine,
then the models.

Checked on the source, `TYPE_CHECKING` imports and imports inside functions included: a cycle hidden in
either is still a cycle to a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ipybox.rules

RULES_DIR = Path(ipybox.rules.__file__).parent
# Each module may import only the modules listed before it.
ORDER = ["calls", "tool_annotations", "linear_regex", "matching", "engine", "models"]


def imported_rules_modules(module: str) -> set[str]:
    tree = ast.parse((RULES_DIR / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found.update(name.split(".")[2] for name in names if name.startswith("ipybox.rules."))
    return found


def test_each_rules_module_imports_only_the_modules_below_it() -> None:
    for position, module in enumerate(ORDER):
        above = set(ORDER[position:])
        assert not imported_rules_modules(module) & above, f"ipybox.rules.{module} imports a module above it"
