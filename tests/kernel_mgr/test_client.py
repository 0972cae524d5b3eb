"""`ipybox.kernel_mgr.client.KernelClient`, ipybox 0.9's kernel client, against a 0.9-style
`KernelGateway`: the reference docs' examples as written (host and port only: the token comes from the file
the gateway publishes), `str` chunks then the result, `kernel_id`, `reset()`, errors and timeouts; a client
that finds no token gets one clear error; shell approval and `working_dir` set up on every new kernel."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox.approval.approval_client import ApprovalClient
from ipybox.approval.request import ApprovalRequest
from ipybox.kernel_mgr.client import ExecutionError, ExecutionResult, KernelClient
from ipybox.kernel_mgr.server import KernelGateway
from ipybox.kernels.kernel_connection import GatewayError, GatewayUnreachableError
from ipybox.kernels.result import CodeExecutionError, CodeExecutionResult
from ipybox.tool_server.tool_server import ToolServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[KernelGateway]:
    async with KernelGateway(host="localhost", port=0) as gateway:
        yield gateway


def test_the_result_and_error_names_are_ipyboxs_own_classes() -> None:
    assert ExecutionResult is CodeExecutionResult and ExecutionError is CodeExecutionError


def test_require_shell_escape_needs_approve_shell_cmds() -> None:
    with pytest.raises(ValueError, match="needs approve_shell_cmds=True"):
        KernelClient(require_shell_escape=True)


async def test_the_documented_example_runs_with_host_and_port_only(gateway: KernelGateway) -> None:
    async with KernelClient(host="localhost", port=gateway.port) as client:
        result = await client.execute("print('hello')")
        assert isinstance(result, ExecutionResult) and result.text == "hello" and result.images == []

        items: list[str | ExecutionResult] = []
        # The sleep outlasts ipykernel's 0.2 s flush interval, so chunk 1 arrives alone; how the kernel splits
        # the second print (text and newline may come as two writes) is its own business.
        async for item in client.stream("import time\nprint('chunk 1')\ntime.sleep(0.5)\nprint('chunk 2')"):
            match item:
                case str():
                    items.append(item)
                case ExecutionResult():
                    items.append(item)
        chunks = items[:-1]
        assert chunks[0] == "chunk 1\n" and "".join(str(chunk) for chunk in chunks) == "chunk 1\nchunk 2\n"
        last = items[-1]
        assert isinstance(last, ExecutionResult) and last.text == "chunk 1\nchunk 2"


async def test_kernel_id_reset_and_errors(gateway: KernelGateway) -> None:
    client = KernelClient(host="localhost", port=gateway.port)
    with pytest.raises(RuntimeError, match="Not connected"):
        _ = client.kernel_id
    await client.connect(retries=3, retry_interval=0.5)
    try:
        first = client.kernel_id
        await client.execute("x = 41")
        assert (await client.execute("print(x + 1)")).text == "42"
        await client.reset()
        assert client.kernel_id != first
        with pytest.raises(ExecutionError, match="NameError"):
            await client.execute("print(x)")
        with pytest.raises(ExecutionError) as raised:
            await client.execute("1 / 0")
        assert raised.value.ename == "ZeroDivisionError" and "ZeroDivisionError" in str(raised.value)
    finally:
        await client.disconnect()
    with pytest.raises(RuntimeError, match="Not connected"):
        _ = client.kernel_id


async def test_a_timeout_interrupts_the_code_and_the_kernel_keeps_its_state(gateway: KernelGateway) -> None:
    async with KernelClient(port=gateway.port) as client:
        await client.execute("y = 'kept'")
        with pytest.raises(TimeoutError, match=r"exceeded timeout of 0\.50s"):
            await client.execute("import time\ntime.sleep(30)", timeout=0.5)
        assert (await client.execute("print(y)")).text == "kept"


async def test_interrupt_stops_a_running_cell(gateway: KernelGateway) -> None:
    async with KernelClient(port=gateway.port) as client:
        chunks: list[str] = []
        with pytest.raises(ExecutionError, match="KeyboardInterrupt"):
            async with asyncio.timeout(30):
                async for item in client.stream("import time\nprint('started', flush=True)\ntime.sleep(30)"):
                    if isinstance(item, str):
                        chunks.append(item)
                        await client.interrupt()  # the cell is running: it printed
        assert chunks == ["started\n"]
        assert (await client.execute("print('ready')")).text == "ready"


async def test_a_client_without_the_token_gets_one_clear_error(gateway: KernelGateway) -> None:
    path = gateway.token_file
    assert path is not None
    hidden = path.with_name(path.name + ".hidden")
    path.rename(hidden)
    try:
        with pytest.raises(GatewayError) as raised:
            await KernelClient(port=gateway.port).connect(retries=5, retry_interval=0.1)
    finally:
        hidden.rename(path)
    message = str(raised.value)
    assert isinstance(raised.value, RuntimeError)
    assert "requires an auth token" in message and str(path) in message and "token=" in message


async def test_a_tiny_kernel_init_timeout_fails_connect_with_timeout_error_also_with_nothing_to_set_up(
    gateway: KernelGateway,
) -> None:
    # As 0.9.2, whose setup code ran on every new kernel within kernel_init_timeout.
    client = KernelClient(port=gateway.port, kernel_init_timeout=0.001)
    with pytest.raises(TimeoutError, match="kernel_init_timeout"):
        await client.connect()
    with pytest.raises(RuntimeError, match="Not connected"):
        _ = client.kernel_id
    with pytest.raises(TimeoutError, match="kernel_init_timeout"):
        async with KernelClient(port=gateway.port, kernel_init_timeout=0.001):
            pass


async def test_connect_gives_up_after_its_retries_naming_where_it_tried() -> None:
    client = KernelClient(host="localhost", port=1)
    with pytest.raises(GatewayUnreachableError) as raised:
        await client.connect(retries=2, retry_interval=0.05)
    assert isinstance(raised.value, RuntimeError)
    assert "http://localhost:1" in str(raised.value) and "2 attempt(s)" in str(raised.value)


async def test_each_cell_starts_in_working_dir_again_also_after_reset(
    gateway: KernelGateway, tmp_path: Path
) -> None:
    (tmp_path / "sub").mkdir()
    async with KernelClient(port=gateway.port, working_dir=tmp_path) as client:
        assert (await client.execute("import os\nprint(os.getcwd())")).text == str(tmp_path)
        moved = await client.execute("os.chdir('sub')\nprint(os.getcwd())")
        assert moved.text == f"{tmp_path / 'sub'}\n[ipybox] cwd reset to {tmp_path}"
        await client.reset()
        assert (await client.execute("import os\nos.chdir('/')")).text == f"[ipybox] cwd reset to {tmp_path}"


class Approvals:
    """An application answering shell-command approvals from a list, recording what it was asked."""

    def __init__(self) -> None:
        self.answers: list[bool] = []
        self.seen: list[tuple[str, str, dict[str, object]]] = []

    async def __call__(self, request: ApprovalRequest) -> None:
        self.seen.append((request.server_name, request.tool_name, dict(request.tool_args)))
        await (request.accept() if (self.answers.pop(0) if self.answers else False) else request.reject())


async def test_shell_commands_ask_the_tool_server_named_in_the_kernels_environment(tmp_path: Path) -> None:
    approvals = Approvals()
    marker = tmp_path / "created"
    async with (
        ToolServer(approval_required=True, approval_timeout=10) as tools,
        ApprovalClient(approvals, address=tools.address, token=tools.token),
        KernelGateway(port=0, env=tools.kernel_env) as gateway,
        KernelClient(port=gateway.port, approve_shell_cmds=True, require_shell_escape=True) as client,
    ):
        approvals.answers[:] = [False]
        with pytest.raises(ExecutionError, match="ApprovalRejectedError"):
            await client.execute(f"!touch {marker}")
        assert not marker.exists()
        assert approvals.seen == [("ipybox", "shell", {"cmd": f"touch {marker}"})]

        approvals.answers[:] = [True]
        await client.execute(f"!touch {marker}")
        assert marker.exists()

        # 0.9.2's text, which callers may match on.
        with pytest.raises(ExecutionError, match=r"Direct subprocess calls are not allowed\. Use ! syntax\."):
            await client.execute("import subprocess\nsubprocess.run(['true'])")

        await client.reset()  # the fresh kernel is set up again
        approvals.answers[:] = [False]
        with pytest.raises(ExecutionError, match="ApprovalRejectedError"):
            await client.execute("x = !echo unasked")
        assert approvals.seen[-1] == ("ipybox", "shell", {"cmd": "echo unasked"})


async def test_a_kernel_that_cannot_be_set_up_is_not_kept(gateway: KernelGateway, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    client = KernelClient(port=gateway.port, working_dir=gone)
    shutil.rmtree(gone)
    with pytest.raises(ExecutionError, match="setting up the new kernel failed"):
        await client.connect()
    with pytest.raises(RuntimeError, match="Not connected"):
        _ = client.kernel_id
