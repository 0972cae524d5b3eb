"""The whole code-as-tool story in one scripted MCP session, as an agent would live it: register a server,
find its tool with `search_tools`, call it from code, write an output parser, regenerate the server (an
edit of its `ipybox.toml` section), use `run_parsed()`, save the composition as a code action, call it as
an MCP tool, and import it from a new code action after a reset. A real sandboxed workspace, our edge
server (registered over MCP, so sandboxed too) and the Python MCP client over streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from ipybox.supervisor import Supervisor, read_state
from tests.mcp_server.sessions import ALLOW_REGISTRATION, owned_session, text
from tests.mcp_server.test_registration import replace
from tests.servers.params import EDGE_SERVER
from tests.servers.processes import TAG_ENV
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

WORDS_ALLOWED = """
[[approval.rules]]
id = "words"
server = "words"
decision = "allow"
"""

PARSER = '''\
"""Output parser for words.echo: the echoed text as a list of words."""

from pydantic import BaseModel


class ParseResult(BaseModel):
    words: list[str]


def parse(raw: str) -> ParseResult:
    return ParseResult(words=raw.split())
'''

API = '''\
from pydantic import BaseModel


class Params(BaseModel):
    text: str


class WordCount(BaseModel):
    count: int
    longest: str


def run(params: Params) -> WordCount:
    """Count the words of a text (echoed by the words server) and find the longest one."""
    from .impl import count

    return count(params.text)
'''

# The first attempt of many an agent: api.py imports impl.py at the top, which imports api.py back.
CIRCULAR_API = API.replace(
    "from pydantic import BaseModel\n", "from pydantic import BaseModel\n\nfrom . import impl\n"
)

IMPL = """\
from mcptools.words import echo

from .api import WordCount


def count(text: str) -> WordCount:
    words = echo.run_parsed(echo.Params(text=text)).words
    return WordCount(count=len(words), longest=max(words, key=len, default=""))
