"""The workspace MCP server on the rest of the 2026-07-28 revision (`ipybox.mcp_server.code_actions`):
`server/discover`, the order and caching hints of `tools/list`, `subscriptions/listen` announcing a
changed tool list, the per-request log level and OpenTelemetry trace context in `_meta`.

The fast tests drive `create_server`'s server in this process with the SDK's `mcp.Client` (no kernel is
needed to list or search tools); the integration tests save and describe actions in a workspace's kernels,
and ask `ipybox mcp` over stdio.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import mcp
import mcp_types as types
import pytest
from mcp import StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.client.subscriptions import Subscription
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ToolsListChanged

from ipybox import __version__
from ipybox.config import load_config
from ipybox.mcp_server.code_actions import CACHE_HINTS, TOOL_ORDER, WorkspaceMCPServer
from ipybox.mcp_server.instructions import facts_of, render_instructions
from ipybox.mcp_server.workspace_mcp import WorkspaceMCP, create_server
from ipybox.supervisor import Supervisor
from ipybox.supervisor.mcp_stdio import planned_config
from tests.cli.test_main import IPYBOX
from tests.codeact.test_actions import API, _manifest, _write_action
from tests.mcp_server.sessions import text
from tests.supervisor.workspaces import make_workspace

integration = pytest.mark.integration

MODERN = "2026-07-28"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace (not running) with two saved actions, written in the opposite order of their names."""
    workspace = make_workspace(tmp_path_factory.mktemp("revision"), "revision")
    for category, name in (("zz", "first"), ("aa", "second")):
        _write_action(workspace / "gentools", category, name, API, _manifest(API))
    return workspace


@pytest.fixture(scope="module")
async def served(workspace: Path) -> AsyncIterator[WorkspaceMCP]:
    async with create_server(workspace) as served:
        yield served


async def test_discover_names_ipybox_and_declares_only_the_capabilities_it_has(
    served: WorkspaceMCP, workspace: Path
) -> None:
    async with mcp.Client(served.server) as client:
        assert client.protocol_version == MODERN
        found = types.DiscoverResult.model_validate(await client.session.send_discover(MODERN))
    assert found.supported_versions == [MODERN]  # handshake revisions are reached through `initialize`
    info = found.meta["io.modelcontextprotocol/serverInfo"] if found.meta is not None else None
    assert info == {"name": "ipybox", "version": __version__}
    # Rendered from the workspace's configuration: unsandboxed, and said so.
    assert found.instructions == render_instructions(facts_of(load_config(workspace)))
    capabilities = found.capabilities
    assert capabilities.tools is not None and capabilities.tools.list_changed is True
    # mcp serves prompts/list regardless; ipybox has none, and sends no log messages. Its one resource is the
    # MCP App view (`ui://ipybox/run.html`), read by hosts that render it, not listed.
    assert (
        capabilities.prompts is None and capabilities.resources is not None and capabilities.logging is None
    )
    assert "io.modelcontextprotocol/ui" in (capabilities.extensions or {})
    assert (found.ttl_ms, found.cache_scope) == (3_600_000, "public")


async def test_a_handshake_era_client_gets_the_same_identity_and_capabilities(served: WorkspaceMCP) -> None:
    async with mcp.Client(served.server, mode="legacy") as client:
        assert client.protocol_version != MODERN
        assert client.server_info is not None
        assert (client.server_info.name, client.server_info.version) == ("ipybox", __version__)
        capabilities = client.server_capabilities
    assert capabilities.tools is not None and capabilities.tools.list_changed is True
    assert (
        capabilities.prompts is None and capabilities.resources is not None and capabilities.logging is None
    )


async def test_tools_are_listed_built_in_ones_in_a_fixed_order_then_saved_actions_by_name(
    served: WorkspaceMCP,
) -> None:
    async with mcp.Client(served.server) as client:
        listed = await client.list_tools()
        again = await client.list_tools(cache_mode="bypass")
    names = [tool.name for tool in listed.tools]
    assert names == [tool.name for tool in again.tools]
    # create_server registers search_tools and save_code_action first; the list still leads with the cell.
    builtin = [name for name in names if "__" not in name]
    assert builtin[0] == "execute_ipython_cell"
    assert builtin == [n for n in TOOL_ORDER if n in builtin] + sorted(set(builtin) - set(TOOL_ORDER))
    assert names[len(builtin) :] == ["aa__second", "zz__first"]
    # Stale at once, and for this workspace's callers only (see CACHE_HINTS).
    assert (listed.ttl_ms, listed.cache_scope) == (0, "private")
    assert CACHE_HINTS["tools/list"].ttl_ms == 0


