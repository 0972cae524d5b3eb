"""MCP 2026-07-28 clients of the workspace MCP server, with the SDK's own `mcp.Client` in its default
(`auto`), pinned and `legacy` modes over stdio (`ipybox mcp --workspace`, attached to a running workspace)
and streamable HTTP (`ipybox up`'s endpoint): kernels kept across calls through handles, asks answered in
band (`InputRequiredResult`) resuming the same running cell, long cells as tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field

from ipybox.config import load_config
from ipybox.mcp_server.instructions import facts_of, render_instructions
from ipybox.supervisor import Supervisor, read_state
from tests.cli.test_main import IPYBOX
from tests.mcp_server.sessions import text
from tests.supervisor.workspaces import make_workspace

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Mode = Literal["auto", "legacy", "2026-07-28"]
Elicit = Callable[[Any, types.ElicitRequestParams], Awaitable[types.ElicitResult]]

# edge.weather has no rule: the workspace's default asks.
WEATHER = "from mcptools.edge import weather\n"


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    workspace = make_workspace(
        tmp_path_factory.mktemp("mcp-modern"), "mcp-modern", warm_pool=2, ask_timeout=4
    )
    (workspace / "inbox").mkdir()  # a top-level directory files can be uploaded into
    # Kernels here run unsandboxed, where a registration no rule decides is allowed: this rule asks.
    with (workspace / "ipybox.toml").open("a") as config:
        config.write(
            '\n[[approval.rules]]\nid = "ask-registration"\nserver = "ipybox"\ntool = "register_mcp_server"\n'
            'decision = "ask"\n'
        )
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


@asynccontextmanager
async def stdio(
    supervisor: Supervisor, mode: Mode = "auto", elicit: Elicit | None = None, **kwargs: Any
) -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=str(IPYBOX), args=["mcp", "--workspace", str(supervisor.workspace)]
    )
    async with Client(params, mode=mode, elicitation_callback=elicit, **kwargs) as client:
        yield client


@asynccontextmanager
async def http(
    supervisor: Supervisor, mode: Mode = "auto", elicit: Elicit | None = None, **kwargs: Any
) -> AsyncIterator[Client]:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    async with AsyncExitStack() as stack:
        web = await stack.enter_async_context(
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {state.mcp_token}"}, timeout=60)
        )
        transport = streamable_http_client(state.mcp_url, http_client=web)
        client = Client(transport, mode=mode, elicitation_callback=elicit, **kwargs)
        yield await stack.enter_async_context(client)


def handle_in(result: types.CallToolResult) -> str:
    """The kernel handle a result announces."""
    words = [w.strip(",:") for w in text(result).split() if w.startswith("kernel-")]
    assert words, text(result)
    return words[0]


async def cell(client: Client, code: str, **arguments: Any) -> types.CallToolResult:
    return await client.call_tool("execute_ipython_cell", {"code": code, **arguments})


class Answers:
    """An elicitation callback that answers from a list and remembers what it was asked."""

    def __init__(self, *allow: bool) -> None:
        self.allow = list(allow)
        self.asked: list[types.ElicitRequestFormParams] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params)
        return types.ElicitResult(action="accept", content={"allow": self.allow.pop(0)})


# -- kernels ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "2026-07-28", "legacy"])
async def test_a_client_over_stdio_keeps_its_kernel_and_opens_more_by_handle(
    supervisor: Supervisor, mode: Mode
) -> None:
    async with stdio(supervisor, mode) as client:
        assert (client.protocol_version == "2026-07-28") == (mode != "legacy")
        await cell(client, "v = 7")
        assert text(await cell(client, "print(globals().get('v'))")) == "7"
        opened = await cell(client, "v = 'second'", kernel="new")
        second = handle_in(opened)
        assert text(await cell(client, "print(v)", kernel=second)).startswith("second")
        assert text(await cell(client, "print(v)")) == "7"  # the process's own kernel kept its state
        closed = await client.call_tool("close_kernel", {"kernel": second})
        assert not closed.is_error
        gone = await cell(client, "print(v)", kernel=second)
        assert gone.is_error and "unknown or has expired" in text(gone) and "kernel='new'" in text(gone)


@pytest.mark.parametrize("mode", ["auto", "2026-07-28"])
async def test_a_2026_client_over_http_keeps_state_through_the_handle_its_first_call_returns(
    supervisor: Supervisor, mode: Mode
) -> None:
    async with http(supervisor, mode) as one, http(supervisor, mode) as two:
        assert one.protocol_version == "2026-07-28"
        first = await cell(one, "x = 'one'; print('set')")
        handle = handle_in(first)
        assert text(first).startswith("set")
        assert text(await cell(one, "print(x)", kernel=handle)) == "one"
        # Forgetting the handle: a new kernel, said so, never another client's state.
        forgot = await cell(two, "print('x' in globals())")
        assert text(forgot).startswith("False") and handle_in(forgot) != handle
        await one.call_tool("close_kernel", {"kernel": handle})
        await two.call_tool("close_kernel", {"kernel": handle_in(forgot)})


async def test_a_handle_from_another_caller_is_unknown(supervisor: Supervisor) -> None:
    async with stdio(supervisor) as local, http(supervisor) as remote:
        handle = handle_in(await cell(local, "secret = 1", kernel="new"))
        refused = await cell(remote, "print(secret)", kernel=handle)
        assert refused.is_error and "unknown" in text(refused)


async def test_a_handshake_era_client_keeps_its_session_kernel(supervisor: Supervisor) -> None:
    async with http(supervisor, "legacy") as client:
        assert client.protocol_version != "2026-07-28"
        await cell(client, "y = 3")
        result = await cell(client, "print(y)")
        assert text(result) == "3"  # no handle note: the session keeps the kernel


# -- asks in band -------------------------------------------------------------------------------------

COUNTED = (
    "import pathlib\n"
    "p = pathlib.Path('{name}')\n"
    "p.write_text((p.read_text() if p.exists() else '') + 'x')\n"
    + WEATHER
    + "print(weather.run(weather.Params(city='Graz')).city)\n"
    "print(p.read_text())\n"
)


@pytest.mark.parametrize("transport", [stdio, http])
async def test_an_ask_answered_in_band_resumes_the_running_cell_exactly_once(
    supervisor: Supervisor, transport: Any, tmp_path: Path
) -> None:
    answers = Answers(True)
    name = f"count-{transport.__name__}.txt"
    async with transport(supervisor, elicit=answers) as client:
        result = await cell(client, COUNTED.format(name=name), kernel="new")
        assert not result.is_error, text(result)
        assert text(result).splitlines()[:2] == ["Graz", "x"]  # the code before the ask ran once
        (asked,) = answers.asked
        # What is asked: the call with its arguments, and why (no rule decides edge.weather: the default).
        assert "edge.weather(city='Graz')" in asked.message and "default" in asked.message


async def test_several_asks_in_one_cell_are_several_rounds_and_a_rejection_fails_the_call(
    supervisor: Supervisor,
) -> None:
    answers = Answers(True, False)
    code = (
        WEATHER + "print(weather.run(weather.Params(city='A')).city)\nweather.run(weather.Params(city='B'))\n"
    )
    async with stdio(supervisor, elicit=answers) as client:
        result = await cell(client, code)
        assert result.is_error and "A" in text(result) and "reject" in text(result).lower()
        assert [p.message.count("edge.weather") for p in answers.asked] == [1, 1]


FORECAST_API = '''\
"""The weather of a city, shouted."""
from pydantic import BaseModel

from . import impl


class Params(BaseModel):
    city: str


def run(params: Params) -> str:
    """The weather of a city, shouted."""
    return impl.forecast(params.city)
'''

FORECAST_IMPL = """\
from mcptools.edge import weather


