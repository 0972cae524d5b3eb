"""Output parsers in a workspace the reconciler keeps, against our real edge server: they survive every
regeneration, are listed and checked per server (`ast` on the host, then an import where code runs), are
reported with `file:line` without failing the server, and a parser saved while watching regenerates its
server's package from the tools it listed last, without a restart.

The import check runs the code `ipybox.codeact.checks` builds in a real Python process in the workspace
(`python -c`), as a fresh kernel would run it; the supervisor's kernel-backed check is tested live in
`tests/supervisor/test_parsers_live.py`."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox.codeact.checks import RunCheck
from ipybox.lifecycle import ServiceState
from ipybox.mcp_client.pool import MCPServers
from ipybox.reconcile.reconciler import Reconciler
from tests.reconcile.test_reconciler import (
    RecordingHooks,
    config_text,
    edge,
    eventually,
    generations,
    new_tag,
    save,
    start,
)
from tests.servers.processes import pids

pytestmark = pytest.mark.integration

WORDS = """
    from pydantic import BaseModel


    class ParseResult(BaseModel):
        words: list[str]


    def parse(raw: str) -> ParseResult:
        return ParseResult(words=raw.split())
"""
NAME_ERROR = """
    from pydantic import BaseModel

    LIMIT = undefined_limit


    class ParseResult(BaseModel):
        words: list[str]


    def parse(raw: str) -> ParseResult:
        return ParseResult(words=raw.split()[:LIMIT])
"""
SYNTAX_ERROR = """
    class ParseResult:
        pass


    def parse(raw: str) -> ParseResult
        return raw
