"""CodeExecutor with MCP tools: code in the kernel calls real MCP servers through the generated API, each
call approved by the application."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from ipybox import (
    ApprovalRequest,
    CodeExecutionChunk,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    process,
)
from tests.servers.processes import TAG_ENV, pids

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


async def _decide(
    executor: CodeExecutor, code: str, decide: Any = True, timeout: float = 60
) -> tuple[list[ApprovalRequest], CodeExecutionResult]:
    """Run `code` with `stream()`, answering each approval request with `decide(request)` (or a bool)."""
    requests: list[ApprovalRequest] = []
    result: CodeExecutionResult | None = None
    async for item in executor.stream(code, timeout=timeout):
        if isinstance(item, ApprovalRequest):
            requests.append(item)
            accept = decide(item) if callable(decide) else decide
            await (item.accept() if accept else item.reject())
        elif isinstance(item, CodeExecutionResult):
            result = item
    assert result is not None
    return requests, result


async def test_generated_api_calls_real_servers(tool_executor: CodeExecutor, tools_workspace: Path) -> None:
    code = f"""
from mcptools.everything import echo
from mcptools.filesystem import list_directory
from mcptools.time import get_current_time
from mcptools.git import git_status

print(echo.run(echo.Params(message="hi")))
print(list_directory.run(list_directory.Params(path={str(tools_workspace / "data")!r})).content)
now = get_current_time.run(get_current_time.Params(timezone="UTC"))
print(type(now).__name__, now.timezone)
print("branch" in git_status.run(git_status.Params(repo_path={str(tools_workspace / "repo")!r})).lower())
"""
    result = await tool_executor.execute(code)
    assert result.text is not None
    lines = result.text.splitlines()
    assert lines[0] == "Echo: hi"
    assert lines[1] == "[FILE] notes.txt"
    assert lines[2] == "Result UTC"
    assert lines[3] == "True"


async def test_async_variant_and_gather(tool_executor: CodeExecutor) -> None:
    code = """
import asyncio
from mcptools.everything import echo
replies = await asyncio.gather(*(echo.arun(echo.Params(message=str(i))) for i in range(10)))
print(replies == [f"Echo: {i}" for i in range(10)])
"""
    assert (await tool_executor.execute(code)).text == "True"


async def test_stream_surfaces_each_call_for_approval(tool_executor: CodeExecutor) -> None:
    code = """
from mcptools.everything import echo, get_sum
print(echo.run(echo.Params(message="approved")))
print(get_sum.run(get_sum.Params(a=2, b=3)))
"""
    requests, result = await _decide(tool_executor, code)
    assert [(r.server_name, r.tool_name, r.tool_args) for r in requests] == [
        ("everything", "echo", {"message": "approved"}),
        ("everything", "get-sum", {"a": 2, "b": 3}),  # the real tool name, not the module name
    ]
    assert result.text is not None and result.text.startswith("Echo: approved")
    assert "5" in result.text.splitlines()[1]


async def test_annotations_reach_the_application(tool_executor: CodeExecutor) -> None:
    code = "from mcptools.filesystem import list_allowed_directories as l\nl.run(l.Params())"
    [request], _ = await _decide(tool_executor, code)
    assert request.annotations.get("readOnlyHint") is True


async def test_a_rejected_call_raises_in_the_cell(tool_executor: CodeExecutor, tools_workspace: Path) -> None:
    target = tools_workspace / "data" / "rejected.txt"
    code = f"""
from ipybox.in_kernel.tool_runner import ApprovalRejectedError
from mcptools.filesystem import write_file
try:
    write_file.run(write_file.Params(path={str(target)!r}, content="x"))
except ApprovalRejectedError as e:
    print("rejected:", e)
"""
    [request], result = await _decide(tool_executor, code, decide=False)
    assert request.tool_name == "write_file"
    assert result.text is not None and result.text.startswith("rejected:") and "write_file" in result.text
    assert not target.exists()


def _ends_at_the_users_line(traceback: str, line: str) -> None:
    """The kernel's traceback of a failed tool call shows the cell's line and nothing of ipybox's or the
    generated module's code below it (issue 37)."""
    assert f"----> 2 {line}" in traceback, traceback
    assert "ipybox/" not in traceback and "mcptools/" not in traceback and "tool_runner" not in traceback, (
        traceback
    )
    assert "skipping hidden" not in traceback, traceback


