"""A generated tool module names the package root it sits in (`PACKAGE_ROOT`, from its own `__file__` at
import) and passes it with each call (issue 15, item 6): the host finds its server by that root, wherever
the package was generated. Never parameters: the module holds a path and a name."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipybox.mcp_apigen import render_sources, write_mcp_sources

TOOL = {
    "name": "add",
    "description": "Add.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
}


@pytest.fixture
def loaded() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        sys.modules.pop(name, None)


def _import(path: Path, name: str, loaded: list[str]) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loaded.append(name)
    spec.loader.exec_module(module)
    return module


def test_an_imported_module_knows_the_root_it_was_generated_into(tmp_path: Path, loaded: list[str]) -> None:
    root = tmp_path / "other" / "tools"
    write_mcp_sources("calc", [TOOL], root)
    module = _import(root / "calc" / "add.py", "_package_root_add", loaded)
    named = module.PACKAGE_ROOT
    assert named == str(root)
    assert module.SERVER_NAME == "calc"


def test_a_package_moved_elsewhere_names_where_it_is_now(tmp_path: Path, loaded: list[str]) -> None:
    # The host finds nothing recorded for the new place (unless generated there): it never trusts more.
    write_mcp_sources("calc", [TOOL], tmp_path / "first")
    (tmp_path / "first").rename(tmp_path / "moved")
    module = _import(tmp_path / "moved" / "calc" / "add.py", "_package_root_moved", loaded)
    named = module.PACKAGE_ROOT
    assert named == str(tmp_path / "moved")


def test_source_run_without_a_file_names_no_root() -> None:
    # E.g. the source pasted into a cell: the call then names the server only, as in ipybox 0.9.
    source = render_sources("calc", [TOOL])["add.py"]
    namespace: dict[str, object] = {"__name__": "_package_root_nofile"}
    exec(compile(source, "<pasted>", "exec"), namespace)
    assert namespace["PACKAGE_ROOT"] is None


def test_the_module_passes_its_root_and_nothing_else_to_the_runner() -> None:
    source = render_sources("calc", [TOOL])["add.py"]
    assert source.count("ToolRunner(SERVER_NAME, package=PACKAGE_ROOT)") == 2
    assert "server_params" not in source.lower()
