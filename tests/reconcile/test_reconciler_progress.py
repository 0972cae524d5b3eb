"""The reconciler's progress events against our real edge server: each server reports its steps in the
documented order (`connecting`, `listing tools`, `generating`, `checking parsers` only when it has
parsers, then `ready` with its tool count), a server that cannot start ends `failed` with the reason,
and concurrent servers' events interleave but stay in order per server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox.mcp_client.pool import MCPServers
from ipybox.progress import ProgressEvent
from ipybox.reconcile.reconciler import Reconciler
from tests.reconcile.test_reconciler import RecordingHooks, config_text, edge, new_tag, start
from tests.reconcile.test_reconciler_parsers import WORDS, python_check, write_parser

pytestmark = pytest.mark.integration


@pytest.fixture
async def servers(workspace: Path) -> AsyncIterator[MCPServers]:
    servers = MCPServers(dotenv_path=workspace / ".env")
    yield servers
    await servers.stop()


def steps(events: list[ProgressEvent], what: str) -> list[str]:
    return [event.step for event in events if event.what == what]


async def test_a_server_reports_its_steps_in_order_and_ends_ready_with_its_tool_count(
    workspace: Path, servers: MCPServers
) -> None:
    events: list[ProgressEvent] = []
    async with Reconciler(workspace, servers, RecordingHooks(), progress=events.append) as reconciler:
        await start(reconciler, workspace, config_text({"edge": edge(new_tag())}))

    assert steps(events, "server edge") == ["connecting", "listing tools", "generating", "ready"]
    last = events[-1]
    tools = reconciler.status().servers["edge"].tools
    assert last.done and not last.failed and last.detail == f"{tools} tools"
    assert last.elapsed_s is not None and last.elapsed_s >= 0
    assert all(not event.done for event in events[:-1])


async def test_a_server_with_parsers_reports_checking_them(workspace: Path, servers: MCPServers) -> None:
    write_parser(workspace, "edge", "echo", WORDS)
    events: list[ProgressEvent] = []
    async with Reconciler(
        workspace, servers, RecordingHooks(), run_check=python_check(workspace), progress=events.append
    ) as reconciler:
        await start(reconciler, workspace, config_text({"edge": edge(new_tag())}))

    assert steps(events, "server edge") == [
        "connecting",
        "listing tools",
        "generating",
        "checking parsers",
        "ready",
    ]
    checking = next(event for event in events if event.step == "checking parsers")
    assert checking.detail == "1 parser"


async def test_a_server_that_cannot_start_ends_failed_with_the_reason_and_the_others_go_on(
    workspace: Path, servers: MCPServers
) -> None:
    events: list[ProgressEvent] = []
    tag = new_tag()
    async with Reconciler(workspace, servers, RecordingHooks(), progress=events.append) as reconciler:
        await start(
            reconciler, workspace, config_text({"good": edge(tag), "bad": edge(tag, "--exit-at-once")})
        )

    assert steps(events, "server bad") == ["connecting", "failed"]
    failed = [event for event in events if event.what == "server bad"][-1]
    assert failed.done and failed.failed
    assert failed.detail == reconciler.status().servers["bad"].error
    assert steps(events, "server good") == ["connecting", "listing tools", "generating", "ready"]


async def test_a_listener_set_later_and_one_that_fails_do_not_change_what_is_applied(
    workspace: Path, servers: MCPServers
) -> None:
    reconciler = Reconciler(workspace, servers, RecordingHooks())
    seen: list[str] = []

    def broken(event: ProgressEvent) -> None:
        seen.append(event.step)
        raise RuntimeError("a listener's bug")

    reconciler.progress = broken
    async with reconciler:
        await start(reconciler, workspace, config_text({"edge": edge(new_tag())}))
    assert seen == ["connecting", "listing tools", "generating", "ready"]
    assert reconciler.status().servers["edge"].state == "ready"
