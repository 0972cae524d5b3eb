"""Output parsers (`mcpparse/<server>/<module>.py`): found by file existence only, checked by `ast` only on
the host, and generated into the tool module as `ParseResult`/`run_parsed()`, imported when first used, so
that a parser that does not import (or never finishes importing) never breaks `run()` or importing the
module, and importing the module never runs it.

The generated modules are imported in this process (under a root named `tools_<random>` and servers of
random names, forgotten afterwards), as a kernel would import them; the tool calls themselves are tested
against a real server in a real kernel in `test_parsers_live.py`."""

from __future__ import annotations

import ast
import importlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ipybox.mcp_apigen import render_sources, write_mcp_sources
from ipybox.mcp_apigen.names import module_names
from ipybox.mcp_apigen.parsers import (
    MAX_PARSER_BYTES,
    MCPPARSE,
    discover_parsers,
    parser_file,
    parsers_dir,
    read_parser,
    source_problems,
    static_problems,
    unmatched_parsers,
)

ECHO = {
    "name": "echo",
    "description": "Echoes the text.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}
ADD = {
    "name": "add",
    "description": "Adds two numbers.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    "output_schema": {"type": "object", "properties": {"total": {"type": "integer"}}},
}

GOOD_PARSER = """\
from pydantic import BaseModel


class ParseResult(BaseModel):
    words: list[str]


def parse(raw: str) -> ParseResult:
    return ParseResult(words=raw.split())
"""


@dataclass
class Layout:
    """A directory holding a generated root (`tools_<random>/`) and `mcpparse/`, importable here."""

    base: Path
    root: Path
    server: str

    def parser(self, module: str, source: str) -> Path:
        path = self.base / MCPPARSE / self.server / f"{module}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        return path

    def generate(self, *tools: dict[str, Any]) -> list[str]:
        return write_mcp_sources(self.server, list(tools) or [ECHO, ADD], self.root)

    def module(self, name: str) -> Any:
        return importlib.import_module(f"{self.root.name}.{self.server}.{name}")


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[Layout]:
    suffix = uuid.uuid4().hex[:8]
    found = Layout(tmp_path, tmp_path / f"tools_{suffix}", f"srv_{suffix}")
    sys.path.insert(0, str(tmp_path))
    try:
        yield found
    finally:
        sys.path.remove(str(tmp_path))
        for name in list(sys.modules):
            if (
                name.startswith((f"{found.root.name}.", f"{MCPPARSE}.{found.server}"))
                or name == found.root.name
            ):
                del sys.modules[name]


# -- discovery


def test_a_parser_is_a_regular_python_file_named_like_a_module(layout: Layout) -> None:
    layout.parser("echo", GOOD_PARSER)
    layout.parser("add", "")
    layout.parser("__init__", "")
    for name in ["notes.txt", "1bad.py", "class.py", "with-dash.py", ".echo.py.swp"]:
        (layout.base / MCPPARSE / layout.server / name).write_text("")
    (layout.base / MCPPARSE / layout.server / "folder.py").mkdir()
    assert discover_parsers(layout.root, layout.server) == {"echo", "add"}
    assert parsers_dir(layout.root) == layout.base / MCPPARSE


def test_no_parsers_directory_means_no_parsers(layout: Layout) -> None:
    assert discover_parsers(layout.root, layout.server) == frozenset()
    (layout.base / MCPPARSE).mkdir()
    assert discover_parsers(layout.root, layout.server) == frozenset()
    assert discover_parsers(layout.root, "../etc") == frozenset()


def test_symlinked_parsers_and_directories_are_ignored(layout: Layout, tmp_path_factory: Any) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "echo.py").write_text(GOOD_PARSER)
    layout.parser("add", GOOD_PARSER)
    (layout.base / MCPPARSE / layout.server / "echo.py").symlink_to(outside / "echo.py")
    assert discover_parsers(layout.root, layout.server) == {"add"}

    (layout.base / MCPPARSE / "linked").symlink_to(outside, target_is_directory=True)
    assert discover_parsers(layout.root, "linked") == frozenset()

    other = tmp_path_factory.mktemp("other")
    (other / MCPPARSE).symlink_to(layout.base / MCPPARSE, target_is_directory=True)
    assert discover_parsers(other / "mcptools", layout.server) == frozenset()


# -- generation


def test_only_modules_with_a_parser_get_run_parsed() -> None:
    files = render_sources("srv", [ECHO, ADD], parsers={"echo", "no_such_tool"})
    echo, add = ast.parse(files["echo.py"]), ast.parse(files["add.py"])
    assert {"run", "arun", "run_parsed", "arun_parsed"} <= _functions(echo)
    assert "run_parsed" not in _functions(add) and "importlib" not in files["add.py"]
    assert render_sources("srv", [ECHO, ADD]) == render_sources("srv", [ECHO, ADD], parsers=())


