"""Output parsers in a real kernel, against our real edge server: `run_parsed()` returns the parser's
`ParseResult` (of a text tool, and of a tool with an output schema, whose parser gets JSON), and a parser
that does not import (a syntax error, a NameError at import) leaves `run()` working while `run_parsed()`
raises one error naming the file and line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox import CodeExecutor, generate_mcp_sources
from ipybox.mcp_apigen.sources import wait_for_stopped_servers
from tests.servers import params
from tests.servers.processes import tagged

pytestmark = pytest.mark.integration

GUARD = 60  # seconds: only against a hang

PARSERS = {
    # A text tool: the raw output is what run() returns.
    "echo": """
        from pydantic import BaseModel


        class ParseResult(BaseModel):
            words: list[str]


        def parse(raw: str) -> ParseResult:
            return ParseResult(words=raw.split())
    """,
    # A tool with an output schema: the raw output is its structured result as JSON text.
    "add": """
        import json

        from pydantic import BaseModel


        class ParseResult(BaseModel):
            doubled: int


        def parse(raw: str) -> ParseResult:
            return ParseResult(doubled=2 * json.loads(raw)["total"])
    """,
    "getenv": """
        from pydantic import BaseModel

        PREFIX = undefined_prefix


        class ParseResult(BaseModel):
            value: str
    """,
    "weather": """
        def parse(raw: str) -> ParseResult
            return raw
    """,
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parsers-live")


@pytest.fixture(scope="module")
async def parsed(work: Path) -> AsyncIterator[CodeExecutor]:
    for module, source in PARSERS.items():
        path = work / "mcpparse" / "edge" / f"{module}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip())
    server = tagged({**params.edge(), "env": {"WHICH": "parsed"}}, "parsers-live")
    await generate_mcp_sources("edge", server, work / "mcptools")
    await wait_for_stopped_servers()
    async with CodeExecutor(working_dir=work, approve_tool_calls=False, spare_kernel=False) as executor:
        yield executor


async def run(executor: CodeExecutor, code: str) -> str:
    return ((await executor.execute(textwrap.dedent(code), timeout=GUARD)).text or "").strip()


async def test_run_parsed_returns_the_parsers_result_for_the_tools_output(parsed: CodeExecutor) -> None:
    text = await run(
        parsed,
        """
        from mcptools.edge import echo
        result = echo.run_parsed(echo.Params(text="three little words"))
        print(type(result).__name__, result.words, type(result) is echo.ParseResult)
        """,
    )
    assert text == "ParseResult ['three', 'little', 'words'] True"


async def test_a_tool_with_an_output_schema_gives_its_parser_json(parsed: CodeExecutor) -> None:
    text = await run(
        parsed,
        """
        import asyncio
        from mcptools.edge import add
        print(add.run(add.Params(a=2, b=3)).total, add.run_parsed(add.Params(a=2, b=3)).doubled)
        print((await add.arun_parsed(add.Params(a=1, b=1))).doubled)
        """,
    )
    assert text.splitlines() == ["5 10", "4"]


@pytest.mark.parametrize(
    ("module", "args", "located"),
    [
        (
            "getenv",
            "name='WHICH'",
            "mcpparse/edge/getenv.py:3: NameError: name 'undefined_prefix' is not defined",
        ),
        ("weather", "city='Oslo'", "mcpparse/edge/weather.py:1:"),
    ],
    ids=["name-error-at-import", "syntax-error"],
)
async def test_a_parser_that_does_not_import_leaves_run_working_and_run_parsed_says_where(
    parsed: CodeExecutor, module: str, args: str, located: str
) -> None:
    text = await run(
        parsed,
        f"""
        from mcptools.edge import {module}
        print(repr({module}.run({module}.Params({args})))[:40])
        try:
            {module}.run_parsed({module}.Params({args}))
        except ImportError as e:
            print(e)
        """,
    )
    output, error = text.splitlines()
    assert output.startswith(("'parsed'", "Result(", "'"))  # run() answered
    assert located in error and "run() still works" in error


async def test_the_package_index_lists_which_tools_have_a_parser(parsed: CodeExecutor) -> None:
    text = await run(parsed, "import mcptools.edge\nprint(mcptools.edge.__doc__)")
    marked = {
        line.split(":")[0][2:] for line in text.splitlines() if line.endswith("(run_parsed -> ParseResult)")
    }
    assert marked == set(PARSERS)


def test_modules_with_a_parser_pass_ruff_check(parsed: CodeExecutor, work: Path) -> None:
    config = Path(__file__).resolve().parents[2] / "pyproject.toml"
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run(
        [ruff, "check", "--no-cache", "--config", config, "mcptools"],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
