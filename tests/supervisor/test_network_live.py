"""Network policy edits in a running workspace reach its kernels' proxy without replacing them: the same
sandboxed kernel (its process, its variables) is refused a host once `allowedDomains` drops it, and
reaches it again once it is back; the kernel generation stays.

The origin is a plain-HTTP server on 127.0.0.1 (`tests/sandbox/tls_harness.py`); the kernels' `NO_PROXY`
covers local names, so the kernel's code drops it to send its requests through the proxy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.sandbox.platforms import sandbox_supported
from ipybox.supervisor import Supervisor
from tests.sandbox.tls_harness import OriginServer, start_origin
from tests.supervisor.workspaces import sandboxed_kernels

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sandbox_supported(), reason="the sandbox can't run here (ipybox doctor)"),
]


def workspace_file(allowed: str) -> str:
    return sandboxed_kernels(f"allowedDomains = {allowed}")


@pytest.fixture
async def origin(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OriginServer]:
    server = await start_origin(tmp_path_factory.mktemp("network-origin"), tls=False)
    try:
        yield server
    finally:
        server.close()


def request_code(port: int) -> str:
    """The kernel's pid, `kept`, and what a request to the origin through `HTTP_PROXY` got."""
    return (
        "import json, os, urllib.error, urllib.request\n"
        "for name in ('NO_PROXY', 'no_proxy'):\n"
        "    os.environ.pop(name, None)\n"
        "try:\n"
        f"    with urllib.request.urlopen('http://localhost:{port}/x', timeout=30) as response:\n"
        "        got = [response.status, response.read().decode()]\n"
        "except urllib.error.HTTPError as e:\n"
        "    got = [e.code, e.read().decode()]\n"
        "print(json.dumps({'pid': os.getpid(), 'kept': kept, 'got': got}))\n"
    )


async def test_an_edit_of_allowed_domains_applies_to_the_running_kernel(
    tmp_path: Path, origin: OriginServer, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "ipybox.toml").write_text(workspace_file('["localhost"]'))
    supervisor = Supervisor(tmp_path)
    await supervisor.start()
    try:
        assert supervisor.reconciler is not None
        async with CodeExecutor(workspace=tmp_path) as executor:

            async def request() -> dict[str, object]:
                out = (
                    (await executor.execute(request_code(origin.origin.port), timeout=60)).text or ""
                ).strip()
                result: dict[str, object] = json.loads(out.splitlines()[-1])
                return result

            await executor.execute("kept = 'set before the edits'", timeout=60)
            generation = supervisor.kernel_generation
            first = await request()
            assert first["got"] == [200, "GET /x body=0 conn=1"], first

            (tmp_path / "ipybox.toml").write_text(workspace_file('["example.invalid"]'))
            with caplog.at_level(logging.INFO, logger="ipybox.supervisor.supervisor"):
                assert await supervisor.reconciler.reload()
            assert "network policy updated for running kernels" in caplog.text
            refused = await request()
            assert refused["pid"] == first["pid"] and refused["kept"] == "set before the edits"
            status, body = refused["got"]  # type: ignore[misc]
            assert status == 403 and "localhost is not in network.allowedDomains" in body, refused

            (tmp_path / "ipybox.toml").write_text(workspace_file('["localhost"]'))
            assert await supervisor.reconciler.reload()
            again = await request()
            assert again["pid"] == first["pid"] and again["got"][0] == 200, again  # type: ignore[index]
            assert supervisor.kernel_generation == generation
    finally:
        await supervisor.stop()