def test_the_package_index_marks_the_tools_with_a_parser() -> None:
    index = render_sources("srv", [ECHO, ADD], parsers={"echo"})["__init__.py"]
    assert "- echo: Echoes the text. (run_parsed -> ParseResult)" in index
    assert "- add: Adds two numbers.\n" in index
    assert "mcpparse/srv/<module>.py" in index
    assert "run_parsed" not in render_sources("srv", [ECHO, ADD])["__init__.py"]


def test_a_parser_never_renames_a_generated_model() -> None:
    titled = {
        **ECHO,
        "input_schema": {
            "type": "object",
            "properties": {"options": {"type": "object", "title": "ParseResult", "properties": {}}},
        },
    }
    source = render_sources("srv", [titled], parsers={"echo"})["echo.py"]
    classes = {node.name for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    assert "ParseResult" not in classes  # the parser's name stays free: the model got another
    assert classes == {
        node.name
        for node in ast.parse(render_sources("srv", [titled])["echo.py"]).body
        if isinstance(node, ast.ClassDef)
    }


def test_a_tool_name_reaches_the_parser_import_only_as_a_sanitized_literal() -> None:
    tool = {**ECHO, "name": 'x"); import os; os.system("boom"); ("'}
    stem = module_names([tool["name"]])[tool["name"]]
    source = render_sources("srv", [tool], parsers={stem})[f"{stem}.py"]
    tree = ast.parse(source)
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }
    assert stem.isidentifier()
    assert constants["PARSER_MODULE"] == f"mcpparse.srv.{stem}"
    assert constants["PARSER_FILE"] == f"mcpparse/srv/{stem}.py"
    imports = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    assert imports == ["importlib", "os", "typing"]  # the generator's own, aliased; nothing of the name


def test_write_mcp_sources_finds_the_parsers_next_to_its_root(layout: Layout) -> None:
    layout.parser("echo", GOOD_PARSER)
    assert layout.generate() == ["echo", "add"]
    assert "def run_parsed(" in (layout.root / layout.server / "echo.py").read_text()
    assert "def run_parsed(" not in (layout.root / layout.server / "add.py").read_text()
    write_mcp_sources(layout.server, [ECHO, ADD], layout.root, parsers=())  # told: none
    assert "def run_parsed(" not in (layout.root / layout.server / "echo.py").read_text()


def test_a_working_parser_is_the_modules_parse_result(layout: Layout) -> None:
    layout.parser("echo", GOOD_PARSER)
    layout.generate()
    echo = layout.module("echo")
    parser = importlib.import_module(f"{MCPPARSE}.{layout.server}.echo")
    assert echo.ParseResult is parser.ParseResult
    assert echo._parse_function()("a b") == parser.ParseResult(words=["a", "b"])


@pytest.mark.parametrize(
    ("source", "where", "error"),
    [
        (
            "from pydantic import BaseModel\n\nx = undefined_name\n",
            ":3: NameError: name 'undefined_name'",
            "",
        ),
        ("def parse(raw:\n", ":1:", "SyntaxError: "),
        ("import sys\n\nsys.exit(3)\n", ":3: SystemExit: 3", ""),
        ("def parse(raw):\n    return raw\n", ": AttributeError:", "has no attribute 'ParseResult'"),
    ],
    ids=["name-error", "syntax-error", "exit", "no-parse-result"],
)
def test_a_broken_parser_leaves_the_module_and_run_working_and_run_parsed_says_why(
    layout: Layout, source: str, where: str, error: str
) -> None:
    layout.parser("echo", source)
    layout.generate()
    echo = layout.module("echo")  # imports, whatever the parser does
    assert callable(echo.run) and echo.Params(text="a").text == "a"
    with pytest.raises(ImportError) as raised:
        echo.run_parsed(echo.Params(text="a b"))
    message = str(raised.value)
    assert f"{MCPPARSE}/{layout.server}/echo.py{where}" in message and error in message
    assert "run() still works" in message
    with pytest.raises(ImportError, match="run\\(\\) still works"):
        exec(f"from {layout.root.name}.{layout.server}.echo import ParseResult", {})


def test_importing_a_tool_module_never_runs_its_parser(layout: Layout) -> None:
    ran = layout.base / "parser-ran"
    layout.parser("echo", f"open({str(ran)!r}, 'w').close()\n" + GOOD_PARSER)
    layout.generate()
    echo = layout.module("echo")
    assert not ran.exists()  # kernel-written code runs only when the parser is used
    assert echo._parse_function()("a b").words == ["a", "b"]
    assert ran.exists()


