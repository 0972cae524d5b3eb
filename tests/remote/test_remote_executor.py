"""An embedded `CodeExecutor` (no workspace) whose kernels run on a real Jupyter Enterprise Gateway
(`kernel_gateway_url=`), kernels that see none of the host's files and reach it only over TCP: code runs,
a generated tool is called (and approved) from the remote kernel, `reset()` gives a fresh kernel that still
imports it, a code action is saved and reused, a wrong token or kernel spec is one clear error before
anything starts, and `stop()` leaves no kernel on the gateway."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from ipybox import (
    ApprovalRequest,
    CodeExecutionError,
    CodeExecutionResult,
    CodeExecutor,
    generate_mcp_sources,
)
from ipybox.executor.options import EmbeddedOptions, ExternalGateway, KernelOptions
from ipybox.kernels.gateway import GatewayStartError
from ipybox.mcp_apigen.sources import wait_for_stopped_servers
from tests.remote.actions import API, IMPL
from tests.remote.eg import EnterpriseGateway
from tests.servers import params
from tests.servers.processes import tagged

pytestmark = pytest.mark.integration

TAG = "remote-executor"
ECHO = "from mcptools.edge import echo\nprint(echo.run(echo.Params(text='hi')))"


@pytest.fixture(scope="module")
async def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory whose `mcptools/edge` was generated from our edge server (as the README does)."""
    work = tmp_path_factory.mktemp("remote-executor")
    await generate_mcp_sources("edge", tagged(params.edge(), TAG), work / "mcptools")
    await wait_for_stopped_servers()
    return work


@pytest.fixture(scope="module")
async def executor(enterprise_gateway: EnterpriseGateway, work: Path) -> AsyncIterator[CodeExecutor]:
    async with CodeExecutor(
        kernel_gateway_url=enterprise_gateway.url,
        kernel_gateway_token=enterprise_gateway.token,
        working_dir=work,
        kernel_env={"KERNEL_GREETING": "hi", "PLAIN_VAR": "plain"},
        kernel_init_timeout=60,
    ) as ex:
        yield ex


async def gateway_kernels(gateway: EnterpriseGateway) -> set[str]:
    async with (
        aiohttp.ClientSession(headers=gateway.headers) as http,
        http.get(f"{gateway.url}/api/kernels") as response,
    ):
        return {kernel["id"] for kernel in await response.json()}


async def eventually(holds: Callable[[set[str]], bool], gateway: EnterpriseGateway) -> set[str]:
    """The gateway's kernels once `holds` says yes of them (within 30 seconds)."""
    for _ in range(300):
        kernels = await gateway_kernels(gateway)
        if holds(kernels):
            return kernels
        await asyncio.sleep(0.1)
    raise AssertionError(f"the gateway's kernels never became as expected: {kernels}")


async def test_code_runs_on_the_gateway_in_a_kernel_that_cannot_see_the_working_dir(
    executor: CodeExecutor, enterprise_gateway: EnterpriseGateway, work: Path
) -> None:
    code = f"import os\nprint(os.path.exists({str(work)!r}), os.environ['KERNEL_GREETING'], os.environ['PLAIN_VAR'])"
    assert (await executor.execute(code)).text == "False hi plain"
    assert executor.kernel_gateway is None
    assert executor.kernel_client.kernel_id in await gateway_kernels(enterprise_gateway)


async def test_the_call_token_never_travels_in_the_start_request(
    executor: CodeExecutor, enterprise_gateway: EnterpriseGateway
) -> None:
    async with (
        aiohttp.ClientSession(headers=enterprise_gateway.headers) as http,
        http.get(f"{enterprise_gateway.url}/api/kernels/{executor.kernel_client.kernel_id}") as response,
    ):
        model = json.dumps(await response.json())
    assert "IPYBOX_TOOL_TOKEN" not in model and "tls://" not in model
    assert executor.kernel_client.kernel_env == {"KERNEL_GREETING": "hi"}  # what the requests carry
    token = (await executor.execute("import os\nprint(os.environ['IPYBOX_TOOL_TOKEN'])")).text
    assert token and token not in enterprise_gateway.log_path.read_text(errors="replace")


