"""Edits of `ipybox.toml` while the workspace runs and an application is attached: new tools importable
in the running kernel, rules swapped at once, a broken file reported while the last good one keeps
running."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor
from ipybox.supervisor import Supervisor
from tests.supervisor.workspaces import edge_server, make_workspace

pytestmark = pytest.mark.integration

TAG = "supervisor-live"


@pytest.fixture(scope="module")
async def live(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Supervisor, CodeExecutor]]:
    workspace = make_workspace(tmp_path_factory.mktemp("live"), TAG)
    supervisor = Supervisor(workspace)
    await supervisor.start()
    try:
        async with CodeExecutor(workspace=workspace) as executor:
            yield supervisor, executor
    finally:
        await supervisor.stop()


async def eventually(check: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def edit(workspace: Path, old: str, new: str) -> None:
    path = workspace / "ipybox.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


async def test_an_added_server_is_importable_in_the_running_kernel(
    live: tuple[Supervisor, CodeExecutor],
) -> None:
    supervisor, executor = live
    await executor.execute("import mcptools.edge")
    with (supervisor.workspace / "ipybox.toml").open("a") as file:
        file.write("\n" + edge_server(TAG, name="second"))

    async def importable() -> bool:
        code = "try:\n from mcptools.second import echo\n print('yes')\nexcept ImportError:\n print('no')"
        return (await executor.execute(code)).text == "yes"

    await eventually(importable)
    # The new server's calls follow the rules like any other: "echo-ok" names server "edge" only.
    code = "from mcptools.second import add\nprint(add.run(add.Params(a=1, b=2)).total)"
    asked, text = [], None
    async for item in executor.stream(code):
        if isinstance(item, ApprovalRequest):
            asked.append((item.server_name, item.tool_name))
            await item.accept()  # the default, "ask", is answered here
        elif isinstance(item, CodeExecutionResult):
            text = item.text
    assert asked == [("second", "add")] and text == "3"


async def test_a_rule_change_applies_at_once(live: tuple[Supervisor, CodeExecutor]) -> None:
    supervisor, executor = live
    echo = (
        "from mcptools.edge import echo\nfrom ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
        "try:\n print(echo.run(echo.Params(text='hi')))\nexcept ApprovalRejectedError as e:\n print(e)"
    )
    assert (await executor.execute(echo)).text == "hi"
    edit(
        supervisor.workspace,
        'id = "echo-ok"\nserver = "edge"\ntool = ["echo", "add"]\ndecision = "allow"',
        'id = "echo-ok"\nserver = "edge"\ntool = ["echo", "add"]\ndecision = "deny"',
    )

    async def denied() -> bool:
        return (await executor.execute(echo)).text == "edge.echo was rejected: denied by rule 'echo-ok'"

    await eventually(denied, timeout=10)


async def test_a_broken_file_keeps_the_last_good_configuration(live: tuple[Supervisor, CodeExecutor]) -> None:
    supervisor, executor = live
    path = supervisor.workspace / "ipybox.toml"
    good = path.read_text()
    path.write_text(good + "\n[kernel.oops\n")

    async def reported() -> bool:
        error = supervisor.status().config_error
        return error is not None and f"{path}:" in error

    await eventually(reported, timeout=10)
    assert (await executor.execute("print(1 + 1)")).text == "2"
    assert "edge" in supervisor.status().reconciler.servers
    path.write_text(good)

    async def cleared() -> bool:
        return supervisor.status().config_error is None

    await eventually(cleared, timeout=10)


async def test_a_kernel_env_change_recycles_kernels(live: tuple[Supervisor, CodeExecutor]) -> None:
    supervisor, attached = live
    generation = supervisor.kernel_generation
    edit(supervisor.workspace, "env = {", 'env = { ADDED_BY_EDIT = "yes",')

    async def recycled() -> bool:
        return supervisor.kernel_generation > generation

    await eventually(recycled)
    assert "kernel.env changed: ADDED_BY_EDIT added: recycling kernels" in supervisor.paths.log.read_text()
    code = "import os\nprint(os.environ.get('ADDED_BY_EDIT'))"
    async with CodeExecutor(workspace=supervisor.workspace) as fresh:
        assert (await fresh.execute(code)).text == "yes"
    # The application attached before keeps its lease: its kernel died while idle, so it continues on a
    # fresh one with the new environment, and its output starts with a notice that the state is lost.
    notice = (
        "[ipybox] this session's kernel was replaced by a fresh one, so all its state is lost: ipybox "
        "restarted it to apply a change (kernel.env changed: ADDED_BY_EDIT added)"
    )
    assert (await attached.execute(code)).text == f"{notice}\nyes"
    assert (await attached.execute(code)).text == "yes"  # told once
