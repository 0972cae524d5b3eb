"""The MCP App view of a run (`ipybox.mcp_server.app_view`): real `mcp.Client`s declaring the MCP Apps
extension (`io.modelcontextprotocol/ui`) over stdio (2026-07-28) and streamable HTTP (handshake era), a real
workspace whose kernel's tool call waits on an `ask`, the view's key taken from the `ui://` resource, and the
view deciding the waiting call; the attacker's side (the model calling the answer tool without the view's key,
or with another session's) is refused and the ask stays pending. Then the resource rendered in Debian's
chromium inside a host shim that speaks the spec's postMessage JSON-RPC (`ui/initialize`,
`ui/notifications/tool-input` and `tool-result`, `tools/call` proxied to the real server), where a click on
"Allow once" lets the call run."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal

import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.extension import advertise
from mcp.client.streamable_http import streamable_http_client
from playwright.async_api import async_playwright

from ipybox.mcp_server.app_view import (
    ANSWER_TOOL,
    APP_MIME_TYPE,
    EXTENSION_ID,
    RUN_META,
    STATE_TOOL,
    VIEW_URI,
)
from ipybox.supervisor import Supervisor, read_state
from tests.cli.test_main import IPYBOX
from tests.console.conftest import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS
from tests.mcp_server.sessions import text
from tests.supervisor.workspaces import make_workspace

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Mode = Literal["legacy", "auto"]  # auto: 2026-07-28, found by `server/discover`
APPS = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})

# A 1x1 PNG, displayed by the cell: the view shows the run's images.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
# edge.weather has no rule: the workspace's default asks.
CODE = (
    "# the agent checks the weather in E\n"
    "from mcptools.edge import weather\n"
    "print(weather.run(weather.Params(city='E')).city)\n"
    "from IPython.display import Image, display\n"
    f"display(Image(data={PNG!r}))\n"
)


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    workspace = make_workspace(tmp_path_factory.mktemp("mcp-app"), "mcp-app", warm_pool=3, ask_timeout=30)
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


@asynccontextmanager
async def stdio(supervisor: Supervisor, mode: Mode, apps: bool = True) -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=str(IPYBOX), args=["mcp", "--workspace", str(supervisor.workspace)]
    )
    async with Client(params, mode=mode, extensions=[APPS] if apps else []) as client:
        yield client


@asynccontextmanager
async def http(supervisor: Supervisor, mode: Mode, apps: bool = True) -> AsyncIterator[Client]:
    state = read_state(supervisor.workspace)
    assert state.mcp_url is not None and state.mcp_token is not None
    async with AsyncExitStack() as stack:
        web = await stack.enter_async_context(
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {state.mcp_token}"}, timeout=60)
        )
        transport = streamable_http_client(state.mcp_url, http_client=web)
        client = Client(transport, mode=mode, extensions=[APPS] if apps else [])
        yield await stack.enter_async_context(client)


async def view_key(client: Client) -> str:
    """The key the view gets with its HTML (as a host reads the resource for it)."""
    read = await client.read_resource(VIEW_URI)
    content = read.contents[0]
    assert isinstance(content, types.TextResourceContents) and content.mime_type == APP_MIME_TYPE
    match = re.search(r'<meta name="ipybox-view-key" content="([^"]+)">', content.text)
    assert match, "the view carries its key"
    return match.group(1)


async def state_of(client: Client, key: str, run: str | None = None) -> dict[str, Any]:
    result = await client.call_tool(STATE_TOOL, {"view_key": key, **({"run": run} if run else {})})
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    return dict(result.structured_content)


async def pending_ask(client: Client, key: str) -> tuple[str, dict[str, Any]]:
    """The run's id and its first pending ask, once the kernel's call waits on it."""
    for _ in range(300):
        run = (await state_of(client, key))["run"]
        if run is not None and run["code"] == CODE and run["asks"]:
            return run["id"], run["asks"][0]
        await asyncio.sleep(0.1)
    raise AssertionError("the run's ask never showed")


def dump(result: types.CallToolResult) -> str:
    return result.model_dump_json(by_alias=True, exclude_none=True)


async def refused(client: Client, keys: list[str], run_id: str, ask_id: str) -> None:
    """The attacker's side: the model sees the answer tool and calls it (and the state tool) with each of
    `keys`, none of them its view's: every call is refused."""
    for bad in keys:
        answer = await client.call_tool(
            ANSWER_TOOL, {"view_key": bad, "run": run_id, "ask": ask_id, "accept": True}
        )
        assert answer.is_error and "not for the model" in text(answer), bad
        peek = await client.call_tool(STATE_TOOL, {"view_key": bad})
        assert peek.is_error and "not for the model" in text(peek), bad


