"""A workspace whose kernels run on a real Jupyter Enterprise Gateway (`[kernel.gateway]`), kernels that see
none of the host's files and reach it only over TCP: code runs, generated tools follow the rules (an `ask`
answered by the attached application), a server added by an edit of `ipybox.toml` is importable at the next
cell, a code action is saved and reused, a plot comes back to the host, and the workspace survives the
gateway restarting. Two workspaces run on the gateway at once, and the suite runs in each: neither reaches
the other's tools."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from ipybox import ApprovalRequest, CodeExecutionResult, CodeExecutor
from ipybox.supervisor import Supervisor
from tests.remote.actions import API, IMPL
from tests.remote.eg import EnterpriseGateway
from tests.servers.processes import TAG_ENV
from tests.supervisor.workspaces import RULES, edge_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ECHO = "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='hi')))"
ASK = "from mcptools.edge import slow\nprint(slow.run(slow.Params(seconds=0)))"


def remote_workspace(directory: Path, gateway: EnterpriseGateway, tag: str) -> Path:
    """A workspace with our edge server and rules, whose kernels come from `gateway`."""
    (directory / ".env").write_text(f"EG_TOKEN={gateway.token}\nWORKSPACE_SECRET=never-in-a-kernel\n")
    (directory / "ipybox.toml").write_text(
        f'[kernel]\nwarm_pool = 1\nenv = {{ {TAG_ENV} = "{tag}" }}\n\n'
        f'[kernel.gateway]\nurl = "{gateway.url}"\ntoken = "${{EG_TOKEN}}"\n'
        f'kernelspec = "{gateway.kernel_name}"\nstart_timeout = 60\n\n'
        "[sandbox]\nenabled = false\n\n" + edge_server(tag) + RULES.format(ask_timeout=10)
    )
    return directory


TAGS = ("remote-ws-a", "remote-ws-b")


@pytest.fixture(scope="module")
async def workspaces(
    enterprise_gateway: EnterpriseGateway, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Supervisor, ...]]:
    """Two workspaces on the one gateway, both running for the whole module: the suite runs once in each
    while the other one's kernels, pool and channel live beside it."""
    supervisors = [
        Supervisor(remote_workspace(tmp_path_factory.mktemp(tag), enterprise_gateway, tag)) for tag in TAGS
    ]
    async with contextlib.AsyncExitStack() as stack:
        for supervisor in supervisors:
            await supervisor.start()
            stack.push_async_callback(supervisor.stop)
        yield tuple(supervisors)


