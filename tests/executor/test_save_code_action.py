"""`CodeExecutor.save_code_action` and `check_in_fresh_kernel` with real kernels: an embedded executor whose
kernels call our real edge server, one attached to a workspace `ipybox up` runs (its rules decide the saved
action's tool calls), and a sandboxed one. The check runs in another kernel: the executor's own keeps its
state."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox import (
    ApprovalRequest,
    CodeActionError,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    generate_mcp_sources,
)
from ipybox.mcp_apigen.package import SymlinkRefusedError
from ipybox.supervisor import Supervisor
from tests.servers import params
from tests.servers.processes import tagged
from tests.supervisor.workspaces import make_workspace

pytestmark = pytest.mark.integration

TAG = "save-code-action"

GREET_API = textwrap.dedent('''
    from pydantic import BaseModel


    class Params(BaseModel):
        name: str


    class Result(BaseModel):
        greeting: str


    def run(params: Params) -> Result:
        """Greet someone by name.

        The greeting comes from impl.py."""
        from .impl import greet

        return Result(greeting=greet(params.name))
''')
GREET_IMPL = "def greet(name: str) -> str:\n    return f'hello {name}'\n"

# An action that calls a real MCP tool through the generated package.
ECHO_API = textwrap.dedent('''
    from pydantic import BaseModel


    class Params(BaseModel):
        text: str


    def run(params: Params) -> str:
        """Echo text through the edge server."""
        from .impl import echo_twice

        return echo_twice(params.text)
''')
ECHO_IMPL = textwrap.dedent("""
    from mcptools.edge import echo


    def echo_twice(text: str) -> str:
        return echo.run(echo.Params(text=text)) + "/" + echo.run(echo.Params(text=text))
""")


def _leftovers(directory: Path) -> list[str]:
    """Hidden entries (staging and retired directories) left in `directory`."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".")) if directory.exists() else []


async def _stream(
    executor: CodeExecutor, code: str, accept: bool
) -> tuple[list[ApprovalRequest], CodeExecutionResult]:
    requests: list[ApprovalRequest] = []
    result: CodeExecutionResult | None = None
    async for item in executor.stream(code):
        if isinstance(item, ApprovalRequest):
            requests.append(item)
            await (item.accept() if accept else item.reject())
        elif isinstance(item, CodeExecutionResult):
            result = item
    assert result is not None
    return requests, result


