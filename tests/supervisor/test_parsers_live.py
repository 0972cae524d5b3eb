"""Output parsers in a running workspace, with an application attached: a parser added (and `ipybox.toml`
edited) gives the tool `run_parsed()` in the running kernel and shows in `ipybox status`; a broken one is
reported with `mcpparse/...py:LINE:COL` (checked in a fresh kernel of the warm pool) while `run()` keeps
working; and a kernel that imported the old parser uses the new one once the package was regenerated.
Run unsandboxed and sandboxed (a parser is written where sandboxed kernels can import it)."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.running.status import MCPServerStatus
from ipybox.sandbox import SandboxUnavailableError
from ipybox.supervisor import Supervisor
from tests.cli.test_main import ipybox
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

TAG = "supervisor-parsers"

PARSER = """
    from pydantic import BaseModel


    class ParseResult(BaseModel):
        words: list[str]
        version: int


    def parse(raw: str) -> ParseResult:
        return ParseResult(words=raw.split(), version={version})
"""
BROKEN = """
    from pydantic import BaseModel

    VERSION = undefined_version


    class ParseResult(BaseModel):
        words: list[str]


    def parse(raw: str) -> ParseResult:
        return ParseResult(words=raw.split())
"""
# `echo` with text "hi" is allowed by the workspace's rules (tests/supervisor/workspaces.py).
RUN_PARSED = """
from mcptools.edge import echo
try:
    result = echo.run_parsed(echo.Params(text="hi"))
    print(result.words, result.version)
except ImportError as e:
    print(e)
print(echo.run(echo.Params(text="hi")))
"""


@pytest.fixture(scope="module", params=[False, True], ids=["unsandboxed", "sandboxed"])
async def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Supervisor, CodeExecutor]]:
    sandbox: bool = request.param
    workspace = make_workspace(tmp_path_factory.mktemp("parsers"), f"{TAG}-{sandbox}", sandbox=sandbox)
    supervisor = Supervisor(workspace)
    try:
        await supervisor.start()
    except SandboxUnavailableError as e:
        pytest.skip(f"no sandbox here: {e}")
    try:
        async with CodeExecutor(workspace=workspace) as executor:
            yield supervisor, executor
    finally:
        await supervisor.stop()


def edge_status(supervisor: Supervisor) -> MCPServerStatus:
    return supervisor.status().reconciler.servers["edge"]


async def regenerated(supervisor: Supervisor, after: int, done: Callable[[MCPServerStatus], bool]) -> None:
    """Wait until `edge` is ready at a generation past `after`, its parsers checked (in the background),
    and `done` holds for its status."""
    deadline = time.monotonic() + 60
    while True:
        status = edge_status(supervisor)
        ready = status.state == "ready" and not status.checking
        if ready and (status.generation or 0) > after and done(status):
            return
        assert time.monotonic() < deadline, f"timed out; edge is {status}"
        await asyncio.sleep(0.1)


def write_parser(workspace: Path, source: str) -> None:
    path = workspace / "mcpparse" / "edge" / "echo.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(".echo.py.tmp")
    temp.write_text(textwrap.dedent(source).lstrip())
    temp.replace(path)


async def run(executor: CodeExecutor, code: str) -> list[str]:
    return ((await executor.execute(code)).text or "").splitlines()


async def test_a_parser_added_and_the_toml_edited_gives_run_parsed_in_the_running_kernel(
    live: tuple[Supervisor, CodeExecutor],
) -> None:
    supervisor, executor = live
    workspace = supervisor.workspace
    assert (workspace / "mcpparse").is_dir()  # made before kernels start: sandboxed ones write parsers there
    before = edge_status(supervisor)
    assert before.parsers == [] and before.generation is not None
    code = (
        "from mcptools.edge import echo\nprint(hasattr(echo, 'run_parsed'), echo.run(echo.Params(text='hi')))"
    )
    assert await run(executor, code) == ["False hi"]

    write_parser(workspace, PARSER.format(version=1))
    config = workspace / "ipybox.toml"
    head, server = config.read_text().split("[servers.edge]\n")
    config.write_text(head + "[servers.edge]\n" + server.replace("env = { ", 'env = { EDITED = "1", ', 1))
    await regenerated(supervisor, before.generation, lambda status: status.parsers == ["echo"])

    assert edge_status(supervisor).parser_errors == []
    assert await run(executor, RUN_PARSED) == ["['hi'] 1", "hi"]
    human = await asyncio.to_thread(ipybox, "status", str(workspace))
    assert re.search(r"\n    edge  ready, \d+ tools, parsers echo\n", human.stdout), human.stdout


async def test_a_broken_parser_is_reported_with_file_and_line_and_run_keeps_working(
    live: tuple[Supervisor, CodeExecutor],
) -> None:
    supervisor, executor = live
    workspace = supervisor.workspace
    before = edge_status(supervisor).generation or 0
    write_parser(workspace, BROKEN)
    await regenerated(supervisor, before, lambda status: bool(status.parser_errors))

    expected = "mcpparse/edge/echo.py:3:11: NameError: name 'undefined_version' is not defined"
    done = await asyncio.to_thread(ipybox, "status", "--json", str(workspace))
    edge = json.loads(done.stdout)["reconciler"]["servers"]["edge"]
    assert edge["state"] == "ready" and edge["parsers"] == ["echo"]
    assert edge["parser_errors"] == [expected]
    human = await asyncio.to_thread(ipybox, "status", str(workspace))
    assert f"    parser error: {expected}" in human.stdout

    error, output = await run(executor, RUN_PARSED)
    assert "mcpparse/edge/echo.py:3: NameError: name 'undefined_version' is not defined" in error
    assert "run() still works" in error and output == "hi"


async def test_a_kernel_that_imported_the_old_parser_uses_the_new_one_after_regeneration(
    live: tuple[Supervisor, CodeExecutor],
) -> None:
    supervisor, executor = live
    workspace = supervisor.workspace
    before = edge_status(supervisor).generation or 0
    write_parser(workspace, PARSER.format(version=2))
    await regenerated(supervisor, before, lambda status: status.parser_errors == [])
    assert await run(executor, RUN_PARSED) == ["['hi'] 2", "hi"]

    # Imported, then edited: the next cell after the regeneration imports both the module and the parser.
    before = edge_status(supervisor).generation or 0
    write_parser(workspace, PARSER.format(version=333))
    await regenerated(supervisor, before, lambda status: status.parser_errors == [])
    assert await run(executor, RUN_PARSED) == ["['hi'] 333", "hi"]
    # The checks' kernels came from the warm pool and were deleted: no lease is left behind.
    assert supervisor.status().leases == 1
