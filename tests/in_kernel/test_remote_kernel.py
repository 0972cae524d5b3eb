"""A kernel that shares no files with the host imports the generated packages from the tool server and calls
tools through them (issue 34, part B).

The remote kernel is simulated by a real local kernel whose working directory is elsewhere and whose
`sys.path` has nothing of the host's workspace (checked first), set up by `ipybox.in_kernel.remote.install`
as the host sets up a kernel of a remote gateway, against a real `ToolServer` on its loopback TCP address.
The tool server finds the called server only through the package root the generated module sends with its
call (`package_lookup`, no server registered by name): a call passes only if that root, computed in the
kernel from the served module's `__file__`, is the host's.

The check of a code action being saved imports the staged package from a directory a local kernel would
see: those tests run their fresh kernel on a real Enterprise Gateway whose kernels see none of the host's
files (`tests.remote.eg`), against the same tool server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import ipybox
from ipybox import CodeExecutionError, CodeExecutor, generate_mcp_sources
from ipybox.approval.approver import Approval, FunctionApprover, Rejected
from ipybox.codeact.actions import CodeActionError, save_code_action
from ipybox.codeact.checks import CheckReport, RunCheck, check_code, parse_check_output
from ipybox.in_kernel.remote import PROTOCOL
from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.kernels.kernel_client import KernelClient
from ipybox.mcp_client.pool import MCPServers
from ipybox.mcp_client.registry import ServerRegistry
from ipybox.rules.calls import ToolCall
from ipybox.tool_server.tool_server import ToolServer
from tests.remote.eg import EnterpriseGateway
from tests.servers import params

pytestmark = pytest.mark.integration

SECRET = "TOP SECRET, host only"


@pytest.fixture(scope="module")
def host_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("remote-host-ws")


@pytest.fixture(scope="module")
async def registry(host_ws: Path) -> ServerRegistry:
    """The edge server generated into `<host_ws>/mcptools`, a code action in `gentools`, and a planted
    symlink to a file outside the roots."""
    registry = ServerRegistry(host_ws.parent / "remote-state" / "mcp_servers.json")
    await generate_mcp_sources(
        "edge", params.edge(), host_ws / "mcptools", registry=registry, dotenv_path=None
    )
    action = host_ws / "gentools" / "demo" / "shout"
    action.mkdir(parents=True)
    (host_ws / "gentools" / "__init__.py").write_text("'''Saved code actions.'''\n")
    (host_ws / "gentools" / "demo" / "__init__.py").write_text("'''- shout: echo, louder'''\n")
    (action / "__init__.py").write_text("from gentools.demo.shout.api import run\n")
    (action / "api.py").write_text(
        "def run(text: str) -> str:\n    '''Echo `text` in capitals.'''\n"
        "    from gentools.demo.shout.impl import shout\n\n    return shout(text)\n"
    )
    (action / "impl.py").write_text(
        "from mcptools.edge.echo import Params, run as echo\n\n\n"
        "def shout(text: str) -> str:\n    return echo(Params(text=text.upper()))\n"
    )
    (host_ws.parent / "secret.py").write_text(f"SECRET = {SECRET!r}\n")
    (host_ws / "mcptools" / "leak.py").symlink_to(host_ws.parent / "secret.py")
    return registry


@pytest.fixture(scope="module")
def shell_asked() -> list[ToolCall]:
    return []


@pytest.fixture(scope="module")
async def host(
    host_ws: Path, registry: ServerRegistry, shell_asked: list[ToolCall]
) -> AsyncIterator[ToolServer]:
    mcptools = host_ws / "mcptools"
    servers = MCPServers(
        lookup=lambda name: None, package_lookup=registry.package_server, package_roots=[mcptools]
    )

    async def refuse_shell(call: ToolCall) -> Approval:
        shell_asked.append(call)
        return Rejected("no shell in this test")

    async with ToolServer(
        port=0,
        servers=servers,
        shell_approver=FunctionApprover(refuse_shell),
        module_roots={
            "mcptools": mcptools,
            "gentools": host_ws / "gentools",
            "mcpparse": host_ws / "mcpparse",
        },
    ) as server:
        yield server


def install_code(host: ToolServer, token: str, host_ws: Path, **changes: Any) -> str:
    config = {
        "protocol": PROTOCOL,
        "ipybox": ipybox.__version__,
        "server": host.calls_address,
        "token": token,
        "cert": None,
        "roots": {name: str(host_ws / name) for name in ("mcptools", "gentools", "mcpparse")},
        "extensions": {"shell_approval": False, "cwd": None},
        "env": {},
        **changes,
    }
    return f"import ipybox.in_kernel.remote as _r\n_r.install({json.dumps(config)!r})"


@pytest.fixture(scope="module")
async def kernel(
    tmp_path_factory: pytest.TempPathFactory, host: ToolServer, host_ws: Path
) -> AsyncIterator[tuple[CodeExecutor, str]]:
    elsewhere = tmp_path_factory.mktemp("remote-kernel-cwd")
    async with CodeExecutor(working_dir=elsewhere, spare_kernel=False) as executor:
        # The simulation holds: nothing of the host's workspace is importable from the kernel's disk.
        probe = await executor.execute(
            "import sys\ntry:\n    import mcptools\nexcept ImportError as e:\n    print(type(e).__name__)\n"
            f"print(any({str(host_ws)!r} in p for p in sys.path))"
        )
        assert probe.text == "ModuleNotFoundError\nFalse"
        token = host.add_caller("remote-kernel")
        await executor.execute(install_code(host, token, host_ws))
        yield executor, token


async def test_a_kernel_without_the_workspace_calls_a_tool_through_a_module_the_tool_server_serves(
    kernel: tuple[CodeExecutor, str], host_ws: Path
) -> None:
    executor, _ = kernel
    result = await executor.execute(
        "from mcptools.edge.echo import Params, run\nimport mcptools.edge.echo as m\n"
        "print(run(Params(text='hello from afar')))\nprint(m.__file__)"
    )
    mcptools = os.path.realpath(host_ws / "mcptools")
    assert result.text == f"hello from afar\n{mcptools}/edge/echo.py"


async def test_a_module_changed_on_the_host_is_seen_by_the_next_cell(
    kernel: tuple[CodeExecutor, str], host_ws: Path
) -> None:
    executor, _ = kernel
    path = host_ws / "mcptools" / "edge" / "echo.py"
    original = path.read_text()
    code = "import mcptools.edge.echo as m\nprint(getattr(m, 'REVISION', 1))"
    try:
        assert (await executor.execute(code)).text == "1"
        path.write_text(original + "\nREVISION = 2\n")
        await asyncio.sleep(0.2)  # past the tool server's reuse of a computed generation (0.1 s)
        assert (await executor.execute(code)).text == "2"
    finally:
        path.write_text(original)


async def test_a_code_action_in_gentools_imports_and_calls_tools_through_the_tool_server(
    kernel: tuple[CodeExecutor, str],
) -> None:
    executor, _ = kernel
    result = await executor.execute("from gentools.demo.shout import run\nprint(run('quiet please'))")
    assert result.text == "QUIET PLEASE"


async def test_a_kernel_cannot_read_a_file_outside_the_roots_by_symlink_or_crafted_name(
    kernel: tuple[CodeExecutor, str],
) -> None:
    executor, _ = kernel
    names = [
        "mcptools.leak",
        "mcptools..leak",
        "mcptools.edge/../../../secret",
        "secret",
        "os",
        "mcptools.__pycache__",
    ]
    result = await executor.execute(
        "from ipybox.in_kernel.tool_runner import ToolRunnerError, request_op\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        print(name, 'SERVED', request_op('source', {'module': name}))\n"
        "    except ToolRunnerError as e:\n"
        "        print(name, 'refused:', e)\n"
        "try:\n"
        "    import mcptools.leak\n"
        "except ImportError as e:\n"
        "    print('import refused:', e)\n"
    )
    text = result.text or ""
    assert SECRET not in text and "SERVED" not in text
    lines = text.splitlines()
    assert len(lines) == len(names) + 1
    assert all("refused:" in line for line in lines)
    assert "leads outside" in lines[0] and "leads outside" in lines[-1]


# -- the check of a code action being saved (`import_check` on a staged package)

STAGING = ".whisper.tmp-4242_0123456789ab"
WHISPER_API = (
    "from gentools.loud.whisper.impl import whisper\n\n\n"
    "def run() -> str:\n    '''Whisper through the edge server.'''\n    return whisper()\n"
)
WHISPER_IMPL = (
    "from mcptools.edge.echo import Params, run as echo\n\n\n"
    "def whisper() -> str:\n    return echo(Params(text='PSST')).lower()\n"
)


@pytest.fixture
async def checker(
    enterprise_gateway: EnterpriseGateway, host: ToolServer, host_ws: Path, tmp_path: Path
) -> AsyncIterator[KernelClient]:
    """A fresh kernel on the gateway, set up as the host sets up a remote one: where a save's check runs."""
    endpoint = GatewayEndpoint(enterprise_gateway.url, enterprise_gateway.token)
    async with KernelClient(
        endpoint, kernel_name=enterprise_gateway.kernel_name, spare_kernel=False, images_dir=tmp_path
    ) as client:
        await client.execute(install_code(host, host.add_caller("remote-check"), host_ws), timeout=60)
        yield client


