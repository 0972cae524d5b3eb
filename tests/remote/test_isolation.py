"""A kernel started through the Enterprise Gateway sees none of the host's files and reaches it only over
TCP; the gateway serves no one without its token. Attacker-side: code in the kernel tries, and each test
asserts how it failed (or, for TCP, that it worked)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.kernels.kernel_client import ExecutionTimeoutError, KernelClient
from ipybox.paths import user_state_dir
from tests.remote.eg import KERNEL_HOME, REPO_ROOT, EnterpriseGateway

pytestmark = pytest.mark.integration


def attempt(action: str) -> str:
    """Code that prints `ok: <result>` when `action` (an expression) works, else `denied: <error type>`."""
    return f"try:\n    print('ok:', {action})\nexcept Exception as e:\n    print('denied:', type(e).__name__)"


@pytest.fixture(scope="module")
async def remote(
    enterprise_gateway: EnterpriseGateway, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[KernelClient]:
    """One kernel through the gateway for the module's attempts."""
    endpoint = GatewayEndpoint(enterprise_gateway.url, enterprise_gateway.token)
    images = tmp_path_factory.mktemp("remote-images")
    async with KernelClient(
        endpoint, kernel_name=enterprise_gateway.kernel_name, spare_kernel=False, images_dir=images
    ) as client:
        yield client


async def run(client: KernelClient, code: str) -> str:
    return ((await client.execute(code, timeout=60)).text or "").strip()


def visible_names(enterprise_gateway: EnterpriseGateway, directory: Path) -> set[str]:
    """The entries of `directory` a kernel may see: those that lead to a path bound into its sandbox, or to
    its own (empty) home."""
    assert enterprise_gateway.kernelspec is not None
    return {
        path.relative_to(directory).parts[0]
        for path in (*enterprise_gateway.kernelspec.binds, Path(KERNEL_HOME))
        if path.is_relative_to(directory) and path != directory
    }


# -- what a remote kernel is


async def test_a_remote_kernel_runs_the_project_venv_with_ipybox(remote: KernelClient) -> None:
    code = "import sys, ipybox, pydantic, matplotlib, ipykernel; print(sys.prefix)"
    assert await run(remote, code) == str(REPO_ROOT / ".venv")


async def test_a_remote_kernel_cannot_change_its_image(remote: KernelClient) -> None:
    target = REPO_ROOT / ".venv" / f"remote-probe-{os.getpid()}"  # inert, should it ever be written
    try:
        assert await run(remote, attempt(f"open({str(target)!r}, 'w')")) == "denied: OSError"
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


# -- the host's files


async def test_the_workspace_is_not_visible_to_a_remote_kernel(remote: KernelClient, tmp_path: Path) -> None:
    secret = tmp_path / "notes.txt"
    secret.write_text("workspace secret")
    assert await run(remote, attempt(f"open({str(secret)!r}).read()")) == "denied: FileNotFoundError"
    listing = attempt(f"__import__('os').listdir({str(tmp_path)!r})")
    assert await run(remote, listing) == "denied: FileNotFoundError"


async def test_the_hosts_tmp_is_not_visible_to_a_remote_kernel(remote: KernelClient) -> None:
    with tempfile.NamedTemporaryFile("w", dir="/tmp", prefix="ipybox-host-") as secret:
        secret.write("host tmp secret")
        secret.flush()
        assert await run(remote, attempt(f"open({secret.name!r}).read()")) == "denied: FileNotFoundError"
        listing = await run(remote, "import os; print(sorted(os.listdir('/tmp')))")
        assert Path(secret.name).name not in listing


async def test_the_repository_is_not_visible_to_a_remote_kernel(
    remote: KernelClient, enterprise_gateway: EnterpriseGateway
) -> None:
    for path in (Path(__file__), REPO_ROOT / "pyproject.toml", REPO_ROOT / "tests" / "conftest.py"):
        assert path.exists()
        assert await run(remote, attempt(f"open({str(path)!r}).read()")) == "denied: FileNotFoundError"
    # Only the kernel image's parts of the checkout (the venv, the ipybox package) are there.
    listing = json.loads(
        await run(remote, f"import os, json; print(json.dumps(os.listdir({str(REPO_ROOT)!r})))")
    )
    assert set(listing) <= visible_names(enterprise_gateway, REPO_ROOT) < set(os.listdir(REPO_ROOT))


async def test_the_state_directory_is_not_visible_to_a_remote_kernel(remote: KernelClient) -> None:
    state = user_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    marker = state / "remote-isolation-probe"
    marker.write_text("host state")
    try:
        assert await run(remote, attempt(f"open({str(marker)!r}).read()")) == "denied: FileNotFoundError"
    finally:
        marker.unlink()