async def test_an_uncaught_rejection_is_a_code_execution_error_ending_at_the_users_line(
    tool_executor: CodeExecutor,
) -> None:
    line = "echo.run(echo.Params(message='no'))"
    with pytest.raises(CodeExecutionError) as info:
        await _decide(tool_executor, f"from mcptools.everything import echo\n{line}", decide=False)
    assert info.value.ename == "ApprovalRejectedError"
    _ends_at_the_users_line(info.value.traceback, line)
    # The async variant too, through asyncio's thread hand-off.
    line = "await echo.arun(echo.Params(message='no'))"
    with pytest.raises(CodeExecutionError) as info:
        await _decide(tool_executor, f"from mcptools.everything import echo\n{line}", decide=False)
    assert info.value.ename == "ApprovalRejectedError"
    _ends_at_the_users_line(info.value.traceback, line)


async def test_undecided_calls_time_out(tool_executor: CodeExecutor) -> None:
    channel = tool_executor.tool_server.approval
    saved, channel.approval_timeout = channel.approval_timeout, 0.3
    try:
        code = """
from ipybox.in_kernel.tool_runner import ApprovalTimeoutError
from mcptools.everything import echo
try:
    echo.run(echo.Params(message="late"))
except ApprovalTimeoutError as e:
    print("timed out:", e)
"""
        requests = []
        async for item in tool_executor.stream(code):
            if isinstance(item, ApprovalRequest):
                requests.append(item)  # never decided
            elif isinstance(item, CodeExecutionResult):
                result = item
    finally:
        channel.approval_timeout = saved
    assert len(requests) == 1
    assert result.text is not None and result.text.startswith("timed out:") and "echo" in result.text


async def test_waiting_for_approval_does_not_count_against_the_timeout(tool_executor: CodeExecutor) -> None:
    code = "from mcptools.everything import echo\nprint(echo.run(echo.Params(message='slowly')))"
    started = time.monotonic()
    result: CodeExecutionResult | None = None
    async for item in tool_executor.stream(code, timeout=1):
        if isinstance(item, ApprovalRequest):
            await asyncio.sleep(1.5)  # a human thinking it over, longer than the timeout
            await item.accept()
        elif isinstance(item, CodeExecutionResult):
            result = item
    assert time.monotonic() - started > 1.5
    assert result is not None and result.text == "Echo: slowly"


async def test_calls_pending_at_once_are_decided_each_on_its_own(tool_executor: CodeExecutor) -> None:
    code = """
from concurrent.futures import ThreadPoolExecutor
from ipybox.in_kernel.tool_runner import ApprovalRejectedError
from mcptools.everything import echo

def call(i):
    try:
        return echo.run(echo.Params(message=str(i)))
    except ApprovalRejectedError:
        return f"rejected {i}"

with ThreadPoolExecutor(4) as pool:
    print(list(pool.map(call, range(4))))
"""
    pending: list[ApprovalRequest] = []
    result: CodeExecutionResult | None = None
    async for item in tool_executor.stream(code):
        if isinstance(item, ApprovalRequest):
            pending.append(item)
            if len(pending) == 4:  # all four surfaced before any was decided
                for request in pending:
                    await (request.reject() if request.tool_args["message"] == "2" else request.accept())
        elif isinstance(item, CodeExecutionResult):
            result = item
    assert sorted(r.tool_args["message"] for r in pending) == ["0", "1", "2", "3"]
    assert result is not None
    assert result.text == str(["Echo: 0", "Echo: 1", "rejected 2", "Echo: 3"])


async def test_tool_errors_carry_the_servers_message_and_end_at_the_users_line(
    tool_executor: CodeExecutor,
) -> None:
    line = "fail.run(fail.Params(message='the disk is full'))"
    with pytest.raises(CodeExecutionError) as info:
        await tool_executor.execute(f"from mcptools.edge import fail\n{line}")
    assert info.value.ename == "ToolRunnerError"
    assert "the disk is full" in str(info.value)
    _ends_at_the_users_line(info.value.traceback, line)


async def test_secrets_reach_the_server_but_not_the_kernel(tool_executor: CodeExecutor) -> None:
    code = """
import os
from mcptools.edge import getenv
print(getenv.run(getenv.Params(name="EDGE_SECRET")))
print(any("never-in-the-kernel" in value for value in os.environ.values()))
"""
    assert (await tool_executor.execute(code)).text == "never-in-the-kernel\nFalse"


