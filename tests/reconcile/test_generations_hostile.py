"""The generation marker and package retirement from the attacker's side: a kernel that could write in
`mcptools/` crafted the marker, or replaced the directory by a symlink, before the next `ipybox up`
(issue 12, class 7). The reconciler is the real one; the workspace has no servers, so nothing starts."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox.config import WorkspaceConfig
from ipybox.mcp_client.pool import MCPServers
from ipybox.reconcile.generations import Generations, delete_retired, retire_package
from ipybox.reconcile.reconciler import Reconciler
from ipybox.rules import ApprovalPolicy


class NoHooks:
    async def rules_changed(self, policy: ApprovalPolicy) -> None:
        pass

    async def provenance_changed(self, settings: object) -> None:
        pass

    async def kernels_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        pass

    async def network_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        pass


@pytest.fixture
async def reconciler(workspace: Path) -> AsyncIterator[Reconciler]:
    servers = MCPServers(dotenv_path=workspace / ".env")
    async with Reconciler(workspace, servers, NoHooks()) as reconciler:
        yield reconciler
    await servers.stop()


async def up(reconciler: Reconciler, workspace: Path) -> None:
    """What `ipybox up` does with the marker: the first apply retires packages of servers gone since."""
    (workspace / "ipybox.toml").write_text("")
    await reconciler.apply(reconciler.load())


def plant_marker(mcptools: Path, servers: dict[str, int]) -> None:
    (mcptools / ".ipybox-generation").write_text(json.dumps({"generation": 9, "servers": servers}))


async def test_a_crafted_marker_cannot_move_the_parents_dotenv_into_the_workspace(
    reconciler: Reconciler, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    parent_env = workspace.parent / ".env"
    parent_env.write_text("PARENT_SECRET=1\n")
    mcptools = workspace / "mcptools"
    (mcptools / "...").mkdir(parents=True)  # makes `.../../x` resolve inside mcptools
    plant_marker(mcptools, {"../../.env": 1, "../.env": 2, "..": 3, "/etc": 4, "x/../../..": 5})

    with caplog.at_level(logging.WARNING, logger="ipybox"):
        await up(reconciler, workspace)

    assert parent_env.read_text() == "PARENT_SECRET=1\n"
    assert not (workspace / ".env").exists(), "the parent's .env was moved into the workspace"
    assert sorted(p.name for p in workspace.parent.iterdir()) == [".env", workspace.name]
    assert "../../.env" in caplog.text and "ignored" in caplog.text
    assert Generations.read(mcptools).servers == {}


async def test_retiring_through_a_mcptools_dir_replaced_by_a_symlink_is_refused(
    reconciler: Reconciler, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    victim = workspace.parent / "victim"
    (victim / "old").mkdir(parents=True)
    (victim / "old" / "precious.txt").write_text("keep me\n")
    plant_marker(victim, {"old": 1})
    (workspace / "mcptools").symlink_to(victim)

    with caplog.at_level(logging.WARNING, logger="ipybox"):
        await up(reconciler, workspace)

    assert (victim / "old" / "precious.txt").read_text() == "keep me\n"
    assert sorted(p.name for p in victim.iterdir()) == [".ipybox-generation", "old"]
    assert "symlink" in caplog.text


def test_marker_names_that_are_not_package_names_are_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plant_marker(tmp_path, {"time": 3, "../x": 4, "a/b": 5, "class": 6, "ünï": 7, ".hidden": 8, "": 9})
    with caplog.at_level(logging.WARNING, logger="ipybox"):
        generations = Generations.read(tmp_path)
    assert generations.servers == {"time": 3}
    assert generations.generation == 9
    for name in ("../x", "a/b", "class", "ünï", ".hidden"):
        assert repr(name) in caplog.text


def test_a_marker_replaced_by_a_symlink_is_not_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"generation": 3, "servers": {"time": 3}}))
    mcptools = tmp_path / "mcptools"
    mcptools.mkdir()
    (mcptools / ".ipybox-generation").symlink_to(elsewhere)
    assert Generations.read(mcptools) == Generations()


def test_retiring_a_name_that_is_no_package_name_is_refused_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mcptools = tmp_path / "ws" / "mcptools"
    (mcptools / "...").mkdir(parents=True)
    (tmp_path / "ws" / ".env").write_text("SECRET=1\n")
    with caplog.at_level(logging.WARNING, logger="ipybox"):
        assert retire_package(mcptools, "../.env") is None
    assert (tmp_path / "ws" / ".env").read_text() == "SECRET=1\n"
    assert sorted(p.name for p in mcptools.iterdir()) == ["..."]
    assert "'../.env'" in caplog.text


def test_deleting_refuses_what_retire_package_did_not_make(tmp_path: Path) -> None:
    mcptools = tmp_path / "mcptools"
    (mcptools / "time").mkdir(parents=True)
    (mcptools / "time" / "__init__.py").write_text("")
    with pytest.raises(ValueError, match="retired"):
        delete_retired(mcptools / "time")
    with pytest.raises(ValueError, match="retired"):
        delete_retired(tmp_path)
    assert (mcptools / "time" / "__init__.py").exists()

    retired = retire_package(mcptools, "time")
    assert retired is not None and retired.parent == mcptools
    delete_retired(retired)
    assert list(mcptools.iterdir()) == []
