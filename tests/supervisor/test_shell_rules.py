"""Shell commands in a running workspace with `[kernel] approve_shell = true`: real kernels ask before
`!cmd` and `%%bash` run, the workspace's rules decide each command of the line (server `shell`), an `ask`
reaches the attached application's `stream()`, and the audit log has an entry per command."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ipybox import ApprovalRequest, CodeExecutionError, CodeExecutionResult, CodeExecutor
from ipybox.supervisor import Supervisor

pytestmark = pytest.mark.integration

CONFIG = """\
[kernel]
warm_pool = 1
approve_shell = {approve_shell}

[sandbox]
enabled = false

[approval]
default = "deny"
ask_timeout = 10

[[approval.rules]]
id = "list"
server = "shell"
tool = ["ls", "echo"]
decision = "allow"

[[approval.rules]]
id = "ask-touch"
server = "shell"
tool = "touch"
decision = "ask"

[[approval.rules]]
id = "no-rm-rf"
server = "shell"
args = {{ cmd = {{ regex = '(.* )?rm -rf .*' }} }}
decision = "deny"
priority = 10
"""


def write_workspace(directory: Path, *, approve_shell: bool) -> Path:
    (directory / "ipybox.toml").write_text(CONFIG.format(approve_shell=str(approve_shell).lower()))
    (directory / "d").mkdir()
    (directory / "d" / "kept.txt").write_text("still here")
    return directory


@pytest.fixture(scope="module")
async def workspace_up(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(write_workspace(tmp_path_factory.mktemp("shell-rules"), approve_shell=True))
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


@pytest.fixture(scope="module")
async def attached(workspace_up: Supervisor) -> AsyncIterator[CodeExecutor]:
    async with CodeExecutor(workspace=workspace_up.workspace) as executor:
        yield executor


def audit(supervisor: Supervisor) -> list[dict[str, Any]]:
    return [json.loads(line) for line in supervisor.paths.audit.read_text().splitlines()]


def output(error: CodeExecutionError) -> str:
    """What the refused cell printed before the error."""
    return (error.result.text or "") if error.result is not None else ""


async def refused(executor: CodeExecutor, code: str) -> CodeExecutionError:
    with pytest.raises(CodeExecutionError) as info:
        await executor.execute(code)
    assert info.value.ename == "ApprovalRejectedError"
    return info.value


async def test_an_allowed_command_runs_and_is_audited(
    attached: CodeExecutor, workspace_up: Supervisor
) -> None:
    assert (await attached.execute("!ls d")).text == "kept.txt"
    assert audit(workspace_up)[-1] | {"time": None, "prev": None} == {
        "time": None, "server": "shell", "tool": "ls", "args": {"cmd": "ls d"}, "decision": "allow",
        "rule_id": "list", "decided_by": "rule", "reason": "rule 'list' applies", "prev": None,
    }  # fmt: skip


async def test_a_denied_command_is_refused_in_the_cell_and_never_runs(
    attached: CodeExecutor, workspace_up: Supervisor
) -> None:
    error = await refused(attached, "!rm -rf d")
    assert "`rm -rf d` is denied by rule 'no-rm-rf'" in error.evalue
    assert (workspace_up.workspace / "d" / "kept.txt").exists()


async def test_a_composite_command_with_one_denied_part_is_refused_as_a_whole(
    attached: CodeExecutor, workspace_up: Supervisor
) -> None:
    before = len(audit(workspace_up))
    error = await refused(attached, "!echo ran && ls d && rm -rf d")
    assert "`rm -rf d` is denied by rule 'no-rm-rf'" in error.evalue
    assert "ran" not in output(error)  # nothing of the line ran
    assert (workspace_up.workspace / "d" / "kept.txt").exists()
    entries = [
        (e["tool"], e["args"]["cmd"], e["decision"], e["rule_id"]) for e in audit(workspace_up)[before:]
    ]
    assert entries == [
        ("echo", "echo ran", "allow", "list"),
        ("ls", "ls d", "allow", "list"),
        ("rm", "rm -rf d", "deny", "no-rm-rf"),
    ]
    assert all("not run" in e["reason"] for e in audit(workspace_up)[before : before + 2])


async def test_expansion_and_substitutions_are_decided_as_they_would_run(
    attached: CodeExecutor, workspace_up: Supervisor
) -> None:
    await refused(attached, "target = 'd'\n!rm -rf {target}")
    error = await refused(attached, "!echo $(rm -rf d)")
    assert "`rm -rf d` is denied" in error.evalue
    await refused(attached, "x = !ls; rm -rf d")
    assert (workspace_up.workspace / "d" / "kept.txt").exists()


async def test_a_bash_cell_is_decided_command_by_command(
    attached: CodeExecutor, workspace_up: Supervisor
) -> None:
    assert (await attached.execute("%%bash\necho one\nls d\n")).text == "one\nkept.txt"
    error = await refused(attached, "%%bash\necho one\nrm -rf d\n")
    assert "one" not in output(error)
    assert (workspace_up.workspace / "d" / "kept.txt").exists()


Answer = Callable[[ApprovalRequest], Awaitable[None]]


async def stream(executor: CodeExecutor, code: str, answer: bool) -> tuple[list[ApprovalRequest], str | None]:
    requests, text = [], None
    async for item in executor.stream(code):
        if isinstance(item, ApprovalRequest):
            requests.append(item)
            await (item.accept() if answer else item.reject())
        elif isinstance(item, CodeExecutionResult):
            text = item.text
    return requests, text


async def test_an_ask_reaches_stream_as_the_commands_request_and_the_answer_counts(
    attached: CodeExecutor, workspace_up: Supervisor
) -> None:
    made = workspace_up.workspace / "made"
    requests, _ = await stream(attached, "!echo asking && touch made", answer=True)
    assert [(r.server_name, r.tool_name, r.tool_args) for r in requests] == [
        ("shell", "touch", {"cmd": "touch made"})
    ]
    assert made.exists()
    made.unlink()
    with pytest.raises(CodeExecutionError, match="`touch made` was rejected by the application"):
        await stream(attached, "!touch made", answer=False)
    assert not made.exists()
    last = audit(workspace_up)[-1]
    assert (last["tool"], last["decision"], last["rule_id"], last["decided_by"]) == (
        "touch", "deny", "ask-touch", "application",
    )  # fmt: skip


async def test_turning_approve_shell_on_replaces_running_kernels(tmp_path: Path) -> None:
    supervisor = Supervisor(write_workspace(tmp_path, approve_shell=False))
    await supervisor.start()
    try:
        async with CodeExecutor(workspace=supervisor.workspace) as executor:
            await executor.execute("!touch unasked")  # off: shell commands run without asking
            assert (tmp_path / "unasked").exists()
            generation = supervisor.kernel_generation
            path = tmp_path / "ipybox.toml"
            path.write_text(path.read_text().replace("approve_shell = false", "approve_shell = true"))
            deadline = time.monotonic() + 30
            while supervisor.kernel_generation == generation:
                assert time.monotonic() < deadline, "the kernels were not replaced"
                await asyncio.sleep(0.1)
            assert "kernel.approve_shell: false -> true" in supervisor.paths.log.read_text()
            # The attached application continues on a fresh kernel, which asks.
            await refused(executor, "!rm -rf d")
            assert (tmp_path / "d" / "kept.txt").exists()
    finally:
        await supervisor.stop()