async def test_home_directories_are_not_visible_to_a_remote_kernel(
    remote: KernelClient, enterprise_gateway: EnterpriseGateway
) -> None:
    hidden_somewhere = False
    for directory in {Path.home(), Path("/root"), Path("/home")}:
        if not directory.is_dir() or not os.access(directory, os.R_OK):
            continue
        allowed = visible_names(enterprise_gateway, directory)
        hidden = set(os.listdir(directory)) - allowed
        hidden_somewhere = hidden_somewhere or bool(hidden)
        code = f"import os, json; print(json.dumps(os.listdir({str(directory)!r}) if os.path.isdir({str(directory)!r}) else []))"
        seen = set(json.loads(await run(remote, code)))
        assert seen <= allowed, f"{directory}: the kernel sees {sorted(seen - allowed)}"
    assert hidden_somewhere  # there was something on the host to hide


async def test_proc_shows_only_the_kernels_own_processes(remote: KernelClient) -> None:
    code = (
        "import os, json\n"
        "found = {}\n"
        "for pid in (p for p in os.listdir('/proc') if p.isdigit()):\n"
        "    try:\n"
        "        found[pid] = open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode()\n"
        "    except OSError:\n"
        "        pass\n"
        "print(json.dumps(found))"
    )
    processes = json.loads(await run(remote, code))
    # bubblewrap as the namespace's init, and the kernel itself.
    assert 1 <= len(processes) <= 3, processes
    for cmdline in processes.values():
        assert "ipykernel_launcher" in cmdline or cmdline.split(" ")[0].endswith("bwrap"), cmdline
    # Not this test process, nor the gateway.
    host = {
        Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode(),
        "jupyter-enterprisegateway",
    }
    assert not any(mine in cmdline for cmdline in processes.values() for mine in host)


# -- the network


async def test_a_remote_kernel_reaches_the_host_over_tcp(remote: KernelClient, host_tcp_server: int) -> None:
    code = (
        "import socket\n"
        f"with socket.create_connection(('127.0.0.1', {host_tcp_server}), timeout=10) as s:\n"
        "    print(s.makefile().readline().strip())"
    )
    assert await run(remote, code) == "host secret"


# -- the gateway


@pytest.mark.parametrize("token", ["", "wrong"], ids=["no token", "a wrong token"])
def test_the_gateway_refuses_requests_without_its_token(
    enterprise_gateway: EnterpriseGateway, token: str
) -> None:
    for method, path, body in (
        ("GET", "/api/kernelspecs", None),
        ("GET", "/api/kernels", None),
        ("POST", "/api/kernels", {"name": enterprise_gateway.kernel_name}),
    ):
        status, _ = enterprise_gateway.request(method, path, token=token, body=body)
        assert status in (401, 403), f"{method} {path}: {status}"
    assert enterprise_gateway.request("GET", "/api/kernels")[0] == 200


async def test_the_gateway_refuses_a_kernel_websocket_without_its_token(
    remote: KernelClient, enterprise_gateway: EnterpriseGateway
) -> None:
    url = f"ws://127.0.0.1:{enterprise_gateway.port}/api/kernels/{remote.kernel_id}/channels"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(url)
    assert refused.value.status in (401, 403)


async def test_only_kernel_variables_of_the_start_request_reach_a_remote_kernel(
    enterprise_gateway: EnterpriseGateway, tmp_path: Path
) -> None:
    endpoint = GatewayEndpoint(enterprise_gateway.url, enterprise_gateway.token)
    env = {"KERNEL_IPYBOX_PROBE": "passed", "IPYBOX_PROBE": "dropped"}
    async with KernelClient(
        endpoint,
        kernel_name=enterprise_gateway.kernel_name,
        kernel_env=env,
        spare_kernel=False,
        images_dir=tmp_path,
    ) as client:
        seen = json.loads(await run(client, "import os, json; print(json.dumps(dict(os.environ)))"))
    assert seen.get("KERNEL_IPYBOX_PROBE") == "passed"
    assert "IPYBOX_PROBE" not in seen
    assert enterprise_gateway.token not in json.dumps(seen)


async def test_a_timed_out_cell_in_a_remote_kernel_is_interrupted_and_the_kernel_kept(
    remote: KernelClient,
) -> None:
    await remote.execute("kept = 42")
    with pytest.raises(ExecutionTimeoutError) as timed_out:
        await remote.execute("import time; time.sleep(60)", timeout=2)
    assert not timed_out.value.kernel_restarted
    assert await run(remote, "print(kept)") == "42"