async def test_a_generated_tool_is_called_from_the_remote_kernel_after_approval(
    executor: CodeExecutor, work: Path
) -> None:
    asked: list[ApprovalRequest] = []
    result: CodeExecutionResult | None = None
    async for item in executor.stream(ECHO):
        if isinstance(item, ApprovalRequest):
            asked.append(item)
            await item.accept()
        elif isinstance(item, CodeExecutionResult):
            result = item
    assert [(r.server_name, r.tool_name) for r in asked] == [("edge", "echo")]
    assert result is not None and result.text == "hi"
    # The module came over the call channel: its __file__ is the host's path, which the kernel can't open.
    where = await executor.execute(
        "import mcptools.edge.echo as m, os\nprint(m.__file__, os.path.exists(m.__file__))"
    )
    assert where.text == f"{work / 'mcptools' / 'edge' / 'echo.py'} False"


async def test_reset_gives_a_fresh_remote_kernel_that_still_imports_the_tool(
    executor: CodeExecutor, enterprise_gateway: EnterpriseGateway
) -> None:
    await executor.execute("kept = 1")
    before = executor.kernel_client.kernel_id
    await executor.reset()
    assert executor.kernel_client.kernel_id != before
    with pytest.raises(CodeExecutionError, match="NameError"):
        await executor.execute("print(kept)")
    assert (await executor.execute(ECHO)).text == "hi"
    await eventually(lambda kernels: before not in kernels, enterprise_gateway)  # retired in the background


async def test_a_code_action_is_saved_and_reused_from_a_remote_kernel(executor: CodeExecutor) -> None:
    # Saving checks the action in a fresh kernel of the gateway (`run_in_fresh_kernel`), set up as well.
    saved = await executor.save_code_action("loud", "shout", api=API, impl=IMPL)
    assert saved.module == "gentools.loud.shout"
    result = await executor.execute(
        "from gentools.loud.shout import Params, run\nprint(run(Params(text='hi')))"
    )
    assert result.text == "HI"


async def test_a_wrong_token_is_one_clear_error_before_anything_starts(
    enterprise_gateway: EnterpriseGateway,
) -> None:
    with pytest.raises(GatewayStartError, match=r"refused the token .*check kernel_gateway_token"):
        async with CodeExecutor(kernel_gateway_url=enterprise_gateway.url, kernel_gateway_token="wrong"):
            pass


async def test_a_missing_kernelspec_is_one_clear_error_naming_those_offered(
    enterprise_gateway: EnterpriseGateway,
) -> None:
    options = EmbeddedOptions(
        gateway=ExternalGateway(enterprise_gateway.url, enterprise_gateway.token, kernelspec="no-such-spec")
    )
    with pytest.raises(
        GatewayStartError, match=rf"no kernel spec 'no-such-spec' .*offers: {enterprise_gateway.kernel_name}"
    ):
        async with CodeExecutor(options=options):
            pass


async def test_stop_leaves_no_kernel_on_the_gateway_and_no_certificate_behind(
    enterprise_gateway: EnterpriseGateway, work: Path
) -> None:
    before = await gateway_kernels(enterprise_gateway)
    options = EmbeddedOptions(
        kernel=KernelOptions(working_dir=work, spare_kernel=True),
        gateway=ExternalGateway(
            enterprise_gateway.url, enterprise_gateway.token, kernelspec=enterprise_gateway.kernel_name
        ),
    )
    async with CodeExecutor(options=options) as ex:
        assert (await ex.execute(ECHO)).text == "hi"
        # The spare, still being set up or warmed up, is on the gateway too.
        mine = await eventually(lambda kernels: len(kernels - before) == 2, enterprise_gateway)
        cert_dir = ex._backend._external._cert_dir  # type: ignore[union-attr]
        assert cert_dir is not None and (cert_dir / "cert.pem").is_file()
    assert not (mine - before) & await gateway_kernels(enterprise_gateway)
    assert not cert_dir.exists()
