"""network.allowedDomains end to end: a sandboxed kernel reaches an allowed host only through the proxy."""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox import CodeExecutor

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def networked(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[CodeExecutor]:
    base = tmp_path_factory.mktemp("networked")
    policy = base / "policy.json"
    policy.write_text(json.dumps({"network": {"allowedDomains": ["localhost"]}}))
    (base / "workspace").mkdir()
    async with CodeExecutor(working_dir=base / "workspace", sandbox=True, sandbox_config=policy) as executor:
        yield executor


async def run(executor: CodeExecutor, code: str) -> str:
    return ((await executor.execute(textwrap.dedent(code), timeout=60)).text or "").strip()


# The test server listens on the host's loopback. Inside the sandbox `localhost` is the sandbox's own
# loopback, which NO_PROXY keeps local: these requests drop NO_PROXY to go through the proxy, where the
# policy's `localhost` means the host's.
FETCH = """
import os, urllib.request, urllib.error
_saved = {{k: os.environ.pop(k) for k in ("NO_PROXY", "no_proxy") if k in os.environ}}
try:
    print(urllib.request.urlopen({url!r}, timeout=10).read().decode().splitlines()[0])
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
except OSError as e:
    print("failed:", e)
finally:
    os.environ.update(_saved)
"""


async def test_an_allowed_host_is_reached_through_the_proxy(
    networked: CodeExecutor, host_http_server: int
) -> None:
    out = await run(networked, FETCH.format(url=f"http://localhost:{host_http_server}/hello"))
    assert out == "GET /hello"


async def test_https_style_tunnels_work(networked: CodeExecutor, host_http_server: int) -> None:
    code = f"""
    import http.client, os
    proxy = os.environ["HTTPS_PROXY"].removeprefix("http://")
    conn = http.client.HTTPConnection(*proxy.split(":"), timeout=10)
    conn.set_tunnel("localhost", {host_http_server})
    conn.request("GET", "/tunnelled")
    print(conn.getresponse().read().decode().splitlines()[0])
    """
    assert await run(networked, code) == "GET /tunnelled"


async def test_the_same_server_is_unreachable_directly(
    networked: CodeExecutor, host_http_server: int
) -> None:
    code = f"""
    import socket
    try:
        socket.create_connection(("127.0.0.1", {host_http_server}), timeout=3)
        print("connected")
    except OSError as e:
        print("blocked")
    """
    assert await run(networked, code) == "blocked"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "http://127.0.0.1:{port}/",
            "403 ipybox sandbox: 127.0.0.1 is not in network.allowedDomains; a person allows it by adding it",
        ),
        (
            "http://example.com/",
            "403 ipybox sandbox: example.com is not in network.allowedDomains; a person allows it by adding it",
        ),
    ],
)
async def test_other_hosts_are_refused_by_the_proxy(
    networked: CodeExecutor, host_http_server: int, url: str, expected: str
) -> None:
    assert (await run(networked, FETCH.format(url=url.format(port=host_http_server)))).startswith(expected)


async def test_subprocesses_and_shell_commands_use_the_proxy_too(
    networked: CodeExecutor, host_http_server: int
) -> None:
    fetch = FETCH.format(url=f"http://localhost:{host_http_server}/child")
    code = f"""
    import subprocess, sys
    print(subprocess.run([sys.executable, "-c", {fetch!r}], capture_output=True, text=True).stdout.strip())
    """
    assert await run(networked, code) == "GET /child"
    env = await run(networked, "!env | grep -c '^HTTPS_PROXY=http://127.0.0.1:'")
    assert env == "1"


async def test_the_sandboxs_own_localhost_stays_local(networked: CodeExecutor) -> None:
    code = """
    import http.server, threading, urllib.request
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.handle_request, daemon=True).start()
    print(urllib.request.urlopen(f"http://localhost:{server.server_port}/", timeout=10).status)
    server.server_close()
    """
    assert "200" in (await run(networked, code)).splitlines()


async def test_reset_keeps_the_network_policy(networked: CodeExecutor, host_http_server: int) -> None:
    await networked.reset()
    out = await run(networked, FETCH.format(url=f"http://localhost:{host_http_server}/after-reset"))
    assert out == "GET /after-reset"


async def test_the_proxy_stops_with_the_executor(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"network": {"allowedDomains": ["pypi.org"]}}))
    executor = CodeExecutor(working_dir=tmp_path, sandbox=True, sandbox_config=policy)
    await executor.start()
    proxy = executor._proxy
    assert proxy is not None and proxy.unix_socket is not None
    private_dir = proxy.unix_socket.parent
    await executor.stop()
    assert not private_dir.exists()