async def test_a_listening_client_is_told_when_the_tool_list_changes_outside_a_request(
    served: WorkspaceMCP,
) -> None:
    assert isinstance(served.server, WorkspaceMCPServer)
    async with mcp.Client(served.server) as client, client.listen(tools_list_changed=True) as listening:
        assert listening.honored.tools_list_changed is True
        await served.server.announce_tools_changed()
        assert await next_event(listening) == ToolsListChanged()


async def test_stopping_the_server_ends_listening_streams_gracefully(workspace: Path) -> None:
    async with create_server(workspace) as served, mcp.Client(served.server) as client:
        assert isinstance(served.server, WorkspaceMCPServer)
        async with client.listen(tools_list_changed=True) as listening:
            served.server.end_subscriptions()
            # A graceful end finishes the iteration; a dropped stream would raise SubscriptionLost.
            assert [event async for event in listening] == []


async def test_a_request_may_ask_for_log_messages_and_gets_none_and_an_unknown_level_is_refused(
    served: WorkspaceMCP,
) -> None:
    logged: list[types.LoggingMessageNotificationParams] = []

    async def log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params)

    async with mcp.Client(served.server, log_level="debug", logging_callback=log) as client:
        found = await client.call_tool("search_tools", {"query": "greet someone"})
        assert not found.is_error, text(found)
        with pytest.raises(MCPError) as refused:
            await client.list_tools(meta=_meta({"io.modelcontextprotocol/logLevel": "loud"}))
    assert refused.value.error.code == types.INVALID_PARAMS
    assert logged == []  # ipybox sends no log messages (logging is deprecated in 2026-07-28)


async def test_a_request_carrying_trace_context_is_served(served: WorkspaceMCP) -> None:
    meta = _meta({"traceparent": TRACEPARENT, "tracestate": "vendor=1", "baggage": "k=v"})
    async with mcp.Client(served.server) as client:
        listed = await client.list_tools(meta=meta)
        found = await client.call_tool("search_tools", {"query": "greet someone"}, meta=meta)
    assert "execute_ipython_cell" in [tool.name for tool in listed.tools]
    assert not found.is_error, text(found)


# With a tracer provider installed, create_server keeps mcp's span per message. The OpenTelemetry SDK is
# not installed here, so the provider records spans with the API alone; a process of its own, since a
# provider can be installed once per process.
_TRACED = """
import asyncio, json, random, sys
from contextlib import contextmanager
from pathlib import Path

import mcp
from opentelemetry import trace

spans = []


class Tracer(trace.Tracer):
    def start_span(self, name, context=None, kind=trace.SpanKind.INTERNAL, *args, **kwargs):
        parent = trace.get_current_span(context).get_span_context()
        trace_id = parent.trace_id if parent.is_valid else random.getrandbits(128)
        own = trace.SpanContext(trace_id, random.getrandbits(64), False, trace.TraceFlags(1))
        spans.append({"name": name, "kind": kind.name, "trace": f"{trace_id:032x}",
                      "parent": f"{parent.span_id:016x}" if parent.is_valid else None})
        return trace.NonRecordingSpan(own)

    @contextmanager
    def start_as_current_span(self, name, context=None, kind=trace.SpanKind.INTERNAL, *args, **kwargs):
        with trace.use_span(self.start_span(name, context, kind), end_on_exit=True) as span:
            yield span


class Provider(trace.TracerProvider):
    def get_tracer(self, *args, **kwargs):
        return Tracer()


trace.set_tracer_provider(Provider())
from ipybox.mcp_server.workspace_mcp import create_server


async def main():
    async with create_server(Path(sys.argv[1])) as served, mcp.Client(served.server) as client:
        await client.list_tools(meta={"traceparent": sys.argv[2]})
    print(json.dumps(spans))


asyncio.run(main())
"""


async def test_with_tracing_on_a_requests_server_span_is_a_child_of_its_traceparent(workspace: Path) -> None:
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _TRACED, str(workspace), TRACEPARENT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    spans = json.loads(ran.stdout.splitlines()[-1])
    listed = [span for span in spans if span["name"] == "tools/list"]
    _, trace_id, parent_id, _ = TRACEPARENT.split("-")
    assert listed == [{"name": "tools/list", "kind": "SERVER", "trace": trace_id, "parent": parent_id}]


def _meta(entries: dict[str, str]) -> types.RequestParamsMeta:
    """`_meta` with keys of the spec's that the SDK's type does not name (it is an open map)."""
    return cast(types.RequestParamsMeta, entries)


async def next_event(listening: Subscription, timeout: float = 10) -> object:
    async def first() -> object:
        async for event in listening:
            return event
        raise AssertionError("the subscription ended without an event")

    return await asyncio.wait_for(first(), timeout)


# -- saving and describing in a running workspace ----------------------------------------------------------