"""


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    directory = make_workspace(tmp_path_factory.mktemp("story"), "story", sandbox=True, warm_pool=2)
    config = directory / "ipybox.toml"
    config.write_text(config.read_text() + ALLOW_REGISTRATION + WORDS_ALLOWED)
    supervisor = Supervisor(directory)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


async def session_of(supervisor: Supervisor, stack: AsyncExitStack) -> ClientSession:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    url, token = state.mcp_url, state.mcp_token

    async def open_session(inner: AsyncExitStack) -> ClientSession:
        http = await inner.enter_async_context(
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
        )
        read, write = await inner.enter_async_context(streamable_http_client(url, http_client=http))
        return await inner.enter_async_context(ClientSession(read, write))

    return await stack.enter_async_context(owned_session(open_session))


async def run_cell(session: ClientSession, code: str) -> str:
    result = await session.call_tool("execute_ipython_cell", {"code": code})
    assert not result.is_error, text(result)
    return text(result)


async def until(condition: object, what: str, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_an_agent_registers_searches_calls_parses_saves_and_reuses_a_code_action(
    supervisor: Supervisor,
) -> None:
    workspace = supervisor.workspace
    async with AsyncExitStack() as stack:
        session = await session_of(supervisor, stack)

        # 0. Told what this workspace is: sandboxed, no host reachable, so no package can be installed;
        # install_package then fails at once (pip makes no retries there) and says why.
        init = session.initialize_result
        assert init is not None and init.instructions is not None
        assert "Python in a stateful IPython kernel in a sandbox." in init.instructions
        assert "Network: none (no host is allowed)" in init.instructions
        assert "install_package can't work here" in init.instructions
        started = asyncio.get_running_loop().time()
        installed = await session.call_tool("install_package", {"package_name": "ipybox-no-such-package"})
        assert installed.is_error and "reach no package index" in text(installed), text(installed)
        assert "don't retry" in text(installed)
        # pip runs with --retries 0 here: against a refusing proxy, its five retries with back-off only delay
        # this answer (this machine's pip may read a local index, so the bound is loose).
        assert asyncio.get_running_loop().time() - started < 30

        # 1. Register a server: its typed API is generated.
        params = {"command": sys.executable, "args": [str(EDGE_SERVER)], "env": {TAG_ENV: "story"}}
        registered = await session.call_tool(
            "register_mcp_server", {"server_name": "words", "server_params": params}
        )
        assert not registered.is_error, text(registered)
        assert "echo" in text(registered).split("mcptools.words: ")[1].split(", ")

        # 2. Search instead of reading every module.
        found = text(await session.call_tool("search_tools", {"query": "words echo text", "limit": 3}))
        hits = found.splitlines()[1:]
        assert hits[0].startswith("mcptools.words.echo  run(Params(text: str)) -> str"), found
        assert "(mcptools/words/echo.py)" in hits[0]

        # 3. Call it from code.
        assert (
            await run_cell(
                session, "from mcptools.words import echo\nprint(echo.run(echo.Params(text='a bb c')))"
            )
            == "a bb c"
        )

        # 4. Write an output parser (as an agent writes a file), 5. regenerate by editing the server's section.
        parser = workspace / "mcpparse" / "words" / "echo.py"
        parser.parent.mkdir(parents=True, exist_ok=True)
        parser.write_text(PARSER)
        config = workspace / "ipybox.toml"
        before = supervisor.status().reconciler.servers["words"].generation
        kernels_before = supervisor.kernel_generation
        replace(config, config.read_bytes().replace(b'"story" }', b'"story", STORY_STEP = "5" }', 1))
        assert b"STORY_STEP" in config.read_bytes()

        def regenerated() -> bool:
            server = supervisor.status().reconciler.servers["words"]
            return (
                server.state == "ready"
                and (server.generation or 0) > (before or 0)
                and server.parsers == ["echo"]
                # The [kernel] env edit recycles the kernels too: a cell sent before that ends with them.
                and supervisor.kernel_generation > kernels_before
            )

        await until(regenerated, "words to be regenerated with its parser and the kernels recycled")
        status = supervisor.status().reconciler.servers["words"]
        assert status.parser_errors == []
        module = (workspace / "mcptools" / "words" / "echo.py").read_text()
        assert "def run_parsed(" in module and "async def arun_parsed(" in module

        # 6. run_parsed() returns the parser's model.
        parsed = await run_cell(
            session,
            "from mcptools.words import echo\nr = echo.run_parsed(echo.Params(text='a bb c'))\n"
            "print(type(r).__name__, r.words)",
        )
        # The [kernel] env edit recycled the kernels: the first cell after it is told so, once, before its output.
        *notices, output = parsed.splitlines()
        assert output == "ParseResult ['a', 'bb', 'c']"
        assert (
            all(n.startswith("[ipybox] this session's kernel was replaced") for n in notices)
            and len(notices) <= 1
        )

        # 7. Save the composition as a code action. Code that does not import is refused, with where.
        refused = await session.call_tool(
            "save_code_action", {"category": "text", "name": "word_count", "api": CIRCULAR_API, "impl": IMPL}
        )
        assert refused.is_error
        assert "gentools/text/word_count/impl.py:3:1: ImportError: cannot import name 'WordCount'" in text(
            refused
        )
        assert not (workspace / "gentools" / "text" / "word_count").exists()
        saved = await session.call_tool(
            "save_code_action", {"category": "text", "name": "word_count", "api": API, "impl": IMPL}
        )
        assert not saved.is_error, text(saved)
        assert "may call: words.echo" in text(saved)

        # 8. Call it as an MCP tool.
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert "text__word_count" in tools
        assert tools["text__word_count"].input_schema["required"] == ["text"]
        called = await session.call_tool("text__word_count", {"text": "one three fifteen"})
        assert not called.is_error, text(called)
        assert called.structured_content == {"count": 3, "longest": "fifteen"}

        # 9. After a reset, a new code action imports it.
        await session.call_tool("reset", {})
        reused = await run_cell(
            session,
            "from gentools.text.word_count import Params, run\nprint(run(Params(text='x yy zzz')).model_dump())",
        )
        assert reused == "{'count': 3, 'longest': 'zzz'}"

        # 10. Search finds it, and status tells what it may call.
        found = text(await session.call_tool("search_tools", {"query": "count words", "limit": 3}))
        assert found.splitlines()[1].startswith(
            "gentools.text.word_count  run(Params(text: str)) -> WordCount"
        ), found
        assert "[MCP tool text__word_count]" in found.splitlines()[1]
        actions = {action.name: action for action in supervisor.status().actions}
        assert actions["text.word_count"].calls == "words.echo"
        index = (workspace / "gentools" / "text" / "__init__.py").read_text()
        assert "- word_count: Count the words of a text" in index
        manifest = json.loads((workspace / "gentools" / "text" / "word_count" / "action.json").read_text())
        assert manifest["input_schema"]["properties"]["text"]["type"] == "string"
