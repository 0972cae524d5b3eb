"""The README's approval flow in a fresh `CodeExecutor`: annotations recorded by `generate_mcp_sources` decide
a server's first call, before the server starts; registry entries without (valid) annotations still work."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor, generate_mcp_sources
from ipybox.mcp_apigen.sources import wait_for_stopped_servers
from ipybox.mcp_client.registry import ANNOTATIONS_KEY, ServerRegistry
from tests.servers import params
from tests.servers.processes import pids, tagged

pytestmark = pytest.mark.integration

FS_TAG, OLD_TAG, BAD_TAG = "recorded-fs", "recorded-old", "recorded-bad"


@pytest.fixture(scope="module")
async def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mcptools/` generated for three servers: `filesystem` as generation records it, `old` as earlier
    versions recorded it (parameters only), `bad` with malformed annotations."""
    workspace = tmp_path_factory.mktemp("recorded-annotations")
    (workspace / "data").mkdir()
    (workspace / "data" / "notes.txt").write_text("hello\n")
    root = workspace / "mcptools"
    servers = {
        "filesystem": tagged(params.filesystem(workspace / "data"), FS_TAG),
        "old": tagged(params.everything(), OLD_TAG),
        "bad": tagged(params.everything(), BAD_TAG),
    }
    for name, server_params in servers.items():
        await generate_mcp_sources(name, server_params, root)
    await wait_for_stopped_servers()
    registry = ServerRegistry()
    data = json.loads(registry.path.read_text())
    recorded = data[ANNOTATIONS_KEY][str(root.resolve())]
    del recorded["old"]
    recorded["bad"]["tools"]["echo"] = {"readOnlyHint": "true"}  # a hint must be a bool
    registry.path.write_text(json.dumps(data))
    return workspace


@pytest.fixture(scope="module")
async def executor(workspace: Path) -> AsyncIterator[CodeExecutor]:
    async with CodeExecutor(working_dir=workspace, approval_timeout=10, spare_kernel=False) as executor:
        yield executor


async def readme_decisions(
    executor: CodeExecutor, code: str, tag: str
) -> tuple[list[tuple[str, dict[str, Any], list[int]]], CodeExecutionResult]:
    """Run `code`, deciding as the README does; note each request's tool, annotations and the server's
    processes at the time of the decision."""
    asked: list[tuple[str, dict[str, Any], list[int]]] = []
    result: CodeExecutionResult | None = None
    async for item in executor.stream(code):
        match item:
            case ApprovalRequest():
                asked.append((item.tool_name, item.annotations, pids(tag)))
                await (item.accept() if item.annotations.get("readOnlyHint") else item.reject())
            case CodeExecutionResult():
                result = item
    assert result is not None
    return asked, result


async def test_the_first_calls_of_a_fresh_executor_are_decided_by_the_annotations_recorded_at_generation(
    executor: CodeExecutor, workspace: Path
) -> None:
    target = workspace / "data" / "written.txt"
    code = f"""
from ipybox.in_kernel.tool_runner import ApprovalRejectedError
from mcptools.filesystem import list_directory, write_file
try:
    write_file.run(write_file.Params(path={str(target)!r}, content="x"))
except ApprovalRejectedError:
    print("write rejected")
print(list_directory.run(list_directory.Params(path={str(workspace / "data")!r})).content)
"""
    asked, result = await readme_decisions(executor, code, FS_TAG)
    assert [(tool, hints.get("readOnlyHint"), hints.get("destructiveHint")) for tool, hints, _ in asked] == [
        ("write_file", False, True),
        ("list_directory", True, None),
    ]
    assert [running for _, _, running in asked] == [[], []]  # both decided before the server started
    assert result.text == "write rejected\n[FILE] notes.txt"
    assert not target.exists()


async def test_an_entry_recorded_without_annotations_still_runs_its_tools(executor: CodeExecutor) -> None:
    code = "from mcptools.old import echo\nprint(echo.run(echo.Params(message='old')))"
    asked: list[dict[str, Any]] = []
    result: CodeExecutionResult | None = None
    async for item in executor.stream(code):
        if isinstance(item, ApprovalRequest):
            asked.append(item.annotations)
            await item.accept()
        elif isinstance(item, CodeExecutionResult):
            result = item
    assert asked == [{}]  # unknown until the server lists its tools, as before
    assert result is not None and result.text == "Echo: old"
    # Once it ran, the server's own listing is known in this process.
    asked2, result2 = await readme_decisions(executor, code, OLD_TAG)
    assert asked2[0][1].get("readOnlyHint") is True and result2.text == "Echo: old"


async def test_malformed_recorded_annotations_are_ignored_with_a_warning(
    executor: CodeExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    code = """
from ipybox.in_kernel.tool_runner import ApprovalRejectedError
from mcptools.bad import echo, get_sum
try:
    echo.run(echo.Params(message="bad"))
except ApprovalRejectedError:
    print("echo rejected")
print(get_sum.run(get_sum.Params(a=1, b=2)))
"""
    with caplog.at_level(logging.WARNING, logger="ipybox.mcp_client.registry"):
        asked, result = await readme_decisions(executor, code, BAD_TAG)
    # `echo`'s malformed entry is not taken for a read-only hint; `get-sum`'s valid one still counts.
    assert [(tool, hints.get("readOnlyHint"), running) for tool, hints, running in asked] == [
        ("echo", None, []),
        ("get-sum", True, []),
    ]
    assert result.text is not None and result.text.startswith("echo rejected\n")
    assert any("'echo'" in r.getMessage() and "malformed" in r.getMessage() for r in caplog.records)
