"""One generated tool module, compared with a committed copy, so that any change to the generator's output
shows as a diff in review.

The tool below is fixed and covers what the templates branch on: a description with quotes, backslashes and
blank lines, a nested object, enums, optional and defaulted fields, a property that is not a Python name,
an array with a constraint, a `pattern` that is checked and one that is left to the server (look-around,
which pydantic's linear-time engine cannot compile), and an output schema (so `run()` returns a `Result`
model). It is rendered by
the real generator (`render_sources`, no server), once as is and once with an output parser
(`mcpparse/catalog/search_items.py`), which adds `ParseResult`, `run_parsed()` and `arun_parsed()`. After an
intended change, rewrite the copies with `UPDATE_GOLDEN=1 .venv/bin/pytest tests/mcp_apigen/test_golden.py`
and commit the diff.

The golden file is excluded from ruff (pyproject.toml): it must stay byte for byte what the generator
writes, which a formatter run over the tree would otherwise change.
"""

from __future__ import annotations

import ast
import difflib
import os
from pathlib import Path
from typing import Any

from ipybox.mcp_apigen import render_sources

GOLDEN = Path(__file__).parent / "golden" / "search_items.py"
GOLDEN_PARSED = Path(__file__).parent / "golden" / "search_items_parsed.py"

TOOL: dict[str, Any] = {
    "name": "search-items",
    "description": (
        'Search the "catalog" for items.\n\n'
        'Returns at most `limit` matches; a query like """x""" is searched literally, and so is \\n.\n'
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": 'What to look for ("quoted" phrases match whole).'},
            "filters": {
                "type": "object",
                "description": "Narrow the search.",
                "properties": {
                    "category": {"type": "string", "enum": ["books", "music", "film"]},
                    "in-stock": {"type": "boolean"},
                    "price": {
                        "type": "object",
                        "properties": {"min": {"type": "number", "minimum": 0}, "max": {"type": "number"}},
                    },
                },
                "required": ["category"],
            },
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
            "limit": {"type": "integer", "default": 10, "minimum": 1, "maximum": 100},
            "sort": {"type": "string", "enum": ["relevance", "price-asc", "price-desc"]},
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"},
            "slug": {"type": "string", "pattern": "^(?!-)[a-z0-9-]+$"},
        },
        "required": ["query"],
    },
    "outputSchema": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "title": {"type": "string"},
                        "price": {"type": ["number", "null"]},
                    },
                    "required": ["id", "title"],
                },
            },
            "total": {"type": "integer"},
        },
        "required": ["items", "total"],
    },
}


def rendered(parsers: tuple[str, ...] = ()) -> str:
    return render_sources("catalog", [TOOL], parsers=parsers)["search_items.py"]


def test_the_generated_tool_module_matches_the_golden_file() -> None:
    compare(rendered(), GOLDEN)


def test_the_generated_tool_module_with_a_parser_matches_its_golden_file() -> None:
    compare(rendered(parsers=("search_items",)), GOLDEN_PARSED)


def compare(source: str, golden_file: Path) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden_file.parent.mkdir(exist_ok=True)
        golden_file.write_text(source, encoding="utf-8")
    assert golden_file.exists(), (
        f"{golden_file} is missing: create it with `UPDATE_GOLDEN=1 .venv/bin/pytest {Path(__file__).name}`"
    )
    golden = golden_file.read_text(encoding="utf-8")
    if source != golden:
        diff = "".join(
            difflib.unified_diff(
                golden.splitlines(keepends=True),
                source.splitlines(keepends=True),
                fromfile=f"{golden_file.name} (committed)",
                tofile=f"{golden_file.name} (generated now)",
            )
        )
        raise AssertionError(
            f"the generator's output changed:\n{diff}\nIf the change is intended, rewrite the golden file "
            "with `UPDATE_GOLDEN=1 .venv/bin/pytest tests/mcp_apigen/test_golden.py` and commit it."
        )


def defined(golden_file: Path) -> set[str]:
    tree = ast.parse(golden_file.read_text(encoding="utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    }


def test_the_golden_module_defines_the_tool_api() -> None:
    # The golden file is a module a kernel would import: it parses, and defines what callers use.
    assert {"Params", "Result", "run", "arun"} <= defined(GOLDEN)
    assert "run_parsed" not in defined(GOLDEN)


def test_the_golden_module_with_a_parser_adds_run_parsed_and_changes_nothing_else() -> None:
    assert defined(GOLDEN_PARSED) >= defined(GOLDEN) | {"run_parsed", "arun_parsed"}
    plain = ast.parse(GOLDEN.read_text(encoding="utf-8"))
    parsed = ast.parse(GOLDEN_PARSED.read_text(encoding="utf-8"))
    # The same models and run()/arun(): a parser adds to a module, it renames or changes nothing it had.
    assert {ast.dump(node) for node in plain.body[1:] if not isinstance(node, ast.Import)} <= {
        ast.dump(node) for node in parsed.body[1:]
    }
    assert "Output parser: mcpparse/catalog/search_items.py" in (ast.get_docstring(parsed) or "")