@pytest.fixture
def staged(host_ws: Path, registry: ServerRegistry) -> Iterator[Path]:
    """`gentools.loud.whisper` written into a staging directory, as `save_code_action` does."""
    directory = host_ws / "gentools" / "loud" / STAGING
    directory.mkdir(parents=True)
    (directory / "__init__.py").write_text("from gentools.loud.whisper.api import run\n")
    (directory / "api.py").write_text(WHISPER_API)
    (directory / "impl.py").write_text(WHISPER_IMPL)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


async def check_staged(checker: KernelClient, host_ws: Path, staged: Path) -> CheckReport:
    module = "gentools.loud.whisper"
    code = check_code(
        [module, f"{module}.api", f"{module}.impl"], root=host_ws, staged={module: staged}, describe=module
    )
    return parse_check_output((await checker.execute(code, timeout=60)).text or "")


def run_check_in(checker: KernelClient) -> RunCheck:
    async def run_check(code: str) -> str:
        return (await checker.execute(code, timeout=60)).text or ""

    return run_check


async def test_a_staged_action_checked_in_a_kernel_without_the_workspace_reports_no_problems(
    checker: KernelClient, host_ws: Path, staged: Path
) -> None:
    assert (
        await checker.execute(f"import os\nprint(os.path.isdir({str(staged)!r}))", timeout=60)
    ).text == "False"
    report = await check_staged(checker, host_ws, staged)
    assert report.ok, report.problems
    assert report.action is not None and report.action["doc"] == "Whisper through the edge server."
    result = await checker.execute(
        "import sys\nm = sys.modules['gentools.loud.whisper.impl']\nprint(m.__file__)\nprint(m.whisper())",
        timeout=60,
    )
    assert result.text == f"{staged}/impl.py\npsst"