@pytest.fixture(scope="module", params=[0, 1], ids=["first workspace", "second workspace"])
def index(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture(scope="module")
def supervisor(workspaces: tuple[Supervisor, ...], index: int) -> Supervisor:
    return workspaces[index]


@pytest.fixture(scope="module")
def other(workspaces: tuple[Supervisor, ...], index: int) -> Supervisor:
    """The workspace the suite is not running in this time."""
    return workspaces[1 - index]


def tag_of(supervisor: Supervisor) -> str:
    return TAGS[0] if supervisor.workspace.name.startswith(TAGS[0]) else TAGS[1]


@pytest.fixture(scope="module")
async def attached(
    supervisor: Supervisor, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[CodeExecutor]:
    # One application per workspace for the module, as an agent holds one (kernel starts are most of the
    # suite's time); the tests that need a fresh kernel reset it.
    images = tmp_path_factory.mktemp("images")
    async with CodeExecutor(workspace=supervisor.workspace, images_dir=images) as executor:
        yield executor


async def gateway_kernels(gateway: EnterpriseGateway) -> set[str]:
    async with (
        aiohttp.ClientSession(headers=gateway.headers) as http,
        http.get(f"{gateway.url}/api/kernels") as response,
    ):
        return {kernel["id"] for kernel in await response.json()}


async def test_code_runs_on_the_gateway_in_a_kernel_that_cannot_see_the_workspace(
    attached: CodeExecutor, supervisor: Supervisor, enterprise_gateway: EnterpriseGateway
) -> None:
    code = f"import os\nprint(os.path.exists({str(supervisor.workspace)!r}), os.environ.get('{TAG_ENV}'))"
    assert (await attached.execute(code)).text == f"False {tag_of(supervisor)}"
    assert attached.kernel_client.kernel_id in await gateway_kernels(enterprise_gateway)
    status = supervisor.status()
    assert status.gateway.url == enterprise_gateway.url and not status.sandbox
    assert status.gateway.isolation is not None and "cluster" in status.gateway.isolation
    assert "KERNEL_MEMORY_LIMIT" in status.gateway.requested_limits


async def test_the_call_token_never_travels_in_the_start_request(
    attached: CodeExecutor, supervisor: Supervisor, enterprise_gateway: EnterpriseGateway
) -> None:
    # The gateway's own record of what it started the kernel with: no token, no address.
    async with (
        aiohttp.ClientSession(headers=enterprise_gateway.headers) as http,
        http.get(f"{enterprise_gateway.url}/api/kernels/{attached.kernel_client.kernel_id}") as response,
    ):
        model = json.dumps(await response.json())
    assert "IPYBOX_TOOL_TOKEN" not in model
    assert "tls://" not in model
    log = enterprise_gateway.log_path.read_text(errors="replace")
    token = (await attached.execute("import os\nprint(os.environ['IPYBOX_TOOL_TOKEN'])")).text
    assert token and token not in log


async def test_generated_tools_follow_the_rules_from_a_remote_kernel(
    attached: CodeExecutor, supervisor: Supervisor
) -> None:
    assert (await attached.execute(ECHO)).text == "hi"
    denied = await attached.execute(
        "from mcptools.edge import getenv\n"
        "from ipybox.in_kernel.tool_runner import ApprovalRejectedError\n"
        "try:\n    getenv.run(getenv.Params(name='HOME'))\nexcept ApprovalRejectedError as e:\n    print(e)"
    )
    assert denied.text == "edge.getenv was rejected: denied by rule 'no-getenv'"
    # The module came over the channel: its __file__ is the host's path, which the kernel cannot open.
    where = await attached.execute(
        "import mcptools.edge.echo as m, os\nprint(m.__file__, os.path.exists(m.__file__))"
    )
    assert where.text == f"{supervisor.workspace / 'mcptools' / 'edge' / 'echo.py'} False"


async def test_an_ask_from_a_remote_kernel_is_answered_by_the_attached_application(
    attached: CodeExecutor, supervisor: Supervisor
) -> None:
    asked: list[ApprovalRequest] = []
    result: CodeExecutionResult | None = None
    async for item in attached.stream(ASK):
        if isinstance(item, ApprovalRequest):
            asked.append(item)
            await item.accept()
        elif isinstance(item, CodeExecutionResult):
            result = item
    assert [(r.server_name, r.tool_name) for r in asked] == [("edge", "slow")]
    assert result is not None and result.text == "slept 0.0"
    last = json.loads(supervisor.paths.audit.read_text().splitlines()[-1])
    assert (last["tool"], last["decision"], last["decided_by"]) == ("slow", "allow", "application")


async def test_a_server_added_by_an_edit_is_importable_at_the_next_cell_of_the_same_kernel(
    attached: CodeExecutor, supervisor: Supervisor
) -> None:
    assert (await attached.execute("x = 41")).text in ("", None)
    config = supervisor.workspace / "ipybox.toml"
    allow = '[[approval.rules]]\nserver = "second"\ntool = "add"\ndecision = "allow"\n'
    config.write_text(config.read_text() + "\n" + edge_server(tag_of(supervisor), name="second") + allow)
    for _ in range(600):
        server = supervisor.status().reconciler.servers.get("second")
        if server is not None and server.state == "ready":
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"server 'second' never became ready: {supervisor.status().reconciler}")
    result = await attached.execute("from mcptools.second import add\nprint(add.run(add.Params(a=x, b=1)))")
    assert result.text is not None and result.text.splitlines()[-1] == "total=42 operands=[41, 1]"


async def test_a_code_action_is_saved_from_a_remote_kernel_and_reused_after_a_reset(
    attached: CodeExecutor, supervisor: Supervisor
) -> None:
    saved = await attached.save_code_action("loud", "shout", api=API, impl=IMPL)
    assert saved.module == "gentools.loud.shout"
    await attached.reset()
    result = await attached.execute(
        "from gentools.loud.shout import Params, run\nprint(run(Params(text='hi')))"
    )
    assert result.text == "HI"


async def test_a_plot_in_a_remote_kernel_comes_back_as_an_image_on_the_host(
    attached: CodeExecutor, supervisor: Supervisor
) -> None:
    result = await attached.execute(
        "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"
    )
    assert len(result.images) == 1
    image = result.images[0]  # written on this machine from the kernel's display message
    assert image.is_file() and image.read_bytes().startswith(b"\x89PNG")


async def test_a_long_output_of_a_remote_kernel_is_saved_whole_on_the_host(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    async with CodeExecutor(
        workspace=supervisor.workspace, output_dir=tmp_path / "outputs", max_output_chars=1000
    ) as executor:
        result = await executor.execute("for i in range(2000):\n    print(f'line {i:04d}')")
    assert result.output_file is not None and result.output_file.is_relative_to(tmp_path / "outputs")
    lines = result.output_file.read_text().splitlines()
    assert lines[0] == "line 0000" and lines[-1] == "line 1999" and len(lines) == 2000


async def test_the_other_workspace_on_the_same_gateway_cannot_be_reached_with_this_ones_token(
    supervisor: Supervisor, other: Supervisor, enterprise_gateway: EnterpriseGateway
) -> None:
    async with (
        CodeExecutor(workspace=supervisor.workspace) as this_app,
        CodeExecutor(workspace=other.workspace) as other_app,
    ):
        results = await asyncio.gather(this_app.execute(ECHO), other_app.execute(ECHO))
        assert [r.text for r in results] == ["hi", "hi"]
        assert this_app.kernel_client.kernel_id != other_app.kernel_client.kernel_id
        # This workspace's kernel, pointed at the other one's channel with its own token, is refused: a
        # token only ever works on the channel that issued it.
        probe = (
            "import os\nfrom ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError\n"
            f"os.environ['IPYBOX_TOOL_CERT'] = {other.tools.remote_certificate_pem()!r}\n"
            f"r = ToolRunner('edge', address={other.tools.remote_address()!r})\n"
            "try:\n    r.run_sync('echo', {'text': 'hi'})\nexcept ToolRunnerError as e:\n    print('refused:', e)"
        )
        refused = await this_app.execute(probe)
        assert refused.text is not None and refused.text.startswith("refused:"), refused.text
    # Both pools' kernels are on the gateway, each workspace's own.
    remaining = await gateway_kernels(enterprise_gateway)
    for workspace in (supervisor, other):
        assert workspace.pool is not None and set(workspace.pool.idle_kernels) <= remaining


async def test_the_workspace_survives_the_gateway_restarting(
    attached: CodeExecutor, supervisor: Supervisor, enterprise_gateway: EnterpriseGateway
) -> None:
    await attached.execute("y = 1")
    restarts = supervisor.status().restarts["gateway"]
    await enterprise_gateway.arestart()  # the supervisor's loop runs meanwhile
    for _ in range(300):  # the watcher checks every 2 s, then refills the pool
        status = supervisor.status()
        if status.restarts["gateway"] > restarts and status.pool.idle >= 1:
            break
        await asyncio.sleep(0.1)
    else:
        status = supervisor.status()
        raise AssertionError(f"the pool was not refilled: {status.pool} {status.restarts} {status.gateway}")
    result = await attached.execute(ECHO)
    assert result.text is not None
    *notices, output = result.text.splitlines()
    assert output == "hi"
    assert any("gateway" in notice for notice in notices), notices
    assert (await attached.execute("print('y' in dir())")).text == "False"  # a fresh kernel: state is gone