def forecast(city: str) -> str:
    print("asking for", city)
    return weather.run(weather.Params(city=city)).city.upper()
"""


async def test_a_saved_action_whose_tool_call_is_asked_in_band_returns_its_result(
    supervisor: Supervisor,
) -> None:
    answers = Answers(True)
    async with http(supervisor, elicit=answers) as client:
        saved = await client.call_tool(
            "save_code_action",
            {"category": "weather", "name": "forecast", "api": FORECAST_API, "impl": FORECAST_IMPL},
        )
        assert not saved.is_error, text(saved)
        result = await client.call_tool("weather__forecast", {"city": "Linz"})
    assert not result.is_error, text(result)
    assert "LINZ" in text(result) and len(answers.asked) == 1
    assert "kernel-" not in text(result)  # a kernel for the one call, closed after it: no handle to keep


async def test_a_forged_or_replayed_request_state_is_refused(supervisor: Supervisor) -> None:
    async with stdio(supervisor, elicit=Answers()) as client:
        arguments = {"code": WEATHER + "print(weather.run(weather.Params(city='C')).city)"}
        first = await client.session.call_tool("execute_ipython_cell", arguments, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.input_requests
        (key,) = first.input_requests
        request = first.input_requests[key]
        assert isinstance(request, types.ElicitRequest) and "edge.weather(city='C')" in request.params.message
        allow = {key: types.ElicitResult(action="accept", content={"allow": True})}
        with pytest.raises(MCPError, match="requestState"):
            await client.session.call_tool(
                "execute_ipython_cell",
                arguments,
                input_responses=allow,
                request_state="v1.forged",
                allow_input_required=True,
            )
        done = await client.session.call_tool(
            "execute_ipython_cell",
            arguments,
            input_responses=allow,
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(done, types.CallToolResult) and text(done) == "C"
        replayed = await client.session.call_tool(
            "execute_ipython_cell",
            arguments,
            input_responses=allow,
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(replayed, types.CallToolResult) and replayed.is_error and "ended" in text(replayed)


async def test_an_ask_nobody_answers_times_out_as_configured_and_the_cell_goes_on(
    supervisor: Supervisor,
) -> None:
    async with stdio(supervisor, elicit=Answers()) as client:
        arguments = {
            "code": WEATHER + "try:\n    weather.run(weather.Params(city='D'))\nexcept Exception as e:\n"
            "    print('refused:', type(e).__name__)\nprint('went on')"
        }
        first = await client.session.call_tool("execute_ipython_cell", arguments, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        await asyncio.sleep(5)  # the workspace's ask_timeout is 4 s
        late = await client.session.call_tool(
            "execute_ipython_cell",
            arguments,
            request_state=first.request_state,
            input_responses={
                k: types.ElicitResult(action="accept", content={"allow": True})
                for k in first.input_requests or {}
            },
            allow_input_required=True,
        )
        assert isinstance(late, types.CallToolResult)
        assert "refused" in text(late) and text(late).endswith("went on")


async def test_a_long_cell_reports_progress_to_a_2026_client(supervisor: Supervisor) -> None:
    updates: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        updates.append(value)

    async with stdio(supervisor) as client:
        code = "import time\ntime.sleep(2.5)\nprint('done')"
        result = await client.call_tool("execute_ipython_cell", {"code": code}, progress_callback=progress)
    assert text(result) == "done" and len(updates) >= 2 and updates == sorted(updates)


async def test_a_cancelled_call_interrupts_the_cell_and_the_kernel_keeps_its_state(
    supervisor: Supervisor,
) -> None:
    async with stdio(supervisor) as client:
        await cell(client, "kept = 'yes'")
        call = asyncio.create_task(cell(client, "while True: pass", timeout=300))
        await asyncio.sleep(1.5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        started = asyncio.get_running_loop().time()
        assert text(await cell(client, "print(kept)")) == "yes"
        assert asyncio.get_running_loop().time() - started < 10


async def test_register_mcp_server_asks_in_band(supervisor: Supervisor) -> None:
    answers = Answers(False)
    async with stdio(supervisor, elicit=answers) as client:
        result = await client.call_tool(
            "register_mcp_server", {"server_name": "edge_two", "server_params": {"command": "true"}}
        )
    assert result.is_error and "denied" in text(result) and "Nothing was written" in text(result)
    assert len(answers.asked) == 1 and "edge_two" in answers.asked[0].message
    assert "edge_two" not in (supervisor.workspace / "ipybox.toml").read_text()


# -- files --------------------------------------------------------------------------------------------


async def test_a_2026_client_uploads_and_downloads_a_file_each_asked_in_band(supervisor: Supervisor) -> None:
    answers = Answers(True, True, False)
    async with http(supervisor, elicit=answers) as client:
        up = await client.call_tool(
            "upload_file", {"path": "inbox/data.bin", "content": "AAEC/w==", "encoding": "base64"}
        )
        assert not up.is_error, text(up)
        assert (supervisor.workspace / "inbox" / "data.bin").read_bytes() == b"\x00\x01\x02\xff"
        down = await client.call_tool("download_file", {"path": "inbox/data.bin"})
        assert down.structured_content is not None and down.structured_content["content"] == "AAEC/w=="
        refused = await client.call_tool("upload_file", {"path": "inbox/other.txt", "content": "no"})
        assert refused.is_error and "rejected" in text(refused)
    assert not (supervisor.workspace / "inbox" / "other.txt").exists()
    assert [("upload_file" in a.message, "download_file" in a.message) for a in answers.asked] == [
        (True, False),
        (False, True),
        (True, False),
    ]


# -- tasks --------------------------------------------------------------------------------------------

TASKS = "io.modelcontextprotocol/tasks"


class _TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class _UpdateParams(_TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class _GetTask(types.Request[_TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskIdParams


class _UpdateTask(types.Request[_UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: _UpdateParams


class _CancelTask(types.Request[_TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: _TaskIdParams


class _Task(types.Result):
    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str


class _Polled(types.Result):
    model_config = ConfigDict(extra="allow")


class TasksClient(ClientExtension):
    """The client side of the tasks extension, as a test drives it: polls, answers asks by `answers`, and
    cancels when `cancel_after` polls saw it working."""

    identifier = TASKS

    def __init__(self, answers: Answers | None = None, cancel_after: int | None = None) -> None:
        self.answers = answers
        self.cancel_after = cancel_after
        self.seen: list[dict[str, Any]] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=_Task, resolve=self._resolve)]

    async def _resolve(self, task: _Task, ctx: ClaimContext) -> types.CallToolResult:
        working = 0
        while True:
            await asyncio.sleep(0.3)
            polled = await ctx.session.send_request(
                _GetTask(params=_TaskIdParams(taskId=task.task_id)), _Polled
            )
            state = polled.model_dump(by_alias=True)
            self.seen.append(state)
            if state["status"] == "working":
                working += 1
                if self.cancel_after is not None and working >= self.cancel_after:
                    await ctx.session.send_request(
                        _CancelTask(params=_TaskIdParams(taskId=task.task_id)), _Polled
                    )
            elif state["status"] == "input_required":
                assert self.answers is not None
                responses = {}
                for key, request in state["inputRequests"].items():
                    params = types.ElicitRequestFormParams.model_validate(request["params"])
                    responses[key] = (await self.answers(None, params)).model_dump(
                        by_alias=True, exclude_none=True
                    )
                update = _UpdateTask(params=_UpdateParams(taskId=task.task_id, inputResponses=responses))
                await ctx.session.send_request(update, _Polled)
            elif state["status"] == "completed":
                return types.CallToolResult.model_validate(state["result"])
            else:
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=state["status"])], is_error=True
                )


@pytest.mark.parametrize("transport", [stdio, http])
async def test_a_long_cell_becomes_a_task_with_progress_an_ask_and_its_result(
    supervisor: Supervisor, transport: Any
) -> None:
    answers = Answers(True)
    tasks = TasksClient(answers)
    code = (
        "import time\nprint('started', flush=True)\ntime.sleep(2)\n"
        + WEATHER
        + ("print(weather.run(weather.Params(city='E')).city)")
    )
    # It declares elicitation (or nobody would ask it), and answers the task's asks with tasks/update.
    async with transport(supervisor, elicit=Answers(), extensions=[tasks]) as client:
        assert TASKS in (client.server_capabilities.extensions or {})
        result = await cell(client, code)
    assert text(result).splitlines()[:2] == ["started", "E"]  # over HTTP, the new kernel's handle follows
    statuses = [state["status"] for state in tasks.seen]
    assert statuses[0] == "working" and "input_required" in statuses and statuses[-1] == "completed"
    assert any("started" in state.get("statusMessage", "") for state in tasks.seen)
    assert len(answers.asked) == 1


async def test_a_cancelled_task_interrupts_the_cell_and_keeps_the_kernel(supervisor: Supervisor) -> None:
    tasks = TasksClient(cancel_after=2)
    async with stdio(supervisor, extensions=[tasks]) as client:
        await cell(client, "kept = 'still here'")
        result = await cell(client, "import time\nwhile True: time.sleep(0.1)", timeout=300)
        assert result.is_error and text(result) == "cancelled"
        assert text(await cell(client, "print(kept)")) == "still here"


async def test_a_short_cell_is_answered_directly_even_for_a_client_that_takes_tasks(
    supervisor: Supervisor,
) -> None:
    tasks = TasksClient()
    async with stdio(supervisor, extensions=[tasks]) as client:
        assert text(await cell(client, "print(1 + 1)")) == "2"
    assert tasks.seen == []


# -- what the agent is told, and names as other clients spell them -----------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("transport", [stdio, http])
async def test_every_client_is_told_the_workspaces_real_settings_and_may_name_a_server_as_other_clients_do(
    supervisor: Supervisor, transport: Any, mode: Mode
) -> None:
    async with transport(supervisor, mode) as client:
        assert (client.protocol_version == "2026-07-28") == (mode != "legacy")
        # Rendered from the running workspace's configuration, whichever revision and transport.
        if mode == "legacy":  # in `initialize`'s result
            told = client.instructions
        else:  # in `server/discover`'s
            told = types.DiscoverResult.model_validate(
                await client.session.send_discover("2026-07-28")
            ).instructions
        assert told == render_instructions(facts_of(load_config(supervisor.workspace)))
        assert "Kernels are not sandboxed" in told
        # A hyphenated name is mapped, not refused: what fails here is the url (nothing is written).
        result = await client.call_tool(
            "register_mcp_server", {"server_name": "my-server", "server_params": {"url": "ftp://x"}}
        )
        assert result.is_error and "http" in text(result) and "package name" not in text(result)
    assert "my_server" not in (supervisor.workspace / "ipybox.toml").read_text()
