"""The reconciler against real MCP servers: packages generated, regenerated and removed as `ipybox.toml`
is edited, servers started and stopped, hooks called, bad edits survived, bursts of saves applied once."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from ipybox.config import WorkspaceConfig
from ipybox.mcp_client.pool import MCPServers
from ipybox.reconcile.reconciler import Reconciler
from ipybox.reconcile.status import ReconcilerStatus
from ipybox.rules import ApprovalPolicy
from tests.servers import params
from tests.servers.processes import pids, tagged

pytestmark = pytest.mark.integration


class RecordingHooks:
    """Records what the reconciler asked for."""

    def __init__(self) -> None:
        self.policies: list[ApprovalPolicy] = []
        self.kernel_changes: list[tuple[WorkspaceConfig, list[str]]] = []
        self.provenance: list[object] = []
        self.network_changes: list[tuple[WorkspaceConfig, list[str]]] = []

    async def rules_changed(self, policy: ApprovalPolicy) -> None:
        self.policies.append(policy)

    async def provenance_changed(self, settings: object) -> None:
        self.provenance.append(settings)

    async def kernels_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        self.kernel_changes.append((config, reasons))

    async def network_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        self.network_changes.append((config, reasons))


def save(workspace: Path, text: str, name: str = "ipybox.toml") -> None:
    """Save as editors do: a new file renamed over the old one."""
    temp = workspace / f".{name}.swp"
    temp.write_text(text)
    os.replace(temp, workspace / name)


def config_text(servers: dict[str, dict[str, Any]], extra: str = "") -> str:
    return extra + "\n" + tomlkit.dumps({"servers": servers})


def edge(tag: str, *args: str) -> dict[str, Any]:
    return tagged(params.edge(*args), tag)


def new_tag() -> str:
    return f"reconcile-{uuid.uuid4().hex[:8]}"


def generations(workspace: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((workspace / "mcptools" / ".ipybox-generation").read_text())
    return data


async def eventually(predicate: Callable[[], bool], timeout: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def servers(workspace: Path) -> AsyncIterator[MCPServers]:
    servers = MCPServers(dotenv_path=workspace / ".env")
    yield servers
    await servers.stop()


@pytest.fixture
def hooks() -> RecordingHooks:
    return RecordingHooks()


@pytest.fixture
async def reconciler(
    workspace: Path, servers: MCPServers, hooks: RecordingHooks
) -> AsyncIterator[Reconciler]:
    async with Reconciler(workspace, servers, hooks) as reconciler:
        yield reconciler


@pytest.fixture
async def watching(
    reconciler: Reconciler, workspace: Path, hooks: RecordingHooks
) -> AsyncIterator[Reconciler]:
    """The reconciler following edits, known to be watching: a probe edit was applied."""
    await start(reconciler, workspace, "")
    task = asyncio.create_task(reconciler.watch())
    for attempt in range(50):
        save(workspace, f'[kernel.env]\nPROBE = "{attempt}"\n')
        await asyncio.sleep(0.2)
        if hooks.kernel_changes:
            break
    else:
        raise AssertionError("the reconciler did not pick up an edit")
    await asyncio.sleep(0.5)  # let the probe's burst settle
    hooks.kernel_changes.clear()
    hooks.policies.clear()
    yield reconciler
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def start(reconciler: Reconciler, workspace: Path, text: str) -> None:
    save(workspace, text)
    await reconciler.apply(reconciler.load())
    await reconciler.checked()  # output parsers are imported in the background


async def test_start_up_generates_packages_and_applies_rules(
    reconciler: Reconciler, workspace: Path, hooks: RecordingHooks
) -> None:
    tag = new_tag()
    await start(reconciler, workspace, config_text({"a": edge(tag)}, '[approval]\ndefault = "deny"\n'))

    assert (workspace / "mcptools" / "a" / "echo.py").is_file()
    assert generations(workspace) == {"generation": 1, "servers": {"a": 1}}
    status = reconciler.status()
    assert status.servers["a"].state == "ready" and (status.servers["a"].tools or 0) > 10
    assert status.generation == 1 and status.error is None
    assert ReconcilerStatus.model_validate_json(status.model_dump_json()) == status
    assert [policy.default for policy in hooks.policies] == ["deny"]
    assert hooks.kernel_changes == []
    assert pids(tag), "the server keeps running for calls"


def _check_packages(mcptools: Path, expected_files: set[str], seen: list[str], errors: list[str]) -> None:
    """Every package visible under `mcptools` is complete: all of its files, each one compiling."""
    for entry in os.listdir(mcptools):
        if entry.startswith("."):
            continue  # staging and retired directories: not importable names
        try:
            fd = os.open(mcptools / entry, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue  # swapped out between listing and opening
        try:
            files = set(os.listdir(fd)) - {"__pycache__"}
            sources = {}
            for name in files:
                with open(name, "rb", opener=lambda path, flags, fd=fd: os.open(path, flags, dir_fd=fd)) as f:
                    sources[name] = f.read()
            try:
                live = os.stat(mcptools / entry).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                live = False
            if not live:
                continue  # read from a retired copy being deleted: says nothing about what importers see
            seen.append(entry)
            if files != expected_files:
                errors.append(f"{entry}: files {sorted(files ^ expected_files)} missing or extra")
            for name, source in sources.items():
                try:
                    compile(source, f"{entry}/{name}", "exec")
                except SyntaxError as e:
                    errors.append(f"{entry}/{name}: {e}")
        except FileNotFoundError:
            continue  # the directory was retired and deleted while read
        finally:
            os.close(fd)


async def test_added_and_changed_servers_never_show_a_half_written_package(
    reconciler: Reconciler, workspace: Path
) -> None:
    tag = new_tag()
    await start(reconciler, workspace, config_text({"a": edge(tag)}))
    mcptools = workspace / "mcptools"
    expected_files = set(os.listdir(mcptools / "a")) - {"__pycache__"}
    seen: list[str] = []
    errors: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            _check_packages(mcptools, expected_files, seen, errors)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for round_ in range(3):
            servers = {name: edge(tag, f"--port={8000 + round_}") for name in ("a", "b", "c")}
            save(workspace, config_text(servers))
            assert await reconciler.reload()
    finally:
        stop.set()
        poller.join()

    assert errors == []
    assert {"a", "b", "c"} <= set(seen) and len(seen) > 20
    assert generations(workspace)["generation"] == 1 + 3 * 3
    assert {
        name for name in os.listdir(mcptools) if name.startswith(".") and name != ".ipybox-generation"
    } == set()


async def test_changed_args_regenerate_the_package_and_stop_the_old_server(
    reconciler: Reconciler, workspace: Path
) -> None:
    old, new = new_tag(), new_tag()
    await start(reconciler, workspace, config_text({"a": edge(old), "b": edge(old)}))
    package = workspace / "mcptools" / "a"
    inode = package.stat().st_ino
    before = generations(workspace)["servers"]
    assert pids(old)

    save(workspace, config_text({"a": edge(new, "--port=8001"), "b": edge(old)}))
    assert await reconciler.reload()

    assert package.stat().st_ino != inode
    assert generations(workspace) == {"generation": 3, "servers": {"a": 3, "b": before["b"]}}
    assert len(pids(new)) == 1
    await eventually(lambda: len(pids(old)) == 1, what="the old server of 'a' to exit ('b' keeps running)")


@pytest.mark.parametrize("how", ["deleted", "disabled"])
async def test_removed_or_disabled_server_is_stopped_and_its_package_removed(
    reconciler: Reconciler, workspace: Path, how: str
) -> None:
    gone, kept = new_tag(), new_tag()
    await start(reconciler, workspace, config_text({"a": edge(gone), "b": edge(kept)}))
    assert (workspace / "mcptools" / "a").is_dir() and pids(gone)
    before = generations(workspace)["servers"]

    servers = {"b": edge(kept)}
    if how == "disabled":
        servers["a"] = {**edge(gone), "enabled": False}
    save(workspace, config_text(servers))
    assert await reconciler.reload()

    assert not (workspace / "mcptools" / "a").exists()
    assert (workspace / "mcptools" / "b").is_dir()
    assert generations(workspace) == {"generation": 3, "servers": {"b": before["b"]}}
    assert list(reconciler.status().servers) == ["b"]
    assert "a" not in reconciler.servers.names
    await eventually(lambda: not pids(gone), what="the removed server to exit")
    assert pids(kept)
    assert [name for name in os.listdir(workspace / "mcptools") if name.startswith(".a.")] == []


async def test_invalid_edits_keep_the_last_good_configuration(
    reconciler: Reconciler, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tag = new_tag()
    good = config_text({"a": edge(tag)})
    await start(reconciler, workspace, good)
    last_good = reconciler.config

    caplog.set_level(logging.ERROR, logger="ipybox.reconcile.reconciler")
    save(workspace, good.replace("[servers.a]", "[servers.a"))
    assert not await reconciler.reload()
    assert reconciler.config is last_good
    assert reconciler.error is not None and reconciler.error.line is not None and reconciler.error.column
    place = f"ipybox.toml:{reconciler.error.line}:{reconciler.error.column}"
    assert place in str(reconciler.error) and place in caplog.text
    assert reconciler.status().error == str(reconciler.error)

    unknown_key = good.replace("command =", "comand =")
    save(workspace, unknown_key)
    assert not await reconciler.reload()
    assert reconciler.config is last_good
    line = (
        unknown_key.splitlines().index(next(li for li in unknown_key.splitlines() if li.startswith("comand")))
        + 1
    )
    assert (reconciler.error.line, reconciler.error.column) == (line, 1)
    assert "did you mean 'command'" in str(reconciler.error)

    assert pids(tag) and (workspace / "mcptools" / "a").is_dir()
    assert generations(workspace)["generation"] == 1

    save(workspace, good)
    assert await reconciler.reload()
    assert reconciler.error is None and reconciler.status().error is None
    assert generations(workspace)["generation"] == 1, "the same servers as before: nothing to regenerate"


async def test_an_invalid_edit_while_watching_is_reported_and_survived(
    watching: Reconciler, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    last_good = watching.config
    caplog.set_level(logging.ERROR, logger="ipybox.reconcile.reconciler")
    save(workspace, "[kernel]\nwarm_pool = -1\n")
    await eventually(lambda: watching.error is not None, what="the error")
    assert watching.config is last_good
    assert "ipybox.toml:2:1: kernel.warm_pool: Input should be greater than or equal to 0" in caplog.text

    save(workspace, "[kernel]\nwarm_pool = 2\n")
    await eventually(lambda: watching.error is None, what="the fixed file to load")
    assert watching.config is not None and watching.config.kernel.warm_pool == 2


async def test_a_burst_of_saves_is_applied_once_with_the_last_content(
    watching: Reconciler, workspace: Path, hooks: RecordingHooks
) -> None:
    for n in range(20):
        save(workspace, f'[kernel.env]\nN = "{n}"\n')
        await asyncio.sleep(0.015)  # 20 saves in about 300 ms

    await eventually(lambda: bool(hooks.kernel_changes), what="the edit to be applied")
    await asyncio.sleep(1.0)  # anything still buffered would have been applied by now
    assert len(hooks.kernel_changes) == 1
    config, reasons = hooks.kernel_changes[0]
    assert config.kernel.env == {"N": "19"}
    assert reasons == ["kernel.env changed: N added, PROBE removed"]


async def test_an_edit_saved_while_watching_generates_the_new_package(
    watching: Reconciler, workspace: Path
) -> None:
    tag = new_tag()
    started = time.perf_counter()
    save(workspace, config_text({"late": edge(tag)}))
    await eventually(lambda: (workspace / "mcptools" / "late" / "__init__.py").exists(), what="the package")
    latency = time.perf_counter() - started
    await eventually(lambda: "late" in watching.status().servers, what="the status")
    assert watching.status().servers["late"].state == "ready"
    print(f"save to package ready (edge server): {latency * 1000:.0f} ms")
    assert latency < 10


async def test_changed_rules_reach_the_rules_hook(
    reconciler: Reconciler, workspace: Path, hooks: RecordingHooks
) -> None:
    await start(reconciler, workspace, '[approval]\ndefault = "ask"\n')
    rule = '[[approval.rules]]\nid = "reads"\ntool = "read_*"\ndecision = "allow"\n'
    save(workspace, f'[approval]\ndefault = "deny"\n\n{rule}')
    assert await reconciler.reload()
    assert [policy.default for policy in hooks.policies] == ["ask", "deny"]
    assert [rule.id for rule in hooks.policies[-1].rules] == ["reads"]

    save(workspace, f'[approval]\ndefault = "deny"\n\n{rule}\n# only a comment\n')
    assert await reconciler.reload()
    assert len(hooks.policies) == 2, "an unchanged policy is not handed over again"
    assert hooks.kernel_changes == []


async def test_kernel_settings_reach_the_kernels_hook_with_reasons(
    reconciler: Reconciler, workspace: Path, hooks: RecordingHooks
) -> None:
    await start(reconciler, workspace, '[kernel.env]\nAPI_BASE = "http://localhost"\n')
    save(workspace, '[kernel]\nwarm_pool = 0\n[kernel.env]\nAPI_BASE = "http://example.com"\nDEBUG = "1"\n')
    assert await reconciler.reload()
    assert len(hooks.kernel_changes) == 1
    config, reasons = hooks.kernel_changes[0]
    assert config.kernel.warm_pool == 0
    assert reasons == ["kernel.env changed: DEBUG added, API_BASE changed", "kernel.warm_pool: 1 -> 0"]

    save(
        workspace,
        '[kernel]\nwarm_pool = 0\ntimeout = 5\n[kernel.env]\nAPI_BASE = "http://example.com"\nDEBUG = "1"\n',
    )
    assert await reconciler.reload()
    assert len(hooks.kernel_changes) == 1, "the timeout applies without replacing kernels"
    assert reconciler.config is not None and reconciler.config.kernel.timeout == 5


async def test_a_changed_secret_in_dotenv_restarts_the_servers_and_kernels_using_it(
    reconciler: Reconciler, workspace: Path, hooks: RecordingHooks
) -> None:
    user, other = new_tag(), new_tag()
    save(workspace, "SECRET=one\n", name=".env")
    server = {**edge(user), "env": {**edge(user)["env"], "EDGE_SECRET": "${SECRET}"}}
    await start(
        reconciler,
        workspace,
        config_text({"user": server, "other": edge(other)}, '[kernel.env]\nS = "${SECRET}"\n'),
    )
    old_pids = pids(user)
    before = generations(workspace)["servers"]

    save(workspace, "SECRET=two\n", name=".env")
    assert await reconciler.reload()

    assert generations(workspace)["servers"] == {"other": before["other"], "user": 3}
    await eventually(lambda: bool(pids(user)) and set(pids(user)).isdisjoint(old_pids), what="the restart")
    assert len(pids(other)) == 1
    [(_, reasons)] = hooks.kernel_changes
    assert reasons == ["kernel.env: a ${VAR} now has another value (in .env or the environment)"]
    connection = reconciler.servers.started("user")
    assert connection is not None
    result = await reconciler.servers.call("user", "getenv", {"name": "EDGE_SECRET"})
    assert result.content[0].text == "two"  # type: ignore[union-attr]


async def test_a_failing_server_does_not_hold_back_the_others(
    reconciler: Reconciler, workspace: Path
) -> None:
    tag = new_tag()
    servers = {
        "good": edge(tag),
        "exits": edge(tag, "--exit-at-once"),
        "missing": {"command": str(workspace / "no-such-server")},
        "unset": {**edge(tag), "env": {"X": "${NOT_SET_ANYWHERE_42}"}},
    }
    await start(reconciler, workspace, config_text(servers))

    status = reconciler.status().servers
    assert status["good"].state == "ready"
    for name in ("exits", "missing", "unset"):
        assert status[name].state == "failed" and status[name].error, name
        assert status[name].tools is None and not (workspace / "mcptools" / name).exists()
    assert "NOT_SET_ANYWHERE_42" in (status["unset"].error or "")
    assert generations(workspace)["servers"] == {"good": 1}

    # Failed servers are tried again on the next apply, even when their parameters did not change.
    save(workspace, config_text({**servers, "exits": edge(tag)}) + "\n# fixed\n")
    assert await reconciler.reload()
    status = reconciler.status().servers
    assert status["exits"].state == "ready" and status["missing"].state == "failed"
    assert generations(workspace)["servers"] == {"exits": 2, "good": 1}


async def test_start_up_removes_packages_of_servers_removed_while_not_running(
    reconciler: Reconciler, workspace: Path
) -> None:
    mcptools = workspace / "mcptools"
    (mcptools / "old").mkdir(parents=True)
    (mcptools / "old" / "__init__.py").write_text("")
    (mcptools / "handmade").mkdir()
    (mcptools / "handmade" / "__init__.py").write_text("")
    (mcptools / ".ipybox-generation").write_text('{"generation": 5, "servers": {"old": 4, "a": 5}}')

    await start(reconciler, workspace, config_text({"a": edge(new_tag())}))

    assert not (mcptools / "old").exists()
    assert (mcptools / "handmade").is_dir(), "packages the reconciler did not generate are left alone"
    assert generations(workspace) == {"generation": 7, "servers": {"a": 7}}


async def test_saving_again_unchanged_retries_a_failed_server(
    watching: Reconciler, workspace: Path, hooks: RecordingHooks
) -> None:
    script = workspace / "late-server"
    text = config_text({"late": tagged({"command": str(script)}, new_tag())})
    save(workspace, text)
    await eventually(
        lambda: "late" in watching.status().servers and watching.status().servers["late"].state == "failed",
        what="failure",
    )

    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{params.EDGE_SERVER}" "$@"\n')
    script.chmod(0o755)
    save(workspace, text)  # the same contents, saved again
    await eventually(lambda: watching.status().servers["late"].state == "ready", what="the retry")
    assert (workspace / "mcptools" / "late" / "echo.py").is_file()


class FailingHooks(RecordingHooks):
    async def rules_changed(self, policy: ApprovalPolicy) -> None:
        raise RuntimeError("rule engine unavailable")


async def test_a_failing_hook_is_reported_and_does_not_stop_the_apply(
    workspace: Path, servers: MCPServers
) -> None:
    async with Reconciler(workspace, servers, FailingHooks()) as reconciler:
        await start(reconciler, workspace, config_text({"a": edge(new_tag())}))
        status = reconciler.status()
    assert status.hook_errors == {"rules_changed": "RuntimeError: rule engine unavailable"}
    assert status.servers["a"].state == "ready"
