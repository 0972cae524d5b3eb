"""Kernel-written code that the workspace checks (output parsers, saved code actions) never holds up the
owner's rules, the MCP tool list, or the people who answer asks (issue 31, findings 3, 5 and 6).

A running workspace (our edge server; `echo` with text "hi" is allowed, other calls are asked) with an
attached kernel that plants what an agent could: a parser whose import sleeps, saved actions whose import
hangs. The owner's deny rule takes effect within seconds while the parser's check still runs (the check
is bounded; the parser is then disabled, reported, and not checked again until its content changes);
`tools/list` answers at once; a check kernel's tool call is refused without an ask reaching anyone."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import AsyncIterator, Callable

import pytest

from ipybox import CodeExecutor
from ipybox.approval.asks import AskOpened
from ipybox.rules import ToolCall
from ipybox.running.status import MCPServerStatus
from ipybox.supervisor import Supervisor, read_state
from tests.cli.test_main import ipybox
from tests.supervisor.test_mcp_endpoint import client
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

TAG = "supervisor-hostile-checks"
CHECK_TIMEOUT = 15.0  # the reconciler's, lowered from 60 s: the old code held its apply lock this long

SLEEPING_PARSER = """
    import time

    from pydantic import BaseModel

    time.sleep(3600)


    class ParseResult(BaseModel):
        words: list[str]


    def parse(raw: str) -> ParseResult:
        return ParseResult(words=raw.split())
"""
HANGING_API = '''
    import time

    time.sleep(3600)


    def run() -> str:
        """Hang when imported."""
        return "never"
'''
DENY_ECHO = '\n[[approval.rules]]\nid = "no-echo"\nserver = "edge"\ntool = "echo"\ndecision = "deny"\n'
# Writes a file as a kernel's code can: `{files}` maps paths relative to the workspace to their text.
PLANT = """
import json, os, pathlib
for name, text in json.loads({files!r}).items():
    path = pathlib.Path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name("." + path.name + ".tmp").write_text(text)
    os.replace(path.with_name("." + path.name + ".tmp"), path)