"""


def python_check(workspace: Path) -> RunCheck:
    """Runs the check's code in a new Python process in `workspace` (a fresh interpreter, like a fresh
    kernel), and returns its output."""

    async def run(code: str) -> str:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            cwd=workspace,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await process.communicate()
        except asyncio.CancelledError:  # the check was cancelled (a newer one, or the reconciler closed)
            process.kill()
            await process.wait()
            raise
        return output.decode()

    return run


def write_parser(workspace: Path, server: str, module: str, source: str) -> Path:
    path = workspace / "mcpparse" / server / f"{module}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{module}.py.swp")
    temp.write_text(textwrap.dedent(source).lstrip())
    temp.replace(path)  # saved as editors save
    return path


def module_source(workspace: Path, server: str, module: str) -> str:
    return (workspace / "mcptools" / server / f"{module}.py").read_text()


@pytest.fixture
async def servers(workspace: Path) -> AsyncIterator[MCPServers]:
    servers = MCPServers(dotenv_path=workspace / ".env")
    yield servers
    await servers.stop()


@pytest.fixture
async def checked(workspace: Path, servers: MCPServers) -> AsyncIterator[Reconciler]:
    """A reconciler that checks parsers by importing them in a fresh Python process."""
    async with Reconciler(
        workspace, servers, RecordingHooks(), run_check=python_check(workspace)
    ) as reconciler:
        yield reconciler  # leaving cancels a check still running in the background


async def test_parsers_are_generated_listed_and_kept_by_every_regeneration(
    checked: Reconciler, workspace: Path
) -> None:
    write_parser(workspace, "a", "echo", WORDS)
    tag = new_tag()
    await start(checked, workspace, config_text({"a": edge(tag)}))

    server = checked.status().servers["a"]
    assert server.state == "ready" and server.parsers == ["echo"] and server.parser_errors == []
    assert "def run_parsed(params: Params) -> ParseResult:" in module_source(workspace, "a", "echo")
    assert "run_parsed" not in module_source(workspace, "a", "add")
    assert "- echo: " in (index := (workspace / "mcptools" / "a" / "__init__.py").read_text())
    assert "(run_parsed -> ParseResult)" in index.split("- echo: ")[1].splitlines()[0]

    # Any edit of the server regenerates its package: the parser is still there, and used.
    save(workspace, config_text({"a": edge(tag, "--port=8001")}))
    assert await checked.reload()
    assert generations(workspace)["servers"]["a"] == 2
    assert "def run_parsed(" in module_source(workspace, "a", "echo")
    assert checked.status().servers["a"].parsers == ["echo"]


async def test_a_parser_that_does_not_work_is_reported_with_file_and_line_and_the_server_stays_ready(
    checked: Reconciler, workspace: Path
) -> None:
    write_parser(workspace, "a", "echo", NAME_ERROR)
    write_parser(workspace, "a", "add", SYNTAX_ERROR)
    write_parser(workspace, "a", "getenv", "import json\n")
    write_parser(workspace, "a", "ecko", WORDS)
    write_parser(workspace, "a", "get_env", WORDS)  # `get_env` is no module of the edge server either
    await start(checked, workspace, config_text({"a": edge(new_tag())}))

    server = checked.status().servers["a"]
    assert server.state == "ready" and server.error is None
    assert server.parsers == ["add", "echo", "getenv"]
    errors = server.parser_errors
    assert "mcpparse/a/echo.py:3:9: NameError: name 'undefined_limit' is not defined" in errors
    assert any(line.startswith("mcpparse/a/add.py:5:35: SyntaxError: ") for line in errors), errors
    assert (
        "mcpparse/a/getenv.py: defines no ParseResult: a parser defines class ParseResult(BaseModel): "
        in ("\n".join(errors))
    )
    assert any(
        line.startswith("mcpparse/a/ecko.py: server 'a' has no tool module 'ecko'; did you mean 'echo'")
        for line in errors
    )
    assert len(errors) == 6, errors  # getenv lacks both definitions
    # The modules import and run() is there, whatever their parsers do.
    assert "def run(" in module_source(workspace, "a", "echo")


async def test_without_a_check_runner_parsers_are_checked_by_ast_only(
    workspace: Path, servers: MCPServers
) -> None:
    write_parser(workspace, "a", "echo", NAME_ERROR)
    write_parser(workspace, "a", "add", SYNTAX_ERROR)
    async with Reconciler(workspace, servers, RecordingHooks()) as reconciler:
        await start(reconciler, workspace, config_text({"a": edge(new_tag())}))
        server = reconciler.status().servers["a"]
    assert server.parsers == ["add", "echo"]
    assert [line.split(": ")[0] for line in server.parser_errors] == ["mcpparse/a/add.py:5:35"]


async def test_a_check_that_fails_or_takes_too_long_is_reported_and_never_fails_the_server(
    workspace: Path, servers: MCPServers
) -> None:
    async def hangs(code: str) -> str:
        await asyncio.sleep(3600)
        return ""

    async def prints_nothing(code: str) -> str:
        return "Traceback: the kernel died"

    write_parser(workspace, "a", "echo", WORDS)
    async with Reconciler(workspace, servers, RecordingHooks(), run_check=hangs, check_timeout=0.2) as slow:
        await start(slow, workspace, config_text({"a": edge(new_tag())}))
        server = slow.status().servers["a"]
    assert server.state == "ready" and server.parsers == [] and server.checking == []
    assert server.parser_errors == [
        "mcpparse/a/echo.py: disabled: importing it in a kernel took longer than 0.2 s, so run_parsed() is "
        "left out; it is checked again when the file changes"
    ]
    assert "run_parsed" not in module_source(workspace, "a", "echo")

    async with Reconciler(workspace, servers, RecordingHooks(), run_check=prints_nothing) as broken:
        await start(broken, workspace, config_text({"a": edge(new_tag())}))
        [line] = broken.status().servers["a"].parser_errors
    assert line.startswith("mcpparse/a: not checked in a kernel: the check printed no report")


async def test_a_parser_saved_while_watching_regenerates_its_package_without_a_restart(
    checked: Reconciler, workspace: Path
) -> None:
    tag = new_tag()
    await start(checked, workspace, config_text({"a": edge(tag), "b": edge(tag)}))
    started = sorted(pids(tag))
    task = asyncio.create_task(checked.watch())
    try:
        before = generations(workspace)["servers"]
        await asyncio.sleep(0.3)  # the watch is set up
        write_parser(workspace, "a", "echo", NAME_ERROR)

        def regenerated() -> bool:
            server = checked.status().servers["a"]
            return server.state == "ready" and generations(workspace)["servers"]["a"] > before["a"]

        await eventually(regenerated, what="the package of 'a' regenerated for its new parser")
        assert "def run_parsed(" in module_source(workspace, "a", "echo")
        await checked.checked()
        assert checked.status().servers["a"].parser_errors == [
            "mcpparse/a/echo.py:3:9: NameError: name 'undefined_limit' is not defined"
        ]

        # Fixed: regenerated and checked again.
        generation = generations(workspace)["servers"]["a"]
        write_parser(workspace, "a", "echo", WORDS)
        await eventually(
            lambda: (
                checked.status().servers["a"].parser_errors == []
                and generations(workspace)["servers"]["a"] > generation
            ),
            what="the fixed parser checked",
        )

        # Removed: the module loses run_parsed.
        (workspace / "mcpparse" / "a" / "echo.py").unlink()
        await eventually(
            lambda: "run_parsed" not in module_source(workspace, "a", "echo"), what="run_parsed removed"
        )
        await eventually(lambda: checked.status().servers["a"].parsers == [], what="no parsers listed")

        # Only 'a' was regenerated, from the tools it listed: no server was restarted.
        assert generations(workspace)["servers"]["b"] == before["b"]
        assert sorted(pids(tag)) == started
        # Bytecode a kernel writes next to a parser is no edit: after it, a parser of 'b' is saved, and
        # only 'b' is regenerated.
        generation = generations(workspace)["servers"]["a"]
        pycache = workspace / "mcpparse" / "a" / "__pycache__"
        # The parser check's kernel made it already, unless PYTHONDONTWRITEBYTECODE is set.
        pycache.mkdir(exist_ok=True)
        (pycache / "echo.cpython-311.pyc").write_bytes(b"")
        write_parser(workspace, "b", "echo", WORDS)
        await eventually(lambda: checked.status().servers["b"].parsers == ["echo"], what="b's parser found")
        assert generations(workspace)["servers"]["a"] == generation
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_closing_the_reconciler_cancels_a_parser_check_still_running_and_waits_until_it_ended(
    workspace: Path, servers: MCPServers
) -> None:
    started = asyncio.Event()
    ended: list[str] = []

    async def hangs(code: str) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append("ended")
        return ""

    write_parser(workspace, "a", "echo", WORDS)
    async with Reconciler(workspace, servers, RecordingHooks(), run_check=hangs) as reconciler:
        save(workspace, config_text({"a": edge(new_tag())}))
        await reconciler.apply(reconciler.load())
        await asyncio.wait_for(started.wait(), 10)
        assert reconciler.status().servers["a"].checking == ["echo"]
        assert ended == []
    assert ended == ["ended"], "the check ended before the reconciler said it closed"
    assert reconciler.state is ServiceState.CLOSED
