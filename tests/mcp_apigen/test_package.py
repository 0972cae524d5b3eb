from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipybox.mcp_apigen import generate_mcp_sources, write_mcp_sources
from ipybox.mcp_apigen.literals import doc_text, docstring, py_str
from ipybox.mcp_apigen.sources import wait_for_stopped_servers
from ipybox.mcp_client import ServerStartError
from tests.servers import params
from tests.servers.edge_server import CANARY_CODE, INJECTION_WITH_CODE, RAW_TOOLS
from tests.servers.processes import TAG_ENV, pids, tagged

TOOL = {
    "name": "add",
    "description": "Add.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
}


@pytest.mark.integration
async def test_generate_mcp_sources_connects_lists_and_writes(tmp_path: Path) -> None:
    names = await generate_mcp_sources("edge", params.edge(), tmp_path / "mcptools")
    assert names[:2] == ["echo", "add"] and "get_user_2" in names
    assert {p.stem for p in (tmp_path / "mcptools" / "edge").glob("*.py")} == {*names, "__init__"}


@pytest.mark.integration
async def test_generate_mcp_sources_reports_server_errors_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match="'broken'"):
        await generate_mcp_sources("broken", {"command": "no-such-server"}, tmp_path)
    assert _entries(tmp_path) == []


def _entries(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_existing_package_is_replaced_atomically(tmp_path: Path) -> None:
    old = tmp_path / "calc"
    old.mkdir()
    (old / "stale.py").write_text("x = 1\n")
    assert write_mcp_sources("calc", [TOOL], tmp_path) == ["add"]
    assert sorted(p.name for p in old.iterdir()) == ["__init__.py", "add.py"]
    assert [p.name for p in tmp_path.iterdir()] == ["calc"]  # no staging or retired directories left


@pytest.mark.parametrize("server_name", ["brave-search", "1st", "class", "", "ünï", "a/b"])
def test_invalid_server_names_are_rejected_before_writing(tmp_path: Path, server_name: str) -> None:
    with pytest.raises(ValueError, match="is not a valid Python package name"):
        write_mcp_sources(server_name, [TOOL], tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_injection_attempts_run_nothing_on_import(tmp_path: Path) -> None:
    write_mcp_sources("evil", RAW_TOOLS, tmp_path / "mcptools")
    canary = tmp_path / "canary"
    code = "import importlib, mcptools.evil as p\nfor m in p.__all__: importlib.import_module('mcptools.evil.' + m)\n"
    env = {"IPYBOX_CANARY": str(canary), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True)
    assert not canary.exists()
    # The canary code is live: run directly, it does create the file.
    subprocess.run([sys.executable, "-c", CANARY_CODE], env=env, check=True)
    assert canary.exists()
    # Generated modules contain nothing but imports, constants, class and function definitions.
    for path in (tmp_path / "mcptools" / "evil").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            assert isinstance(
                node,
                ast.Expr
                | ast.ImportFrom
                | ast.Import
                | ast.Assign
                | ast.ClassDef
                | ast.FunctionDef
                | ast.AsyncFunctionDef,
            )
            if isinstance(node, ast.Expr):
                assert isinstance(node.value, ast.Constant) and node is tree.body[0]


def test_injected_text_survives_unchanged_as_data(tmp_path: Path) -> None:
    write_mcp_sources("evil", RAW_TOOLS, tmp_path / "mcptools")
    sys.path.insert(0, str(tmp_path))
    try:
        from mcptools.evil import inject  # type: ignore[import-not-found]

        field = next(iter(inject.Params.model_fields.values()))
        assert field.alias == INJECTION_WITH_CODE and field.description == INJECTION_WITH_CODE
        assert inject.Params().model_dump(by_alias=True)[INJECTION_WITH_CODE] == INJECTION_WITH_CODE
        assert "touch" in inject.__doc__
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("mcptools.evil") or m == "mcptools"]:
            del sys.modules[name]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_string_and_docstring_escaping(text: str) -> None:
    assert ast.literal_eval(py_str(text)) == text
    doc = docstring(text + " tail", indent="    ")
    parsed = ast.parse(f"def f():\n    {doc}\n    pass\n") if doc else None
    if parsed is not None:
        value = ast.get_docstring(parsed.body[0], clean=False)  # type: ignore[arg-type]
        assert value is not None and "\x00" not in doc_text(text)


@pytest.mark.integration
def test_generated_modules_import_only_pydantic_and_stdlib(tmp_path: Path) -> None:
    write_mcp_sources("calc", [TOOL, *RAW_TOOLS[-8:]], tmp_path / "mcptools")
    code = (
        "import sys\n"
        "import pydantic\n"
        "before = set(sys.modules)\n"
        "from mcptools.calc import add, kitchen_sink, tree\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    modules = set(ast.literal_eval(out.stdout))
    assert not modules & {"ipybox", "mcp", "mcp_types", "jinja2", "httpx2", "anyio"}, modules


@pytest.mark.integration
async def test_the_server_is_stopped_after_generation(tmp_path: Path) -> None:
    await generate_mcp_sources("edge", tagged(params.edge(), "apigen-stop"), tmp_path / "mcptools")
    await wait_for_stopped_servers()
    assert pids("apigen-stop") == []


@pytest.mark.integration
def test_no_server_outlives_a_program_that_generates_and_exits(tmp_path: Path) -> None:
    # The server's stop runs in the background; asyncio.run() ending must still wait for it.
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from ipybox import generate_mcp_sources\n"
        f"asyncio.run(generate_mcp_sources('edge', {tagged(params.edge(), 'apigen-exit')!r}, Path(sys.argv[1])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "mcptools")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mcptools" / "edge" / "echo.py").exists()
    tag = f"{TAG_ENV}=apigen-exit".encode()
    survivors = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if tag in environ.read_bytes().split(b"\0"):
                survivors.append(environ.parent.name)
        except OSError:
            continue
    assert survivors == []
