"""Code as tool in the workspace MCP server (`ipybox.mcp_server.code_actions`): `search_tools`,
`save_code_action`, saved actions as MCP tools (approved by the workspace's rules, described again in the
background when edited by hand) and in `ipybox status`.

The fast tests run the cell an action call executes in this process (it is plain Python with a top-level
await) and read its output as the server does; the integration tests drive a real workspace's MCP
endpoint with the Python MCP client.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.session import ElicitationFnT, IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver.exceptions import ToolError

from ipybox.codeact.actions import SavedAction
from ipybox.codeact.analysis import ActionCalls
from ipybox.codeact.index import ToolHit
from ipybox.mcp_server.code_actions import (
    action_call_code,
    action_result,
    action_tool,
    describe_saved,
    format_hit,
)
from ipybox.running.status import ActionStatus
from ipybox.supervisor import Supervisor, read_state
from tests.cli.test_main import ipybox
from tests.mcp_server.sessions import owned_session, text
from tests.supervisor.workspaces import make_workspace

integration = pytest.mark.integration

SHOUT_API = '''\
"""Shout a text."""
from pydantic import BaseModel

from . import impl


class Params(BaseModel):
    text: str


class Shout(BaseModel):
    text: str
    length: int


def run(params: Params) -> Shout:
    """Shout a text: upper-case it after edge's echo returned it."""
    loud = impl.shout(params.text)
    return Shout(text=loud, length=len(loud))
'''

SHOUT_IMPL = """\
from mcptools.edge import echo


def shout(text: str) -> str:
    echoed = echo.run(echo.Params(text=text))
    print("echoed", echoed)
    return echoed.upper()
"""

SECRET_API = '''\
from . import impl


async def run() -> str:
    """Read a secret from the edge server's environment."""
    return await impl.secret()