@pytest.fixture(scope="module")
async def saver(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[CodeExecutor]:
    """An embedded executor whose kernels have `mcptools.edge` (the real edge server)."""
    workspace = tmp_path_factory.mktemp("save-action")
    await generate_mcp_sources("edge", tagged(params.edge(), TAG), workspace / "mcptools")
    async with CodeExecutor(working_dir=workspace, approval_timeout=10) as executor:
        yield executor


async def test_a_saved_action_is_imported_by_a_new_code_action_after_a_reset(saver: CodeExecutor) -> None:
    action = await saver.save_code_action("demo", "greet", api=GREET_API, impl=GREET_IMPL)

    assert (action.module, action.tool_name, action.path) == (
        "gentools.demo.greet",
        "demo__greet",
        saver.working_dir / "gentools" / "demo" / "greet",
    )
    assert action.description == "Greet someone by name.\n\nThe greeting comes from impl.py."
    assert action.signature == "run(params: Params) -> Result"
    assert (action.takes_params, action.is_async) == (True, False)
    assert action.input_schema["properties"] == {"name": {"title": "Name", "type": "string"}}
    assert action.output_schema is not None and action.output_schema["title"] == "Result"
    assert action.calls.tools == ()

    await saver.reset()
    result = await saver.execute(
        "from gentools.demo.greet import Params, Result, run\n"
        "reply = run(Params(name='ada'))\n"
        "print(type(reply) is Result, reply.greeting)"
    )
    assert result.text == "True hello ada"
    index = (saver.working_dir / "gentools" / "demo" / "__init__.py").read_text()
    assert "- greet: Greet someone by name." in index
    assert "demo: " in (saver.working_dir / "gentools" / "__init__.py").read_text()
    assert _leftovers(saver.working_dir / "gentools" / "demo") == []


async def test_an_async_action_without_params_is_described_as_such(saver: CodeExecutor) -> None:
    api = 'async def run() -> str:\n    """Say hi."""\n    from .impl import HI\n\n    return HI\n'
    action = await saver.save_code_action("demo", "say_hi", api=api, impl="HI = 'hi'\n")
    assert (action.takes_params, action.is_async, action.signature) == (False, True, "run() -> str")
    assert action.input_schema == {"type": "object", "properties": {}}
    assert action.output_schema is None
    await saver.reset()
    result = await saver.execute("from gentools.demo.say_hi import run\nprint(await run())")
    assert result.text == "hi"


async def test_the_executors_own_kernel_keeps_its_state_while_an_action_is_saved(saver: CodeExecutor) -> None:
    await saver.execute("kept = 42")
    kernel = saver.kernel_client.kernel_id
    await saver.save_code_action("state", "greet", api=GREET_API, impl=GREET_IMPL)
    assert saver.kernel_client.kernel_id == kernel
    assert (await saver.execute("print(kept)")).text == "42"


async def test_check_in_fresh_kernel_runs_code_in_another_kernel(saver: CodeExecutor) -> None:
    await saver.execute("import os\nmine = os.getpid()")
    own_pid = (await saver.execute("print(mine)")).text
    output = await saver.check_in_fresh_kernel("import os\nprint(os.getpid(), 'mine' in dir())")
    pid, defined = output.split()
    assert pid != own_pid and defined == "False"
    with pytest.raises(CodeExecutionError, match="ZeroDivisionError"):
        await saver.check_in_fresh_kernel("1 / 0")
    assert (await saver.execute("print(mine)")).text == own_pid


async def test_an_action_calling_an_mcp_tool_goes_through_approval(saver: CodeExecutor) -> None:
    action = await saver.save_code_action("edgy", "echo_twice", api=ECHO_API, impl=ECHO_IMPL)
    assert action.calls.tools == ("edge.echo",)
    await saver.reset()
    code = "from gentools.edgy.echo_twice import Params, run\nprint(run(Params(text='hi')))"

    requests, result = await _stream(saver, code, accept=True)
    assert [(r.server_name, r.tool_name, r.tool_args) for r in requests] == [
        ("edge", "echo", {"text": "hi"})
    ] * 2
    assert result.text == "hi/hi"
    with pytest.raises(CodeExecutionError, match="rejected"):
        await _stream(saver, code, accept=False)


async def test_an_impl_that_fails_at_import_is_refused_with_its_file_line_and_column(
    saver: CodeExecutor,
) -> None:
    impl = "import os\n\nvalue = undefined_name\n"
    with pytest.raises(CodeActionError) as caught:
        await saver.save_code_action("broken", "greet", api=GREET_API, impl=impl)

    message = str(caught.value)
    assert "gentools/broken/greet/impl.py:3:9: NameError: name 'undefined_name' is not defined" in message
    assert ".tmp-" not in message and "nothing was written" in message
    # The category was new: it is gone again, with no staging directory left behind.
    assert not (saver.working_dir / "gentools" / "broken").exists()
    assert _leftovers(saver.working_dir / "gentools") == []


async def test_an_impl_that_kills_its_kernel_or_calls_a_tool_at_import_is_refused(
    saver: CodeExecutor,
) -> None:
    with pytest.raises(CodeActionError, match="the kernel died while importing it"):
        await saver.save_code_action("broken", "dies", api=GREET_API, impl="import os\n\nos._exit(3)\n")
    # The check's tool calls are never an approval of the executor's (no execution runs): rejected.
    calls = "from mcptools.edge import echo\n\nVALUE = echo.run(echo.Params(text='x'))\n"
    with pytest.raises(CodeActionError) as caught:
        await saver.save_code_action("broken", "calls", api=GREET_API, impl=calls)
    assert "gentools/broken/calls/impl.py:3:9: ApprovalRejectedError: edge.echo was rejected" in str(
        caught.value
    )
    assert not (saver.working_dir / "gentools" / "broken").exists()


async def test_a_failure_in_an_existing_category_leaves_no_half_action(saver: CodeExecutor) -> None:
    await saver.save_code_action("kept", "greet", api=GREET_API, impl=GREET_IMPL)
    api = GREET_API.replace("class Params(BaseModel):\n    name: str", "Params = dict")
    with pytest.raises(CodeActionError) as caught:
        await saver.save_code_action("kept", "other", api=api, impl=GREET_IMPL)

    assert "gentools/kept/other/api.py:" in str(caught.value)
    assert "Params in api.py must be a pydantic model" in str(caught.value)
    category = saver.working_dir / "gentools" / "kept"
    assert sorted(p.name for p in category.iterdir() if p.name != "__pycache__") == ["__init__.py", "greet"]
    assert "other" not in (category / "__init__.py").read_text()


async def test_overwrite_is_refused_and_then_accepted_with_overwrite_true(saver: CodeExecutor) -> None:
    await saver.save_code_action("versions", "greet", api=GREET_API, impl=GREET_IMPL)
    impl_v2 = GREET_IMPL.replace("hello", "good day")
    with pytest.raises(CodeActionError, match=r"pass overwrite=true to replace the action versions\.greet"):
        await saver.save_code_action("versions", "greet", api=GREET_API, impl=impl_v2)
    path = saver.working_dir / "gentools" / "versions" / "greet"
    assert (path / "impl.py").read_text() == GREET_IMPL

    await saver.save_code_action("versions", "greet", api=GREET_API, impl=impl_v2, overwrite=True)
    assert (path / "impl.py").read_text() == impl_v2
    assert _leftovers(path.parent) == []
    await saver.reset()
    result = await saver.execute(
        "from gentools.versions.greet import Params, run\nprint(run(Params(name='ada')))"
    )
    assert result.text == "greeting='good day ada'"


async def test_a_symlink_planted_at_the_category_is_refused_and_nothing_is_written_outside(
    saver: CodeExecutor, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    gentools = saver.working_dir / "gentools"
    gentools.mkdir(exist_ok=True)
    (gentools / "planted").symlink_to(outside)
    try:
        with pytest.raises(SymlinkRefusedError, match="it is a symlink"):
            await saver.save_code_action("planted", "greet", api=GREET_API, impl=GREET_IMPL)
    finally:
        (gentools / "planted").unlink()
    assert list(outside.iterdir()) == []


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    workspace = make_workspace(tmp_path_factory.mktemp("save-action-workspace"), TAG, ask_timeout=5)
    supervisor = Supervisor(workspace)
    await supervisor.start()
    yield supervisor
    await supervisor.stop()


async def test_an_attached_executor_saves_into_the_workspace_and_its_rules_decide_the_calls(
    supervisor: Supervisor,
) -> None:
    getenv_impl = (
        "from mcptools.edge import getenv\n\n\ndef echo_twice(text: str) -> str:\n"
        "    return getenv.run(getenv.Params(name=text))\n"
    )
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        await executor.execute("kept = 1")
        action = await executor.save_code_action("ws", "echo_twice", api=ECHO_API, impl=ECHO_IMPL)
        denied = await executor.save_code_action("ws", "env", api=ECHO_API, impl=getenv_impl)
        assert (await executor.execute("print(kept)")).text == "1"

        assert action.path == supervisor.workspace / "gentools" / "ws" / "echo_twice"
        assert (action.calls.tools, denied.calls.tools) == (("edge.echo",), ("edge.getenv",))
        await executor.reset()
        # `echo` with text "hi" is allowed by the workspace's rule, `getenv` denied by another.
        allowed = await executor.execute(
            "from gentools.ws.echo_twice import Params, run\nprint(run(Params(text='hi')))"
        )
        assert allowed.text == "hi/hi"
        with pytest.raises(CodeExecutionError, match="denied by rule 'no-getenv'"):
            await executor.execute("from gentools.ws.env import Params, run\nrun(Params(text='HOME'))")


async def test_a_sandboxed_executor_checks_in_a_sandbox_and_its_next_kernel_imports_the_action(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with CodeExecutor(working_dir=workspace, sandbox=True) as executor:
        # The fresh kernel is sandboxed as the executor's are: /tmp is its own, the host's file not there.
        host_only = tmp_path / "host-only.txt"
        host_only.write_text("x")
        seen = await executor.check_in_fresh_kernel(f"import os\nprint(os.path.exists({str(host_only)!r}))")
        assert seen.strip() == "False"

        await executor.save_code_action("boxed", "greet", api=GREET_API, impl=GREET_IMPL)
        # The spare kernel's sandbox was made before the save: `gentools/` existed then (made at start).
        await executor.reset()
        result = await executor.execute(
            "from gentools.boxed.greet import Params, run\nprint(run(Params(name='bo')))"
        )
        assert result.text == "greeting='hello bo'"


async def test_the_saving_executor_imports_the_new_version_without_a_reset(saver: CodeExecutor) -> None:
    use = "from gentools.revised.greet import Params, run\nprint(run(Params(name='ada')))"
    await saver.save_code_action("revised", "greet", api=GREET_API, impl=GREET_IMPL)
    assert (await saver.execute(use)).text == "greeting='hello ada'"
    impl_v2 = GREET_IMPL.replace("hello", "good day")
    await saver.save_code_action("revised", "greet", api=GREET_API, impl=impl_v2, overwrite=True)
    assert (await saver.execute(use)).text == "greeting='good day ada'"