GREET_API = """\
from pydantic import BaseModel

from . import impl


class Params(BaseModel):
    name: str


def run(params: Params) -> str:
    \"\"\"Greet someone.\"\"\"
    return impl.greet(params.name)
"""
GREET_IMPL = "def greet(name):\n    return 'hello ' + name\n"
LATER_API = '"""Needs a server registered later."""\nfrom mcptools.later import hello\n\n\ndef run() -> str:\n    """Say hello."""\n    return hello()\n'


@pytest.fixture(scope="module")
async def running(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[WorkspaceMCP]:
    workspace = make_workspace(tmp_path_factory.mktemp("revision-running"), "revision-running")
    supervisor = Supervisor(workspace)
    await supervisor.start()
    try:
        async with create_server(workspace) as served:
            yield served
    finally:
        await supervisor.stop()


@integration
async def test_a_listening_client_is_told_when_any_client_saves_a_code_action(running: WorkspaceMCP) -> None:
    messages: list[IncomingMessage] = []

    async def on_message(message: IncomingMessage) -> None:
        messages.append(message)

    async with (
        mcp.Client(running.server) as modern,
        mcp.Client(running.server, mode="legacy", message_handler=on_message) as legacy,
        modern.listen(tools_list_changed=True) as listening,
    ):
        assert "greet__hello" not in [tool.name for tool in (await modern.list_tools()).tools]
        # A handshake-era client saves: it is told on its request's stream, and the listener too.
        action = {"category": "greet", "name": "hello", "api": GREET_API, "impl": GREET_IMPL}
        saved = await legacy.call_tool("save_code_action", action)
        assert not saved.is_error, text(saved)
        assert any(isinstance(m, types.ToolListChangedNotification) for m in messages)
        assert await next_event(listening) == ToolsListChanged()
        assert "greet__hello" in [tool.name for tool in (await modern.list_tools()).tools]
        # A 2026-07-28 client saves: the listener is told again.
        saved = await modern.call_tool("save_code_action", {**action, "name": "again"})
        assert not saved.is_error, text(saved)
        assert await next_event(listening) == ToolsListChanged()
        assert "greet__again" in [tool.name for tool in (await modern.list_tools()).tools]


@integration
async def test_an_action_that_imports_a_server_registered_later_is_listed_and_announced_then(
    running: WorkspaceMCP,
) -> None:
    assert isinstance(running.server, WorkspaceMCPServer) and running.server.code_actions is not None
    actions = running.server.code_actions
    workspace = actions.workspace
    # Written by hand (no manifest): described in the background, where it does not import yet.
    package = workspace / "gentools" / "later" / "hello"
    package.mkdir(parents=True)
    (package / "api.py").write_text(LATER_API)
    (package / "impl.py").write_text("")
    async with mcp.Client(running.server) as client, client.listen(tools_list_changed=True) as listening:
        assert "later__hello" not in [tool.name for tool in (await client.list_tools()).tools]
        assert actions._describing is not None
        await actions._describing
        assert "later__hello" not in [tool.name for tool in (await client.list_tools()).tools]
        # The registration generates the package the action imports (here by hand) and asks for it again.
        (workspace / "mcptools" / "later").mkdir(parents=True)
        (workspace / "mcptools" / "later" / "__init__.py").write_text("def hello():\n    return 'hi'\n")
        await actions.describe_failed_again()
        assert await next_event(listening) == ToolsListChanged()
        assert "later__hello" in [tool.name for tool in (await client.list_tools()).tools]


@integration
async def test_ipybox_mcp_over_stdio_answers_discover_to_a_2026_07_28_client(tmp_path: Path) -> None:
    params = StdioServerParameters(command=str(IPYBOX), args=["mcp", "--workspace", str(tmp_path)])
    async with mcp.Client(params, mode=MODERN) as client:  # pinned: no probe, so ask it
        found = types.DiscoverResult.model_validate(await client.session.send_discover(MODERN))
        listed = await client.list_tools()
    assert found.supported_versions == [MODERN]
    assert found.meta is not None
    assert found.meta["io.modelcontextprotocol/serverInfo"] == {"name": "ipybox", "version": __version__}
    # What the workspace will be (no ipybox.toml, no --sandbox: unsandboxed), told before anything is written.
    assert found.instructions == render_instructions(facts_of(planned_config(tmp_path, False, None)))
    assert "Kernels are not sandboxed" in found.instructions
    assert list(tmp_path.iterdir()) == []
    assert found.capabilities.tools is not None and found.capabilities.tools.list_changed is True
    assert found.capabilities.prompts is None and found.capabilities.resources is not None  # the App view
    assert (found.ttl_ms, found.cache_scope) == (3_600_000, "public")
    assert listed.tools[0].name == "execute_ipython_cell"