"""


@pytest.fixture(scope="module")
async def live(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Supervisor, CodeExecutor]]:
    workspace = make_workspace(tmp_path_factory.mktemp("hostile-checks"), TAG, ask_timeout=5)
    supervisor = Supervisor(workspace)
    await supervisor.start()
    assert supervisor.reconciler is not None
    supervisor.reconciler.check_timeout = CHECK_TIMEOUT
    try:
        async with CodeExecutor(workspace=workspace) as executor:
            yield supervisor, executor
    finally:
        await supervisor.stop()


def edge(supervisor: Supervisor) -> MCPServerStatus:
    return supervisor.status().reconciler.servers["edge"]


async def until(condition: Callable[[], bool], guard: float) -> None:
    """Wait for `condition`; the guard only keeps a failing test from hanging."""
    deadline = time.monotonic() + guard
    while not condition():
        assert time.monotonic() < deadline, "not within the guard"
        await asyncio.sleep(0.05)


async def plant(executor: CodeExecutor, files: dict[str, str]) -> None:
    sources = {name: textwrap.dedent(text).lstrip() for name, text in files.items()}
    result = await executor.execute(PLANT.format(files=json.dumps(sources)), timeout=30)
    assert not (result.text or "").strip(), result.text


async def test_a_deny_rule_takes_effect_within_seconds_while_a_sleeping_parser_is_checked(
    live: tuple[Supervisor, CodeExecutor],
) -> None:
    supervisor, executor = live
    before = supervisor.status().reconciler.generation
    await plant(executor, {"mcpparse/edge/echo.py": SLEEPING_PARSER})
    # The package was regenerated (the marker is bumped before the check begins).
    await until(lambda: supervisor.status().reconciler.generation > before, guard=30)
    await asyncio.sleep(1)  # the check's kernel is in the parser's sleep

    config = supervisor.workspace / "ipybox.toml"
    config.write_text(config.read_text() + DENY_ECHO)
    written = time.monotonic()
    call = ToolCall("edge", "echo", {"text": "hi"})
    await until(lambda: supervisor.explain(call)[0][1].decision == "deny", guard=CHECK_TIMEOUT + 60)
    took = time.monotonic() - written
    print(f"the deny rule took effect {took:.2f} s after it was saved, while the parser was checked")
    # The old code applied it once the check gave up, CHECK_TIMEOUT s after it began.
    assert took < CHECK_TIMEOUT / 2
    assert edge(supervisor).checking == ["echo"]  # still being checked: the rule did not wait for it

    # The kernel's call is refused by it; importing the tool module never ran the sleeping parser.
    code = (
        "from mcptools.edge import echo\ntry:\n    echo.run(echo.Params(text='hi'))\n"
        "except Exception as e:\n    print(e)\n"
    )
    result = await executor.execute(code, timeout=30)
    assert "no-echo" in (result.text or "")


async def test_a_parser_whose_check_times_out_is_disabled_reported_and_checked_again_only_when_changed(
    live: tuple[Supervisor, CodeExecutor],
) -> None:
    supervisor, executor = live
    await until(lambda: bool(edge(supervisor).parser_errors), guard=CHECK_TIMEOUT + 60)
    status = edge(supervisor)
    expected = (
        f"mcpparse/edge/echo.py: disabled: importing it in a kernel took longer than {CHECK_TIMEOUT:g} s, "
        "so run_parsed() is left out; it is checked again when the file changes"
    )
    assert status.parser_errors == [expected]
    assert status.state == "ready" and status.parsers == [] and status.checking == []
    module = supervisor.workspace / "mcptools" / "edge" / "echo.py"
    assert "run_parsed" not in module.read_text()
    human = await asyncio.to_thread(ipybox, "status", str(supervisor.workspace))
    assert f"    parser error: {expected}" in human.stdout

    # Saved again unchanged (an attempt to re-arm the check): regenerated, not checked again.
    generation = status.generation or 0
    await plant(executor, {"mcpparse/edge/echo.py": SLEEPING_PARSER})
    await until(lambda: (edge(supervisor).generation or 0) > generation, guard=30)
    await asyncio.sleep(0.5)
    assert edge(supervisor).checking == [] and edge(supervisor).parser_errors == [expected]

    # Changed: checked again (once).
    await plant(executor, {"mcpparse/edge/echo.py": textwrap.dedent(SLEEPING_PARSER) + "# changed\n"})
    await until(lambda: edge(supervisor).checking == ["echo"], guard=30)
    assert edge(supervisor).parsers == ["echo"]


async def test_tools_list_answers_at_once_while_planted_saved_actions_hang_on_import(
    live: tuple[Supervisor, CodeExecutor],
) -> None:
    supervisor, executor = live
    await plant(
        executor,
        {
            "gentools/evil/hang_a/api.py": HANGING_API,
            "gentools/evil/hang_b/api.py": HANGING_API,
            "gentools/evil/hang_b/impl.py": "",
        },
    )
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    async with client(state.mcp_url, state.mcp_token) as session:
        for _ in range(2):
            started = time.monotonic()
            # The old code described them first, in fresh kernels: 60 s each try, and again per action.
            listed = await asyncio.wait_for(session.list_tools(), 30)
            took = time.monotonic() - started
            names = {tool.name for tool in listed.tools}
            assert "execute_ipython_cell" in names and not {"evil__hang_a", "evil__hang_b"} & names
            assert took < 10, f"tools/list took {took:.1f} s"
            # Touched (the old code's re-arm): answered at once again.
            await plant(executor, {"gentools/evil/hang_a/api.py": HANGING_API})


async def test_a_check_kernels_tool_call_is_refused_without_an_ask_reaching_anyone(
    live: tuple[Supervisor, CodeExecutor],
) -> None:
    supervisor, executor = live
    # `weather` is asked by the workspace's default; a person is present at the terminal to be asked.
    code = (
        "from mcptools.edge import weather\ntry:\n    weather.run(weather.Params(city='x'))\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    with supervisor.board.present("terminal"), supervisor.board.subscribe() as subscription:
        parser_check = await supervisor.run_in_fresh_kernel(code)  # the reconciler's checks
        action_check = await executor.check_in_fresh_kernel(code)  # saving or describing an action
        events = []
        while not subscription.events.empty():
            events.append(subscription.events.get_nowait())
    assert not [event for event in events if isinstance(event, AskOpened)]
    assert not supervisor.board.pending
    assert "checking an output parser asks nobody: tool calls are refused while it is checked" in parser_check
    assert "checking agent-written code (a code action being saved or described) asks nobody" in action_check
