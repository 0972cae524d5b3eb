"""Fixtures shared by the whole suite. Expensive ones (gateways, executors, generated packages) are shared
per session."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ipybox import CodeExecutor, generate_mcp_sources
from tests.pip_installed import Installed, build_wheel, install
from tests.remote.eg import EnterpriseGateway
from tests.servers import params
from tests.servers.processes import tagged

# Registrations made by generate_mcp_sources during the tests go to a private state dir, not the user's,
# removed when the run ends.
_STATE_HOME = tempfile.TemporaryDirectory(prefix="ipybox-test-state-", ignore_cleanup_errors=True)
os.environ["XDG_STATE_HOME"] = _STATE_HOME.name


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--docker",
        action="store_true",
        help="also run the tests marked docker (they need the image scripts/test-docker builds)",
    )


# A module's expected time, to hand out the longest first (`_longest_modules_first`): a `slow` test's
# `seconds=` (its typical time in a CI run, when it is far from the marker's "half a minute or more"), a
# test that starts processes a few seconds, a pure one next to nothing. Rough on purpose: the order only
# has to put the few long modules ahead of the many short ones.
SLOW_SECONDS = 30.0
INTEGRATION_SECONDS = 3.0
PURE_SECONDS = 0.02


def _expected_seconds(item: pytest.Item) -> float:
    slow = item.get_closest_marker("slow")
    if slow is not None:
        return float(slow.kwargs.get("seconds", SLOW_SECONDS))
    return INTEGRATION_SECONDS if item.get_closest_marker("integration") is not None else PURE_SECONDS


def _longest_modules_first(items: list[pytest.Item]) -> None:
    """Modules in order of their expected time, longest first; a module's tests keep their own order.

    The parallel run (scripts/test) gives each worker a whole module at a time, in this order (with
    `--no-loadscope-reorder`: pytest-xdist otherwise reorders modules by their number of tests, which put
    the few-test, several-minute modules, the unprivileged rerun and the recovery tests, last, and the run
    ended with one worker busy on them and two idle). Longest first leaves the short modules to fill in.
    """
    totals: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        totals[module] = totals.get(module, 0.0) + _expected_seconds(item)
    items.sort(key=lambda item: -totals[item.nodeid.split("::", 1)[0]])  # stable: modules stay whole


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_modules_first(items)
    # The container image is built by hand (scripts/test-docker, which runs these with --docker): without
    # it they are deselected, neither run nor counted as skipped.
    if config.getoption("--docker"):
        return
    deselected = [item for item in items if item.get_closest_marker("docker") is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker("docker") is None]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    # Which test runs now, so that a server helper can tell a fast test from an integration one.
    params.running = item
    try:
        return (yield)
    finally:
        params.running = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # The hostile-text tests make ipybox log lone surrogates on purpose; pytest-xdist sends each report
    # (with its captured output) to the controller as UTF-8, and a worker whose report can't be encoded
    # crashes. Shown escaped instead, as ipybox itself shows them.
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8")) for title, text in report.sections
    ]


@pytest.fixture(scope="session")
async def executor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[CodeExecutor]:
    """One executor for the tests that only need a working kernel (they must not rely on a fresh state)."""
    workspace = tmp_path_factory.mktemp("workspace")
    async with CodeExecutor(
        working_dir=workspace,
        images_dir=workspace / "images",
        output_dir=workspace / "outputs",
        kernel_env={"IPYBOX_TEST_VAR": "test-value"},
    ) as ex:
        yield ex


@pytest.fixture
def workspace(executor: CodeExecutor) -> Path:
    return executor.working_dir


@pytest.fixture(scope="session")
def tools_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with files for the filesystem server and a git repository for the git server."""
    workspace = tmp_path_factory.mktemp("tools-workspace")
    (workspace / "data").mkdir()
    (workspace / "data" / "notes.txt").write_text("hello from the filesystem\n")
    (workspace / ".env").write_text("SECRET_TOKEN=never-in-the-kernel\n")
    repo = workspace / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "README.md").write_text("# repo\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "initial"], check=True)
    return workspace


@pytest.fixture(scope="session")
def tool_servers(tools_workspace: Path) -> dict[str, dict[str, Any]]:
    """Real MCP servers by the names the generated packages use."""
    return {
        "everything": tagged(params.everything(), "facade-everything"),
        "filesystem": params.filesystem(tools_workspace / "data"),
        "time": params.time_server(),
        "git": params.git(tools_workspace / "repo"),
        # `${SECRET_TOKEN}` comes from the workspace's `.env`: resolved for the server, never in the kernel.
        "edge": {**params.edge(), "env": {"EDGE_SECRET": "${SECRET_TOKEN}"}},
    }


@pytest.fixture(scope="session")
async def mcptools(tools_workspace: Path, tool_servers: dict[str, dict[str, Any]]) -> Path:
    """Generated packages for the real servers, under `<tools_workspace>/mcptools`."""
    root = tools_workspace / "mcptools"
    for name, server_params in tool_servers.items():
        await generate_mcp_sources(name, server_params, root, dotenv_path=tools_workspace / ".env")
    return root


@pytest.fixture(scope="session")
async def tool_executor(
    tools_workspace: Path, mcptools: Path, tool_servers: dict[str, dict[str, Any]]
) -> AsyncIterator[CodeExecutor]:
    """An executor whose kernel can call the real servers through the generated API."""
    async with CodeExecutor(
        working_dir=tools_workspace, mcp_servers=tool_servers, approval_timeout=5, spare_kernel=False
    ) as ex:
        yield ex


@pytest.fixture(scope="session")
def ipybox_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout, once per run (tests/pip_installed.py)."""
    return build_wheel(tmp_path_factory)


@pytest.fixture(scope="session")
def pip_installed(tmp_path_factory: pytest.TempPathFactory, ipybox_wheel: Path) -> Installed:
    """That wheel and mcp-server-time pip-installed into a fresh venv outside the checkout, once per run,
    with a 0700 home of this session's own (tests/pip_installed.py says what tests may do with it)."""
    return install(tmp_path_factory, ipybox_wheel)


@pytest.fixture(scope="session")
def enterprise_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnterpriseGateway]:
    """A running Enterprise Gateway whose only kernelspec (`.kernel_name`, its default) runs kernels that
    cannot see the host's files and reach the host only over TCP."""
    gateway = EnterpriseGateway(tmp_path_factory.mktemp("enterprise-gateway"))
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="session")
def host_tcp_server() -> Iterator[int]:
    """A loopback TCP port on the host that answers `host secret`: what a kernel may or may not reach."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"host secret\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