def forged(key: str) -> list[str]:
    """Keys a model could try: none, a made-up one, the view's id with a wrong secret, its secret alone."""
    return ["", "no-such-key", key.partition(".")[0] + "." + "A" * 43, "." + key.partition(".")[2]]


def check_finished_run(run: dict[str, Any]) -> None:
    assert run["status"] == "done" and run["asks"] == [] and run["output"].startswith("E")
    assert len(run["images"]) == 1 and base64.b64decode(run["images"][0]) == PNG
    weather = [c for c in run["calls"] if c["tool"] == "weather"]
    assert weather and weather[-1]["decision"] == "allow" and weather[-1]["decided_by"] == "elicitation"


async def test_a_2026_client_with_the_extension_sees_the_run_and_only_its_view_decides_the_waiting_call(
    supervisor: Supervisor,
) -> None:
    async with http(supervisor, "auto") as client:
        assert client.protocol_version == "2026-07-28"
        assert EXTENSION_ID in (client.server_capabilities.extensions or {})
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert (tools["execute_ipython_cell"].meta or {})["ui"] == {"resourceUri": VIEW_URI}
        assert (tools[ANSWER_TOOL].meta or {})["ui"]["visibility"] == ["app"]
        key = await view_key(client)

        call = asyncio.create_task(client.call_tool("execute_ipython_cell", {"code": CODE}))
        run_id, ask = await pending_ask(client, key)
        assert (ask["server"], ask["tool"], ask["args"]) == ("edge", "weather", {"city": "E"})
        assert ask["reason"]  # why it asks (the default decision here)
        await refused(client, forged(key), run_id, ask["id"])
        await asyncio.sleep(0.3)
        assert not call.done()
        assert (await state_of(client, key, run_id))["run"]["asks"][0]["id"] == ask["id"]  # still pending

        answered = await client.call_tool(
            ANSWER_TOOL, {"view_key": key, "run": run_id, "ask": ask["id"], "accept": True}
        )
        assert not answered.is_error, text(answered)
        result = await asyncio.wait_for(call, 30)
        assert text(result).splitlines()[0] == "E"
        assert (result.meta or {})[RUN_META] == run_id
        assert key not in dump(result)  # the capability never reaches what the model reads
        again = await client.call_tool(
            ANSWER_TOOL, {"view_key": key, "run": run_id, "ask": ask["id"], "accept": False}
        )
        assert again.is_error and "already answered" in text(again)
        check_finished_run((await state_of(client, key, run_id))["run"])


