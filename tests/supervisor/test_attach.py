"""Applications attached to a running workspace: kernels from the warm pool, tool calls decided by the
workspace's rules, `ask` answered through `stream()`, every decision in the audit log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from ipybox import ApprovalRequest, CodeExecutionError, CodeExecutionResult, CodeExecutor
from ipybox.supervisor import NotRunningError, Supervisor

pytestmark = pytest.mark.integration


@pytest.fixture
async def attached(supervisor: Supervisor) -> AsyncIterator[CodeExecutor]:
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        yield executor


async def test_a_kernel_from_the_pool_runs_in_the_workspace(
    attached: CodeExecutor, supervisor: Supervisor
) -> None:
    result = await attached.execute("import os\nprint(os.getcwd(), os.environ.get('WORKSPACE_SECRET'))")
    assert result.text == f"{supervisor.workspace} None"
    status = supervisor.status()
    assert status.pool.leased == 1 and status.leases == 1


async def test_generated_tools_follow_the_rules(attached: CodeExecutor, supervisor: Supervisor) -> None:
    allowed = await attached.execute(
        "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='hi')))"
    )
    assert allowed.text == "hi"
    denied = await attached.execute(
        "from mcptools.edge import getenv\n"
        "from ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
        "try:\n    getenv.run(getenv.Params(name='HOME'))\nexcept ApprovalRejectedError as e:\n    print(e)"
    )
    assert denied.text == "edge.getenv was rejected: denied by rule 'no-getenv'"
    entries = [json.loads(line) for line in supervisor.paths.audit.read_text().splitlines()]
    decided = {(e["tool"], e["decision"], e["rule_id"], e["decided_by"]) for e in entries}
    assert ("echo", "allow", "echo-ok", "rule") in decided
    assert ("getenv", "deny", "no-getenv", "rule") in decided


ASK = "from mcptools.edge import slow\nprint(slow.run(slow.Params(seconds=0)))"


async def test_ask_reaches_stream_and_the_answer_counts(
    attached: CodeExecutor, supervisor: Supervisor
) -> None:
    async def run(accept: bool) -> tuple[list[ApprovalRequest], CodeExecutionResult | None]:
        requests, result = [], None
        async for item in attached.stream(ASK):
            if isinstance(item, ApprovalRequest):
                requests.append(item)
                await (item.accept() if accept else item.reject())
            elif isinstance(item, CodeExecutionResult):
                result = item
        return requests, result

    requests, result = await run(accept=True)
    assert [(r.server_name, r.tool_name) for r in requests] == [("edge", "slow")]
    assert result is not None and result.text == "slept 0.0"
    with pytest.raises(CodeExecutionError, match="rejected by the application"):
        await run(accept=False)
    last = json.loads(supervisor.paths.audit.read_text().splitlines()[-1])
    assert (last["tool"], last["decision"], last["decided_by"]) == ("slow", "deny", "application")


async def test_an_unanswered_ask_is_denied(attached: CodeExecutor, supervisor: Supervisor) -> None:
    code = (
        "from ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
        f"try:\n    {ASK.splitlines()[1]}\nexcept ApprovalRejectedError as e:\n    print(e)"
    )
    code = "from mcptools.edge import slow\n" + code
    async for item in attached.stream(code, timeout=30):
        if isinstance(item, CodeExecutionResult):
            assert item.text is not None and "no answer within 3 s" in item.text
    last = json.loads(supervisor.paths.audit.read_text().splitlines()[-1])
    assert (last["decision"], last["decided_by"]) == ("deny", "timeout")


async def test_reset_takes_a_fresh_kernel_and_keeps_the_servers(
    attached: CodeExecutor, supervisor: Supervisor
) -> None:
    await attached.execute("x = 1")
    before = attached.kernel_client.kernel_id
    await attached.reset()
    assert attached.kernel_client.kernel_id != before
    assert (await attached.execute("print('x' in dir())")).text == "False"
    assert (
        await attached.execute("from mcptools.edge import echo\nprint(echo.run(echo.Params(text='again')))")
    ).text == "again"


async def test_leases_are_given_back(supervisor: Supervisor) -> None:
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        await executor.execute("1")
        assert supervisor.status().leases >= 1
    await asyncio.sleep(0.1)
    assert supervisor.status().leases == 0


async def test_attaching_to_a_workspace_that_is_not_running(tmp_path: object) -> None:
    with pytest.raises(NotRunningError, match="ipybox is not running in"):
        async with CodeExecutor(workspace=str(tmp_path)):
            pass


async def test_a_stopped_tool_server_is_restarted(supervisor: Supervisor) -> None:
    assert supervisor.tool_server is not None
    await supervisor.tool_server._http.stop()  # as if it crashed
    for _ in range(200):
        if supervisor.restarts["tool_server"] == 1:
            break
        await asyncio.sleep(0.05)
    assert supervisor.restarts["tool_server"] == 1
    # Servers added by later edits go to the running tool server, not the one that stopped.
    assert (
        supervisor.reconciler is not None and supervisor.reconciler.servers is supervisor.tool_server.servers
    )
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        code = "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='after restart')))"
        assert (await executor.execute(code)).text == "after restart"
    assert "the tool server stopped: restarting it" in supervisor.paths.log.read_text()


async def test_what_an_attached_executor_writes_to_files_is_bounded_as_ipybox_toml_says(
    supervisor: Supervisor,
) -> None:
    config = supervisor.workspace / "ipybox.toml"
    original = config.read_text()
    config.write_text(original.replace("[kernel]\n", '[kernel]\nmax_output_file_bytes = "1MiB"\n', 1))
    try:
        async with CodeExecutor(workspace=supervisor.workspace, max_image_bytes=1000) as executor:
            client = executor.kernel_client
            # Passed, the argument wins; left out, the workspace's setting applies.
            assert (client.max_output_file_bytes, client.max_image_bytes) == (1024 * 1024, 1000)
    finally:
        config.write_text(original)