def test_a_parser_whose_import_hangs_leaves_the_module_and_run_working_and_run_parsed_says_why(
    layout: Layout,
) -> None:
    layout.parser("echo", "import time\n\ntime.sleep(30)\n" + GOOD_PARSER)
    layout.generate()
    started = time.monotonic()
    echo = layout.module("echo")
    assert time.monotonic() - started < 10  # eagerly imported, the parser held the import for 30 s
    assert callable(echo.run) and echo.Params(text="a").text == "a"
    echo.PARSER_IMPORT_TIMEOUT = 0.5
    started = time.monotonic()
    with pytest.raises(ImportError) as raised:
        echo.run_parsed(echo.Params(text="a b"))
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert f"{MCPPARSE}/{layout.server}/echo.py: its import did not finish within 0.5 s" in message
    assert "run() still works" in message
    with pytest.raises(ImportError, match="did not finish"):  # once: the next use does not wait again
        echo.run_parsed(echo.Params(text="a b"))


async def test_arun_parsed_of_a_broken_parser_raises_before_calling_the_tool(layout: Layout) -> None:
    layout.parser("echo", "raise RuntimeError('parser is broken')\n")
    layout.generate()
    echo = layout.module("echo")
    # No tool server is configured here: the parser's error comes first, not the missing server's.
    with pytest.raises(ImportError, match="RuntimeError: parser is broken"):
        await echo.arun_parsed(echo.Params(text="x"))


# -- the host's checks (ast only)


def test_a_syntax_error_is_located_by_line_and_column() -> None:
    [problem] = source_problems("from pydantic import BaseModel\n\ndef parse(raw:\n", "mcpparse/s/m.py")
    assert str(problem).startswith("mcpparse/s/m.py:3:") and "SyntaxError" in problem.message
    assert problem.line == 3 and problem.column is not None


def test_a_parser_must_define_parse_result_and_parse() -> None:
    problems = source_problems("import json\n", "mcpparse/s/m.py")
    assert [p.message.split(":")[0] for p in problems] == ["defines no ParseResult", "defines no parse"]
    assert str(problems[0]) == (
        "mcpparse/s/m.py: defines no ParseResult: a parser defines class ParseResult(BaseModel): the model "
        "parse() returns"
    )
    defined_in_blocks = (
        "try:\n    from x import ParseResult\nexcept ImportError:\n    ParseResult = dict\n"
        "if True:\n    def parse(raw): return raw\n"
    )
    assert source_problems(defined_in_blocks, "p.py") == []
    assert source_problems("from elsewhere import *\n", "p.py") == []  # can't tell: the kernel checks
    assert source_problems(GOOD_PARSER, "p.py") == []
    assert source_problems(b"x = 1\x00\n", "p.py")[0].message.startswith("SyntaxError")


def test_the_host_reads_a_parser_only_as_a_regular_file_of_bounded_size(layout: Layout) -> None:
    path = layout.parser("echo", GOOD_PARSER)
    assert read_parser(layout.root, layout.server, "echo") == GOOD_PARSER.encode()
    assert static_problems(layout.root, layout.server, "echo") == []

    path.write_bytes(b"#" * (MAX_PARSER_BYTES + 1))
    [problem] = static_problems(layout.root, layout.server, "echo")
    assert "could not be read: larger than" in str(problem)

    path.unlink()
    os.mkfifo(path)  # a kernel could plant one: reading it must not block
    [problem] = static_problems(layout.root, layout.server, "echo")
    assert problem.path == parser_file(layout.server, "echo") and "could not be read" in problem.message

    path.unlink()
    path.symlink_to(layout.base / "elsewhere.py")
    (layout.base / "elsewhere.py").write_text(GOOD_PARSER)
    with pytest.raises(OSError):
        read_parser(layout.root, layout.server, "echo")
    with pytest.raises(ValueError):
        read_parser(layout.root, layout.server, "../x")


def test_a_parser_named_after_no_module_is_reported_with_the_closest_module_names() -> None:
    [problem] = unmatched_parsers("srv", ["echo", "ecko"], ["echo", "add"])
    assert str(problem) == (
        "mcpparse/srv/ecko.py: server 'srv' has no tool module 'ecko'; did you mean 'echo'? (a parser is "
        "named after the module it parses; mcptools/srv/__init__.py lists them)"
    )
    [problem] = unmatched_parsers("srv", ["zzz"], ["echo", "add"])
    assert "no tool module 'zzz' (a parser is named" in str(problem)
    assert unmatched_parsers("srv", ["echo"], ["echo"]) == []


def _functions(tree: ast.Module) -> set[str]:
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