# The host: a page that renders the view in a sandboxed iframe and speaks the spec's postMessage JSON-RPC
# with it, proxying `tools/call` to the real server (through `window.callTool`, exposed by the test).
HOST = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="view" sandbox="allow-scripts" style="border:0;width:100%;height:900px"></iframe>
<script>
const frame = document.getElementById('view');
window.__calls = []; window.__initialized = false;
const post = (message) => frame.contentWindow.postMessage(Object.assign({jsonrpc: '2.0'}, message), '*');
window.__toolResult = (result) => post({method: 'ui/notifications/tool-result', params: result});
window.addEventListener('message', async (event) => {
  if (event.source !== frame.contentWindow) return;
  const m = event.data;
  if (m.method === 'ui/initialize') {
    post({id: m.id, result: {protocolVersion: '2026-01-26', hostCapabilities: {serverTools: {}},
      hostInfo: {name: 'ipybox-test-host', version: '1'}, hostContext: {theme: 'light', displayMode: 'inline'}}});
  } else if (m.method === 'ui/notifications/initialized') {
    window.__initialized = true;
    post({method: 'ui/notifications/tool-input', params: {arguments: window.__input}});
  } else if (m.method === 'tools/call') {
    window.__calls.push(m.params.name);
    post({id: m.id, result: JSON.parse(await window.callTool(JSON.stringify(m.params)))});
  }
});
</script></body></html>"""


async def test_a_handshake_client_renders_the_view_in_a_browser_whose_button_alone_lets_the_waiting_call_run(
    supervisor: Supervisor,
) -> None:
    """The handshake era over HTTP, with the view rendered in chromium by a host shim: the model's tries
    (forged keys, another session's key) are refused, the view's click decides the call. And a client
    without the extension gets today's tools and results, byte for byte."""
    same = "print('same')\nfrom IPython.display import Image, display\n" + f"display(Image(data={PNG!r}))\n"
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(http(supervisor, "legacy"))
        plain = await stack.enter_async_context(http(supervisor, "legacy", apps=False))
        other = await stack.enter_async_context(http(supervisor, "legacy"))  # another session, same token
        assert client.protocol_version == "2025-11-25"

        listed = (await plain.list_tools()).model_dump_json(by_alias=True, exclude_none=True)
        assert STATE_TOOL not in listed and ANSWER_TOOL not in listed and '"ui"' not in listed
        plain_result = await plain.call_tool("execute_ipython_cell", {"code": same})
        apps_result = await client.call_tool("execute_ipython_cell", {"code": same})
        assert plain_result.meta is None and apps_result.meta is not None
        assert dump(plain_result) == dump(apps_result.model_copy(update={"meta": None}))

        read = await client.read_resource(VIEW_URI)
        html = read.contents[0]
        assert isinstance(html, types.TextResourceContents)
        size = len(html.text.encode())
        assert size < 12_000, size  # the view stays small (the issue asks for its size)
        key = re.search(r'<meta name="ipybox-view-key" content="([^"]+)">', html.text)
        assert key is not None
        playwright = await stack.enter_async_context(async_playwright())
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        stack.push_async_callback(browser.close)
        page = await browser.new_page(viewport={"width": 390, "height": 900})
        problems: list[str] = []
        page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: problems.append(str(error)))

        async def call_tool(params: str) -> str:
            request = json.loads(params)
            return dump(await client.call_tool(request["name"], request.get("arguments") or {}))

        await page.expose_function("callTool", call_tool)
        await page.set_content(HOST)
        call = asyncio.create_task(client.call_tool("execute_ipython_cell", {"code": CODE}))
        await page.evaluate(
            "([html, input]) => { window.__input = input; document.getElementById('view').srcdoc = html; }",
            [html.text, {"code": CODE}],
        )
        view = page.frame_locator("#view")
        allow = view.get_by_role("button", name="Allow once")
        await allow.wait_for(timeout=30_000)
        assert "edge.weather waits for your answer" in await view.locator(".ask").inner_text()
        assert (await view.locator("#code").inner_text()).startswith("# the agent checks the weather in E")

        run_id, ask = await pending_ask(client, key.group(1))
        await refused(
            client, [*forged(key.group(1)), await view_key(other), await view_key(plain)], run_id, ask["id"]
        )
        await asyncio.sleep(0.3)
        assert not call.done()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SCREENSHOTS / "mcp-app-ask-390.png"), full_page=True)

        await allow.click()
        result = await asyncio.wait_for(call, 30)
        assert text(result).splitlines()[0] == "E"
        await page.evaluate("(result) => window.__toolResult(result)", json.loads(dump(result)))
        await view.locator("#status", has_text="done").wait_for(timeout=10_000)
        await view.locator("#calls li", has_text="edge.weather").first.wait_for(timeout=10_000)
        calls = await view.locator("#calls").inner_text()
        assert "allow" in calls and "elicitation" in calls
        assert await view.locator("#imgs img").count() == 1
        assert await view.locator("#out").inner_text() == "E"
        width = await view.locator("html").evaluate("(e) => e.scrollWidth")
        assert width <= 390, width  # no horizontal overflow at a phone's width
        await page.screenshot(path=str(SCREENSHOTS / "mcp-app-done-390.png"), full_page=True)
        host_calls = await page.evaluate("window.__calls")
        assert set(host_calls) <= {STATE_TOOL, ANSWER_TOOL} and ANSWER_TOOL in host_calls
        assert not problems, problems  # no CSP violation, no script error
        check_finished_run((await state_of(client, key.group(1), run_id))["run"])