async def test_the_kernel_cannot_choose_the_server_command(
    tool_executor: CodeExecutor, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    code = f"""
from ipybox.in_kernel.tool_runner import ToolRunner
runner = ToolRunner("evil", {{"command": "touch", "args": [{str(canary)!r}]}})
runner.run_sync("anything", {{}})
"""
    with pytest.raises(CodeExecutionError) as info:
        await tool_executor.execute(code)
    assert "no MCP server named 'evil' is registered" in str(info.value)
    assert not canary.exists()


async def test_chunks_and_approvals_interleave(tool_executor: CodeExecutor) -> None:
    code = """
import time
from mcptools.everything import echo
print("before", flush=True)
time.sleep(0.2)
print(echo.run(echo.Params(message="x")))
"""
    kinds = []
    async for item in tool_executor.stream(code, chunks=True):
        if isinstance(item, ApprovalRequest):
            kinds.append("approval")
            await item.accept()
        elif isinstance(item, CodeExecutionChunk):
            if item.text.strip():  # under load a print's newline may come as a chunk of its own
                kinds.append(item.text.strip())
        else:
            kinds.append("result")
    assert kinds == ["before", "approval", "Echo: x", "result"]


async def test_reset_stops_mcp_servers(tool_executor: CodeExecutor) -> None:
    await tool_executor.execute("from mcptools.everything import echo\necho.run(echo.Params(message='x'))")
    [pid] = pids("facade-everything")
    await tool_executor.reset()
    assert not process.is_alive(pid)
    again = "from mcptools.everything import echo\nprint(echo.run(echo.Params(message='again')))"
    assert (await tool_executor.execute(again)).text == "Echo: again"


async def test_stop_leaves_no_process(tools_workspace: Path, mcptools: Path) -> None:
    before = set(process.descendants(os.getpid()))
    async with CodeExecutor(working_dir=tools_workspace) as executor:
        code = (
            "from mcptools.time import get_current_time as t\nprint(t.run(t.Params(timezone='UTC')).timezone)"
        )
        assert (await executor.execute(code)).text == "UTC"
        started = set(process.descendants(os.getpid())) - before
        assert len(started) >= 3  # gateway, kernel(s), the time server
    deadline = time.monotonic() + 5
    while (alive := [pid for pid in started if process.is_alive(pid)]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not alive


def test_generated_sources_work_from_another_process(tools_workspace: Path, mcptools: Path) -> None:
    # The registry written by generate_mcp_sources (in this process) tells a fresh process's executor
    # how to start the servers; the kernel only names them. It holds the names of values given literally
    # (the server's tag), not the values: the fresh process has them in its environment.
    script = textwrap.dedent(
        f"""
        import asyncio, json
        from ipybox import CodeExecutor

        async def main():
            async with CodeExecutor(working_dir={str(tools_workspace)!r}) as executor:
                code = "from mcptools.everything import echo\\nprint(echo.run(echo.Params(message='other')))"
                print(json.dumps((await executor.execute(code)).text))

        asyncio.run(main())
        """
    )
    env = {**os.environ, TAG_ENV: "facade-everything"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == "Echo: other"


async def test_an_interrupted_call_does_not_answer_the_next_one(tool_executor: CodeExecutor) -> None:
    slow = "from mcptools.edge import slow\nslow.run(slow.Params(seconds=1.5))"
    with pytest.raises(asyncio.TimeoutError):
        await tool_executor.execute(slow, timeout=0.3)
    # The slow call's late answer must not be taken as the answer to this one.
    code = "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='fresh')))"
    assert (await tool_executor.execute(code)).text == "fresh"
    await asyncio.sleep(1.5)
    assert (await tool_executor.execute(code)).text == "fresh"


SKILL = ROOT.parent / "plugins" / "codeact-default" / "skills" / "codeact" / "SKILL.md"


def skill_examples() -> list[str]:
    """The Python examples of the codeact skill (its ```python blocks), in order."""
    text = SKILL.read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


async def test_the_codeact_skills_examples_run_against_real_servers(tool_executor: CodeExecutor) -> None:
    # What an agent copies from the skill must run as written: against the time and everything servers,
    # each tool call approved, every attribute it reads present on what the tool returns.
    examples = skill_examples()
    assert len(examples) >= 3 and any("mcptools.time" in example for example in examples)
    for example in examples:
        requests, result = await _decide(tool_executor, example)
        assert result.text, f"the example printed nothing:\n{example}"
        assert all(request.call.server in ("time", "everything") for request in requests)