async def test_a_syntax_error_in_a_staged_impl_is_reported_at_its_host_path_and_line(
    checker: KernelClient, host_ws: Path, staged: Path
) -> None:
    (staged / "impl.py").write_text("def whisper() -> str:\n    return 'psst'\n\ndef broken(:\n    pass\n")
    report = await check_staged(checker, host_ws, staged)
    (problem,) = report.problems
    assert (problem.path, problem.line) == (f"{staged}/impl.py", 4)
    assert problem.message.startswith("SyntaxError")


async def test_an_error_raised_in_a_staged_impl_is_located_in_its_host_file(
    checker: KernelClient, host_ws: Path, staged: Path
) -> None:
    (staged / "impl.py").write_text("import mcptools.edge.echo\n\nVALUE = undefined_name\n")
    report = await check_staged(checker, host_ws, staged)
    (problem,) = report.problems
    assert (problem.path, problem.line) == (f"{staged}/impl.py", 3)
    assert problem.message == "NameError: name 'undefined_name' is not defined"


async def test_a_code_action_saved_through_a_kernel_without_the_workspace_runs_there(
    checker: KernelClient, kernel: tuple[CodeExecutor, str], host_ws: Path
) -> None:
    api = WHISPER_API.replace("loud.whisper", "quiet.murmur")
    saved = await save_code_action(
        run_check_in(checker),
        host_ws / "mcptools",
        "quiet",
        "murmur",
        api=api,
        impl=WHISPER_IMPL,
        root=host_ws,
    )
    assert saved.module == "gentools.quiet.murmur"
    assert [p.name for p in (host_ws / "gentools" / "quiet").iterdir() if p.name.startswith(".")] == []
    executor, _ = kernel
    result = await executor.execute("from gentools.quiet.murmur import run\nprint(run())")
    assert result.text == "psst"


async def test_a_save_whose_check_fails_in_a_kernel_without_the_workspace_names_the_final_path(
    checker: KernelClient, host_ws: Path
) -> None:
    api = WHISPER_API.replace("loud.whisper", "quiet.mumble")
    with pytest.raises(CodeActionError) as refused:
        await save_code_action(
            run_check_in(checker),
            host_ws / "mcptools",
            "quiet",
            "mumble",
            api=api,
            impl="VALUE = undefined_name\n",
            root=host_ws,
        )
    message = str(refused.value)
    assert "gentools/quiet/mumble/impl.py:1:" in message, message
    assert "NameError" in message and ".tmp-" not in message
    assert not (host_ws / "gentools" / "quiet" / "mumble").exists()


async def test_install_with_another_protocol_fails_naming_the_ipybox_to_install(
    kernel: tuple[CodeExecutor, str], host: ToolServer, host_ws: Path
) -> None:
    executor, token = kernel
    with pytest.raises(CodeExecutionError) as failed:
        await executor.execute(install_code(host, token, host_ws, protocol=PROTOCOL + 1))
    assert (
        f"the host speaks protocol {PROTOCOL + 1}: install ipybox=={ipybox.__version__} in the kernel image"
        in str(failed.value)
    )
    # The kernel set up before is still set up.
    assert (await executor.execute("import mcptools.edge.echo as m\nprint(m.TOOL_NAME)")).text == "echo"


async def test_install_with_shell_approval_makes_shell_commands_ask_the_tool_server(
    kernel: tuple[CodeExecutor, str], host: ToolServer, host_ws: Path, shell_asked: list[ToolCall]
) -> None:
    executor, token = kernel
    await executor.execute(
        install_code(host, token, host_ws, extensions={"shell_approval": True, "cwd": None})
    )
    with pytest.raises(CodeExecutionError, match="no shell in this test"):
        await executor.execute("!echo may-i")
    assert [(call.tool, call.args, call.caller) for call in shell_asked] == [
        ("shell", {"cmd": "echo may-i"}, "remote-kernel")
    ]
    # The hook was replaced, not doubled: tools still import and run.
    result = await executor.execute(
        "import sys\nfrom mcptools.edge.echo import Params, run\nprint(run(Params(text='still here')))\n"
        "print(sum(type(f).__name__ == 'RemoteModules' for f in sys.meta_path))"
    )
    assert result.text == "still here\n1"