'''

SECRET_IMPL = """\
from mcptools.edge import getenv


async def secret() -> str:
    return await getenv.arun(getenv.Params(name="HOME"))
"""


def greet_api(docstring: str) -> str:
    return (
        "from pydantic import BaseModel\n\nfrom . import impl\n\n\n"
        "class Params(BaseModel):\n    name: str\n\n\n"
        f"def run(params: Params) -> str:\n    {json.dumps(docstring)}\n    return impl.greet(params.name)\n"
    )


GREET_IMPL = "def greet(name: str) -> str:\n    return 'hello ' + name\n"


# -- the cell of an action call, run in this process ----------------------------------------------------


@pytest.fixture
def action_package(tmp_path: Path) -> Iterator[str]:
    """`gentools.demo.shout` importable from `tmp_path`, with an impl that needs no MCP server."""
    package = tmp_path / "gentools" / "demo" / "shout"
    package.mkdir(parents=True)
    for directory in (tmp_path / "gentools", tmp_path / "gentools" / "demo"):
        (directory / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "api.py").write_text(SHOUT_API)
    (package / "impl.py").write_text("def shout(text):\n    print('shouting')\n    return text.upper()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield "gentools.demo.shout"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "gentools" or m.startswith("gentools.")]:
            del sys.modules[name]


async def run_cell(code: str) -> types.CallToolResult:
    """Execute `code` as the kernel would (top-level await) and return its output as
    execute_ipython_cell does."""
    compiled = compile(code, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        awaitable = eval(compiled, {})  # the code under test: action_call_code's
        if awaitable is not None:
            await awaitable
    return types.CallToolResult(content=[types.TextContent(type="text", text=out.getvalue())])


async def test_an_action_call_passes_hostile_argument_text_as_data(action_package: str) -> None:
    hostile = '\'); import os; os._exit(3) #"""\n{marker}\\x00'
    marker = "<<ipybox-action-result test>>"
    code = action_call_code(action_package, json.dumps({"text": hostile}), marker)
    assert hostile not in code  # only inside the repr'd JSON document
    result = action_result("demo__shout", await run_cell(code), marker)
    assert result.structured_content == {"text": hostile.upper(), "length": len(hostile)}
    assert json.loads(text_of(result, 0)) == result.structured_content
    assert text_of(result, 1) == "[printed by demo__shout]\nshouting"


async def test_an_action_call_imports_the_files_on_disk_afresh(action_package: str, tmp_path: Path) -> None:
    marker = "<<ipybox-action-result test>>"
    code = action_call_code(action_package, json.dumps({"text": "a"}), marker)
    await run_cell(code)
    impl = tmp_path / "gentools" / "demo" / "shout" / "impl.py"
    impl.write_text(impl.read_text().replace("text.upper()", "text + '!'"))
    result = action_result("demo__shout", await run_cell(code), marker)
    assert result.structured_content == {"text": "a!", "length": 2}


async def test_arguments_the_params_model_refuses_are_one_clear_error(action_package: str) -> None:
    marker = "<<ipybox-action-result test>>"
    code = action_call_code(action_package, json.dumps({"txt": "a"}), marker)
    with pytest.raises(ToolError) as error:
        action_result("demo__shout", await run_cell(code), marker)
    message = str(error.value)
    assert message.startswith("invalid arguments for demo__shout: 1 validation error for Params")
    assert "text\n  Field required" in message


def test_what_ipybox_notes_after_the_result_is_kept_apart_from_it() -> None:
    marker = "<<m>>"
    output = f"printed\n{marker} text\nthe result\n{marker} end\n\n[ipybox: these calls were denied: x]"
    ran = types.CallToolResult(content=[types.TextContent(type="text", text=output)])
    result = action_result("demo__x", ran, marker)
    assert [text_of(result, i) for i in range(3)] == [
        "the result",
        "[printed by demo__x]\nprinted",
        "[ipybox: these calls were denied: x]",
    ]
    assert result.structured_content is None


def test_a_model_result_whose_json_escapes_a_lone_surrogate_can_be_sent() -> None:
    # Its structured content had the lone surrogate, which no MCP transport can serialize.
    marker = "<<m>>"
    output = f'{marker} model\n{{"text": "a\\ud800b"}}\n{marker} end'
    ran = types.CallToolResult(content=[types.TextContent(type="text", text=output)])
    result = action_result("demo__x", ran, marker)
    assert result.structured_content == {"text": "a\ufffdb"}
    assert "a\ufffdb" in result.model_dump_json()


def test_output_without_a_result_is_an_error_that_shows_the_output() -> None:
    ran = types.CallToolResult(content=[types.TextContent(type="text", text="partial output")])
    with pytest.raises(ToolError, match=r"demo__x printed no result.*\npartial output"):
        action_result("demo__x", ran, "<<m>>")


# -- tools from manifests, search lines -------------------------------------------------------------------


def saved(**changes: Any) -> SavedAction:
    fields: dict[str, Any] = {
        "category": "demo",
        "name": "shout",
        "path": Path("/ws/gentools/demo/shout"),
        "module": "gentools.demo.shout",
        "tool_name": "demo__shout",
        "description": "Shout a text.",
        "signature": "run(params: Params) -> Shout",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "output_schema": {"type": "object", "properties": {"length": {"type": "integer"}}},
        "takes_params": True,
        "is_async": False,
        "calls": ActionCalls(tools=("edge.echo",)),
    }
    return SavedAction(**{**fields, **changes})


def test_an_action_tool_has_the_manifests_schemas_and_says_what_it_may_call() -> None:
    tool = action_tool(saved())
    assert tool is not None and tool.name == "demo__shout"
    assert tool.input_schema["properties"] == {"text": {"type": "string"}}
    assert tool.output_schema == {"type": "object", "properties": {"length": {"type": "integer"}}}
    assert tool.description is not None and tool.description.startswith(
        "Shout a text.\n\nMay call: edge.echo;"
    )
    assert "approved by the workspace's rules" in tool.description


@pytest.mark.parametrize(
    "changes",
    [{"input_schema": {"type": "array"}}, {"input_schema": {"type": "object", "x": "y" * 300_000}}],
    ids=["not an object schema", "too large"],
)
def test_a_manifest_whose_input_schema_cannot_be_a_tool_schema_is_not_listed(changes: dict[str, Any]) -> None:
    assert action_tool(saved(**changes)) is None


def test_an_output_schema_that_is_not_an_object_schema_is_left_out() -> None:
    tool = action_tool(saved(output_schema={"type": "string"}))
    assert tool is not None and tool.output_schema is None


def test_a_search_line_names_module_signature_description_file_and_mcp_tool() -> None:
    hit = ToolHit(
        "code_action",
        "gentools.demo.shout",
        "gentools/demo/shout/api.py",
        "run(Params(text: str)) -> Shout",
        "Shout a text.",
        1.0,
    )
    assert format_hit(hit) == (
        "gentools.demo.shout  run(Params(text: str)) -> Shout  — Shout a text.  "
        "(gentools/demo/shout/api.py)  [MCP tool demo__shout]"
    )


def test_saving_answers_what_to_import_and_what_it_may_call() -> None:
    assert describe_saved(saved(), Path("/ws")).splitlines() == [
        "saved gentools/demo/shout/ as the MCP tool demo__shout",
        "import: from gentools.demo.shout import run, Params",
        "signature: run(params: Params) -> Shout",
        "may call: edge.echo (tool calls are approved by the workspace's rules)",
    ]


def text_of(result: types.CallToolResult, index: int) -> str:
    block = result.content[index]
    assert isinstance(block, types.TextContent)
    return block.text


# -- a real workspace and MCP client ------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    workspace = make_workspace(tmp_path_factory.mktemp("code-actions"), "code-actions", warm_pool=2)
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


def client(
    supervisor: Supervisor,
    messages: list[IncomingMessage] | None = None,
    elicitation_callback: ElicitationFnT | None = None,
) -> AbstractAsyncContextManager[ClientSession]:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    url, token = state.mcp_url, state.mcp_token

    async def message_handler(message: IncomingMessage) -> None:
        if messages is not None:
            messages.append(message)

    async def open_session(stack: AsyncExitStack) -> ClientSession:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
        await stack.enter_async_context(http)
        read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        session = ClientSession(
            read, write, message_handler=message_handler, elicitation_callback=elicitation_callback
        )
        return await stack.enter_async_context(session)

    return owned_session(open_session)


class Saved:
    def __init__(self, answer: types.CallToolResult, messages: list[IncomingMessage], listed: bool) -> None:
        self.answer = answer
        self.messages = messages
        self.list_changed_declared = listed


@pytest.fixture(scope="module")
async def shout(supervisor: Supervisor) -> Saved:
    """`demo.shout`, saved through the MCP tool."""
    messages: list[IncomingMessage] = []
    async with client(supervisor, messages) as session:
        answer = await session.call_tool(
            "save_code_action", {"category": "demo", "name": "shout", "api": SHOUT_API, "impl": SHOUT_IMPL}
        )
        initialized = session.initialize_result
        assert initialized is not None and initialized.capabilities.tools is not None
        return Saved(answer, messages, initialized.capabilities.tools.list_changed is True)


@integration
async def test_saving_an_action_answers_what_to_import_and_tells_the_client_the_tools_changed(
    shout: Saved,
) -> None:
    assert not shout.answer.is_error, text(shout.answer)
    assert text(shout.answer).splitlines() == [
        "saved gentools/demo/shout/ as the MCP tool demo__shout",
        "import: from gentools.demo.shout import run, Params",
        "signature: run(params: Params) -> Shout",
        "may call: edge.echo (tool calls are approved by the workspace's rules)",
    ]
    assert shout.list_changed_declared
    assert any(isinstance(m, types.ToolListChangedNotification) for m in shout.messages)


@integration
async def test_a_saved_action_is_an_mcp_tool_that_returns_its_result(
    supervisor: Supervisor, shout: Saved
) -> None:
    async with client(supervisor) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert {"search_tools", "save_code_action", "execute_ipython_cell", "demo__shout"} <= set(tools)
        tool = tools["demo__shout"]
        assert tool.description is not None
        assert tool.description.startswith("Shout a text: upper-case it after edge's echo returned it.")
        assert "May call: edge.echo;" in tool.description
        assert tool.input_schema["properties"] == {"text": {"title": "Text", "type": "string"}}
        assert tool.input_schema["required"] == ["text"]
        assert tool.output_schema is not None and set(tool.output_schema["properties"]) == {"text", "length"}

        result = await session.call_tool("demo__shout", {"text": "hi"})  # edge.echo is allowed by a rule
    assert not result.is_error, text(result)
    assert result.structured_content == {"text": "HI", "length": 2}
    assert json.loads(text_of(result, 0)) == {"text": "HI", "length": 2}
    assert text_of(result, 1) == "[printed by demo__shout]\nechoed hi"


@integration
async def test_bad_arguments_of_an_action_are_one_clear_error(supervisor: Supervisor, shout: Saved) -> None:
    async with client(supervisor) as session:
        missing = await session.call_tool("demo__shout", {})
        wrong = await session.call_tool("demo__shout", {"text": ["not", "a", "string"]})
        unknown = await session.call_tool("demo__nothing", {})
        traversal = await session.call_tool("demo__..", {})
    assert missing.is_error and text(missing).startswith(
        "invalid arguments for demo__shout: 1 validation error"
    )
    assert "Field required" in text(missing) and "Traceback" not in text(missing)
    assert wrong.is_error and "Input should be a valid string" in text(wrong)
    assert (
        unknown.is_error
        and text(unknown) == "unknown tool 'demo__nothing': no saved code action has that name"
    )
    assert traversal.is_error and "unknown tool" in text(traversal)


@integration
async def test_an_action_whose_tool_call_a_rule_denies_says_which_rule(supervisor: Supervisor) -> None:
    async with client(supervisor) as session:
        saved_answer = await session.call_tool(
            "save_code_action", {"category": "demo", "name": "secret", "api": SECRET_API, "impl": SECRET_IMPL}
        )
        assert not saved_answer.is_error, text(saved_answer)
        assert "may call: edge.getenv" in text(saved_answer)
        result = await session.call_tool("demo__secret", {})
    assert result.is_error
    assert text(result).startswith("demo__secret failed:\n") and "Error executing tool" not in text(result)
    assert "edge.getenv was rejected: denied by rule 'no-getenv'" in text(result)


@integration
async def test_an_ask_inside_an_action_becomes_an_elicitation(supervisor: Supervisor) -> None:
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"allow": True})

    api = (
        "from . import impl\n\n\ndef run() -> str:\n"
        '    """The weather in Graz."""\n    return impl.weather()\n'
    )
    impl = (
        "from mcptools.edge import weather as w\n\n\ndef weather() -> str:\n"
        "    return w.run(w.Params(city='Graz')).city\n"
    )
    async with client(supervisor, elicitation_callback=elicit) as session:
        answer = await session.call_tool(
            "save_code_action", {"category": "demo", "name": "graz", "api": api, "impl": impl}
        )
        assert not answer.is_error, text(answer)
        result = await session.call_tool("demo__graz", {})  # no rule covers edge.weather: "ask"
    assert not result.is_error, text(result)
    assert text(result) == "Graz"
    assert len(asked) == 1 and "edge.weather" in asked[0]


@integration
async def test_saving_code_that_does_not_import_or_exists_already_is_one_clear_error(
    supervisor: Supervisor, shout: Saved
) -> None:
    broken_impl = "def shout(text):\n    return text\n\nundefined_name\n"
    async with client(supervisor) as session:
        broken = await session.call_tool(
            "save_code_action", {"category": "demo", "name": "broken", "api": SHOUT_API, "impl": broken_impl}
        )
        again = await session.call_tool(
            "save_code_action", {"category": "demo", "name": "shout", "api": SHOUT_API, "impl": SHOUT_IMPL}
        )
        bad_name = await session.call_tool(
            "save_code_action", {"category": "../x", "name": "shout", "api": SHOUT_API, "impl": SHOUT_IMPL}
        )
    assert (
        broken.is_error and "gentools/demo/broken/impl.py:4" in text(broken) and "NameError" in text(broken)
    )
    assert "Traceback" not in text(broken)
    assert not (supervisor.workspace / "gentools" / "demo" / "broken").exists()
    assert again.is_error and "overwrite" in text(again)
    assert bad_name.is_error and "'../x'" in text(bad_name)


@integration
async def test_search_tools_finds_generated_tools_and_saved_actions(
    supervisor: Supervisor, shout: Saved
) -> None:
    async with client(supervisor) as session:
        tool = text(await session.call_tool("search_tools", {"query": "echo text", "limit": 3}))
        action = text(await session.call_tool("search_tools", {"query": "shout upper-case"}))
        nothing = text(await session.call_tool("search_tools", {"query": "xylophone quaternion"}))
    lines = tool.splitlines()
    assert len(lines) <= 4
    assert any(
        line.startswith("mcptools.edge.echo  ") and "(mcptools/edge/echo.py)" in line for line in lines
    )
    first = action.splitlines()[1]
    assert first.startswith("gentools.demo.shout  ")
    assert first.endswith("(gentools/demo/shout/api.py)  [MCP tool demo__shout]")
    assert nothing.startswith("no generated tool or saved code action matches 'xylophone quaternion'")


@integration
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"query": "echo", "limit": 0}, "limit must be a number from 1 to 50, not 0"),
        ({"query": "echo", "limit": 51}, "limit must be a number from 1 to 50, not 51"),
        ({"query": "  "}, "query must say what you look for"),
    ],
)
async def test_bad_searches_are_one_clear_error(
    supervisor: Supervisor, arguments: dict[str, Any], message: str
) -> None:
    async with client(supervisor) as session:
        result = await session.call_tool("search_tools", arguments)
    assert result.is_error and text(result).startswith(f"Error executing tool search_tools: {message}")


@integration
async def test_an_action_edited_by_hand_is_described_again_when_listed(supervisor: Supervisor) -> None:
    async with client(supervisor) as session:
        answer = await session.call_tool(
            "save_code_action",
            {"category": "demo", "name": "greet", "api": greet_api("Greet someone."), "impl": GREET_IMPL},
        )
        assert not answer.is_error, text(answer)
    action = supervisor.workspace / "gentools" / "demo" / "greet"
    (action / "api.py").write_text(greet_api("Greet someone warmly."))
    assert next(a for a in supervisor.status().actions if a.name == "demo.greet").stale
    async with client(supervisor) as session:  # lists before its first call: no session kernel yet
        # Listed once described again, in the background: tools/list never waits for an action's import.
        deadline = asyncio.get_running_loop().time() + 90
        while "demo__greet" not in (
            tools := {tool.name: tool for tool in (await session.list_tools()).tools}
        ):
            assert asyncio.get_running_loop().time() < deadline, "the edited action was never listed"
            await asyncio.sleep(0.2)
        assert tools["demo__greet"].description is not None
        assert tools["demo__greet"].description.startswith("Greet someone warmly.\n\nMay call: no MCP tools")
        result = await session.call_tool("demo__greet", {"name": "Ada"})
    assert text(result) == "hello Ada"
    assert json.loads((action / "action.json").read_text())["doc"] == "Greet someone warmly."
    assert not next(a for a in supervisor.status().actions if a.name == "demo.greet").stale


@integration
async def test_status_lists_saved_actions_with_what_they_may_call(
    supervisor: Supervisor, shout: Saved
) -> None:
    expected = ActionStatus(name="demo.shout", tool="demo__shout", calls="edge.echo")
    assert expected in supervisor.status().actions
    # In a thread: the workspace answers `ipybox status` from this test's event loop.
    done = await asyncio.to_thread(ipybox, "status", str(supervisor.workspace))
    assert re.search(r"^    demo\.shout +MCP tool demo__shout, may call edge\.echo$", done.stdout, re.M), (
        done.stdout
    )
    done = await asyncio.to_thread(ipybox, "status", "--json", str(supervisor.workspace))
    listed = json.loads(done.stdout)["actions"]
    assert {"name": "demo.shout", "tool": "demo__shout", "calls": "edge.echo", "stale": False} in listed
