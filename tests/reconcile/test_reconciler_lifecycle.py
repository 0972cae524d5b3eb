"""The reconciler as a `Service`: what it refuses before it is started, what it still does, and that its
status is the typed model the supervisor serves. No MCP server is started here (configurations without
servers): unit tests of the lifecycle, with the real file watcher."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ipybox.lifecycle import ServiceState
from ipybox.mcp_client.pool import MCPServers
from ipybox.reconcile.reconciler import Reconciler
from ipybox.reconcile.status import ReconcilerStatus
from ipybox.running.status import ReconcilerStatus as ServedReconcilerStatus
from tests.reconcile.test_reconciler import RecordingHooks, save


async def test_a_reconciler_that_is_not_started_refuses_to_apply_and_says_how_to_start_it(
    workspace: Path,
) -> None:
    save(workspace, '[approval]\ndefault = "deny"\n')
    hooks = RecordingHooks()
    reconciler = Reconciler(workspace, MCPServers(), hooks)
    config = reconciler.load()  # loading needs no background work
    with pytest.raises(RuntimeError, match=r"not started: start it first \(`async with reconciler:`\)"):
        await reconciler.apply(config)
    with pytest.raises(RuntimeError, match="not started"):
        await reconciler.reload()
    assert hooks.policies == [], "nothing was applied"
    async with reconciler:
        await reconciler.apply(config)
    assert [policy.default for policy in hooks.policies] == ["deny"]
    with pytest.raises(RuntimeError, match="the reconciler is closed: it applies nothing more"):
        await reconciler.apply(config)


async def test_reloading_rules_while_not_running_puts_the_rules_in_effect_only(workspace: Path) -> None:
    # An `always` answer that writes a rule while the workspace starts or stops: its rule counts at once.
    save(workspace, '[approval]\ndefault = "deny"\n')
    hooks = RecordingHooks()
    reconciler = Reconciler(workspace, MCPServers(), hooks)
    assert await reconciler.reload_rules()
    assert [policy.default for policy in hooks.policies] == ["deny"]
    assert reconciler.config is not None and reconciler.mcptools_dir is None, "no servers part was applied"
    assert reconciler.state is ServiceState.NEW


async def test_its_status_is_the_typed_model_the_control_endpoint_serves(workspace: Path) -> None:
    save(workspace, "")
    async with Reconciler(workspace, MCPServers(), RecordingHooks()) as reconciler:
        assert reconciler.status() == ReconcilerStatus()  # before a configuration was applied
        await reconciler.apply(reconciler.load())
        status = reconciler.status()
    assert ServedReconcilerStatus is ReconcilerStatus
    assert status.mcptools_dir == str(workspace.resolve() / "mcptools") and status.servers == {}
    assert ReconcilerStatus.model_validate_json(status.model_dump_json()) == status


async def test_watching_with_a_stop_event_ends_when_it_is_set_even_before_a_configuration_was_applied(
    workspace: Path,
) -> None:
    save(workspace, "")
    async with Reconciler(workspace, MCPServers(), RecordingHooks(), quiet_period=0.05) as reconciler:
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            watcher = group.create_task(reconciler.watch(stop))
            await asyncio.sleep(0.2)
            assert not watcher.done(), "it watches until told to stop"
            stop.set()
            await asyncio.wait_for(asyncio.shield(watcher), 10)
        assert reconciler.mcptools_dir is None
