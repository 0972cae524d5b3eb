"""`[secrets]` end to end in a running workspace: a sandboxed kernel holds a placeholder, sends it to a
secret host through the workspace's proxy, and the origin receives the real value; the kernel finds the
value nowhere it can look (its environment, `/proc/self/environ`, the files it can read under the
workspace and `/tmp`), nor the CA's key. A secret that can't be resolved stops `ipybox up` with one line.

The origin is an asyncio TLS server on 127.0.0.1 (`tests/sandbox/tls_harness.py`) whose certificate a test
CA signs. The proxy runs in this process and verifies upstream hosts with `ssl.create_default_context()`:
`SSL_CERT_FILE` in this process's environment, set to the test CA for the module, makes it trust the
origin (no product setting exists for tests).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.config.secrets import PLACEHOLDER_PREFIX
from ipybox.sandbox.platforms import sandbox_supported
from ipybox.supervisor import Supervisor
from tests.sandbox.tls_harness import OriginServer, start_origin
from tests.supervisor.workspaces import sandboxed_kernels

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sandbox_supported(), reason="the sandbox can't run here (ipybox doctor)"),
]

# Made at run time: no file a sandboxed kernel can read (this test's source among them) holds it.
REAL = "real-demo-token-" + secrets.token_hex(8)
"""The secret's value, in the workspace's `.env` (hidden from kernels)."""


def workspace_file() -> str:
    return sandboxed_kernels('allowedDomains = ["localhost"]') + (
        "[secrets.demo]\n"
        'value = "${DEMO_TOKEN}"\n'
        'env = "DEMO_TOKEN"\n'
        'hosts = ["localhost"]\n'
        'headers = ["Authorization"]\n'
    )


@dataclass
class Live:
    supervisor: Supervisor
    origin: OriginServer

    @property
    def workspace(self) -> Path:
        return self.supervisor.workspace

    async def run(self, code: str) -> str:
        async with CodeExecutor(workspace=self.workspace) as executor:
            return ((await executor.execute(code, timeout=60)).text or "").strip()


@pytest.fixture(scope="module")
async def live(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Live]:
    directory = tmp_path_factory.mktemp("secrets-live")
    origin = await start_origin(tmp_path_factory.mktemp("secrets-origin"))
    test_ca = tmp_path_factory.mktemp("secrets-ca") / "test-ca.pem"
    test_ca.write_bytes(origin.test_ca_pem)
    before = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = str(test_ca)  # the proxy (in this process) trusts the origin
    (directory / "ipybox.toml").write_text(workspace_file())
    (directory / ".env").write_text(f"DEMO_TOKEN={REAL}\n")
    (directory / "bin").mkdir()  # as a virtual environment's would be: kernels can write in it
    supervisor = Supervisor(directory)
    try:
        await supervisor.start()
        yield Live(supervisor, origin)
    finally:
        await supervisor.stop()
        origin.close()
        if before is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = before


def request_code(port: int, variable: str = "DEMO_TOKEN") -> str:
    """A kernel's request with its placeholder, through `HTTPS_PROXY`, trusting `SSL_CERT_FILE`."""
    return (
        "import json, os, urllib.request\n"
        # The proxy variables leave local names out (NO_PROXY): the test origin is one, a real host isn't.
        "for name in ('NO_PROXY', 'no_proxy'):\n"
        "    os.environ.pop(name, None)\n"
        f"token = os.environ[{variable!r}]\n"
        f"request = urllib.request.Request('https://localhost:{port}/x', "
        "headers={'Authorization': f'Bearer {token}'})\n"
        "with urllib.request.urlopen(request, timeout=30) as response:\n"
        "    body = response.read().decode()\n"
        "print(json.dumps({'token': token, 'body': body, 'trust': os.environ.get('SSL_CERT_FILE')}))\n"
    )


async def test_the_origin_gets_the_value_and_the_kernel_the_placeholder(live: Live) -> None:
    out = await live.run(request_code(live.origin.origin.port))
    result = json.loads(out.splitlines()[-1])
    assert result["token"].startswith(f"{PLACEHOLDER_PREFIX}demo-"), out
    assert REAL not in out
    assert result["body"].startswith("GET /x "), out
    heads = live.origin.origin.heads()
    assert any(f"\r\nAuthorization: Bearer {REAL}\r\n" in head for head in heads), heads
    assert not any(result["token"] in head for head in heads), "the placeholder reached the origin"
    assert result["trust"] and "/trust/" in result["trust"], result


async def test_the_kernel_finds_the_value_nowhere_it_can_look(live: Live) -> None:
    state_dir = live.supervisor.paths.dir
    # The value is built at run time, so the cell's source (which IPython may keep) does not hold it.
    code = (
        "import os, subprocess\n"
        f"real = bytes.fromhex({REAL.encode().hex()!r}).decode()\n"
        "found = []\n"
        "if any(real in value for value in os.environ.values()):\n"
        "    found.append('os.environ')\n"
        "if real.encode() in open('/proc/self/environ', 'rb').read():\n"
        "    found.append('/proc/self/environ')\n"
        f"grep = subprocess.run(['grep', '-rlF', '-D', 'skip', real, {str(live.workspace)!r}, '/tmp'], "
        "capture_output=True, text=True)\n"
        "found += grep.stdout.split()\n"
        "for path in [\n"
        f"    {str(live.workspace / '.env')!r},\n"
        f"    {str(state_dir / 'interception' / 'ca-key.pem')!r},\n"
        f"    {str(state_dir / 'audit.jsonl')!r},\n"
        "]:\n"
        "    try:\n"
        "        open(path, 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        "    else:\n"
        "        found.append('readable: ' + path)\n"
        # A control: the same search finds what the kernel may read (its config, the trust bundle).
        f"control = subprocess.run(['grep', '-rlF', '-D', 'skip', 'allowedDomains', {str(live.workspace)!r}], "
        "capture_output=True, text=True)\n"
        "print('found', found)\n"
        "print('control', control.stdout.split())\n"
        "print(grep.stderr.strip())\n"
    )
    out = await live.run(code)
    found, control, *errors = out.splitlines()
    assert found == "found []", out
    assert control == f"control {[str(live.workspace / 'ipybox.toml')]}", out
    # What grep could not read is what the sandbox hides (the .env the value is in; .ipybox is absent).
    assert all(line.endswith("/.env: Permission denied") for line in errors), out
    # On the host: the CA's key is in the state directory, the value only in the proxy's memory.
    assert (state_dir / "interception" / "ca-key.pem").stat().st_mode & 0o077 == 0
    assert live.supervisor.asks.audit.redact({"note": f"x {REAL} y"}) == {"note": "x [redacted] y"}


NODE_CLIENT = r"""
const http = require('http'), tls = require('tls');
const proxy = new URL(process.env.HTTPS_PROXY), target = 'localhost:' + process.argv[1];
const connect = http.request({host: proxy.hostname, port: proxy.port, method: 'CONNECT', path: target});
connect.on('connect', (answer, socket) => {
  const secure = tls.connect({socket, servername: 'localhost'}, () => secure.end(
    'GET /client-node HTTP/1.1\r\nHost: ' + target + '\r\nAuthorization: Bearer ' + process.env.DEMO_TOKEN +
    '\r\nConnection: close\r\n\r\n'));
  secure.on('data', () => {});
  secure.on('error', (e) => { console.log('node: ' + e.message); process.exitCode = 1; });
});
connect.end();
"""


async def test_every_client_the_sandbox_trusts_gets_the_secret_in(live: Live) -> None:
    # Each client finds the workspace CA its own way (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE,
    # GIT_SSL_CAINFO, PIP_CERT, NODE_EXTRA_CA_CERTS): one that did not would fail its TLS handshake with
    # the proxy, and its request would never reach the origin.
    port = live.origin.origin.port
    base = f"https://localhost:{port}"
    code = (
        "import os, subprocess, requests, httpx\n"
        "for name in ('NO_PROXY', 'no_proxy'):\n"
        "    os.environ.pop(name, None)\n"
        "auth = {'Authorization': 'Bearer ' + os.environ['DEMO_TOKEN']}\n"
        f"requests.get({base + '/client-requests'!r}, headers=auth, timeout=30)\n"
        f"httpx.get({base + '/client-httpx'!r}, headers=auth, timeout=30)\n"
        "def run(*argv):\n"
        "    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)\n"
        "    print(argv[0], done.returncode, done.stderr.strip()[-300:])\n"
        f"run('curl', '-sS', '-o', '/dev/null', '-H', 'Authorization: Bearer ' + os.environ['DEMO_TOKEN'], {base + '/client-curl'!r})\n"
        "run('git', '-c', 'http.extraHeader=Authorization: Bearer ' + os.environ['DEMO_TOKEN'], 'ls-remote', "
        f"{base + '/client-git'!r})\n"
        f"run('node', '-e', {NODE_CLIENT!r}, '{port}')\n"
        "run('python', '-m', 'pip', 'download', '--no-deps', '--no-cache-dir', '--retries', '0', '-d', "
        "'/tmp/pip-out', '--index-url', "
        f"'https://__token__:' + os.environ['DEMO_TOKEN'] + '@localhost:{port}/client-pip/', 'nothing-here')\n"
    )
    live.origin.origin.seen.clear()
    out = await live.run(code)
    assert REAL not in out
    heads = live.origin.origin.heads()
    basic = base64.b64encode(f"__token__:{REAL}".encode()).decode()
    for client in ("requests", "httpx", "curl", "git", "node", "pip"):
        mine = [head for head in heads if head.split(" ")[1].startswith(f"/client-{client}")]
        assert mine, f"{client}'s request never reached the origin:\n{out}"
        credentials = f"Basic {basic}" if client == "pip" else f"Bearer {REAL}"
        assert all(f"\r\nAuthorization: {credentials}\r\n" in head for head in mine), (client, mine)


async def sent_value(live: Live, variable: str = "DEMO_TOKEN") -> str:
    """The Authorization value the origin received for a kernel's request with the placeholder in
    `variable` (a new kernel of the workspace)."""
    live.origin.origin.seen.clear()
    out = await live.run(request_code(live.origin.origin.port, variable))
    assert json.loads(out.splitlines()[-1])["body"].startswith("GET /x "), out
    heads = live.origin.origin.heads()
    values = [
        line.split(": ", 1)[1]
        for head in heads
        for line in head.split("\r\n")
        if line.startswith("Authorization:")
    ]
    assert len(values) == 1, heads
    return values[0]


async def until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)


async def edited(live: Live, write: Callable[[], None]) -> None:
    """Make an edit and wait until the workspace replaced its kernels for it."""
    generation = live.supervisor.kernel_generation
    write()
    await until(lambda: live.supervisor.kernel_generation > generation, "the kernels were replaced")


# The tests below edit the workspace: they run last (in file order), the first leaves it as it was.


async def test_an_edited_value_reaches_the_origin_and_a_bad_edit_keeps_the_last_good_one(live: Live) -> None:
    dotenv = live.workspace / ".env"
    await edited(live, lambda: dotenv.write_text("DEMO_TOKEN=rotated-token-8d2e\n"))
    assert await sent_value(live) == "Bearer rotated-token-8d2e"
    assert live.supervisor.reconciler is not None and live.supervisor.reconciler.error is None
    # The variable goes: the edit is refused, shown where a bad file is, and the kernels keep the value.
    generation = live.supervisor.kernel_generation
    dotenv.write_text("OTHER=1\n")
    await until(lambda: live.supervisor.status().config_error is not None, "the edit was refused")
    error = live.supervisor.status().config_error or ""
    assert f"{live.workspace / 'ipybox.toml'}:" in error and ": secret 'demo': " in error, error
    assert "DEMO_TOKEN" in error and "rotated-token" not in error, error
    assert live.supervisor.kernel_generation == generation
    assert await sent_value(live) == "Bearer rotated-token-8d2e"
    await edited(live, lambda: dotenv.write_text(f"DEMO_TOKEN={REAL}\n"))  # fixed: applies
    assert live.supervisor.status().config_error is None


async def test_a_command_planted_by_a_kernel_on_path_is_not_run(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host's PATH has a directory of the workspace first (a venv activated there, say), then the
    # directory the real program is in. A kernel plants a program of the same name in the first.
    marker = tmp_path / "planted-ran"
    planted = live.workspace / "bin" / "get-token"
    out = await live.run(
        "import os\n"
        f"with open({str(planted)!r}, 'w') as f:\n"
        f"    f.write('#!/bin/sh\\ntouch {marker}\\necho planted-token\\n')\n"
        f"os.chmod({str(planted)!r}, 0o755)\n"
        "print('planted')\n"
    )
    assert out == "planted", out
    real_dir = tmp_path / "real-bin"
    real_dir.mkdir()
    (real_dir / "get-token").write_text("#!/bin/sh\necho host-command-token\n")
    (real_dir / "get-token").chmod(0o755)
    monkeypatch.setenv("PATH", f"{planted.parent}:{real_dir}:{os.environ['PATH']}")
    config = live.workspace / "ipybox.toml"
    command = '[secrets.cmd]\ncommand = ["get-token"]\nenv = "CMD_TOKEN"\nhosts = ["localhost"]\n'
    await edited(live, lambda: config.write_text(workspace_file() + "\n" + command))
    assert await sent_value(live, "CMD_TOKEN") == "Bearer host-command-token"
    assert not marker.exists(), "the host ran the program a kernel planted"


def test_an_unresolvable_secret_stops_ipybox_up_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "ipybox.toml").write_text(workspace_file())
    env = {k: v for k, v in os.environ.items() if k != "DEMO_TOKEN" and not k.upper().startswith("IPYBOX_")}
    done = subprocess.run(
        [sys.executable, "-m", "ipybox.cli", "up", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("ipybox: ")]
    assert len(errors) == 1 and errors[0].startswith("ipybox: secret 'demo': "), done.stderr
    assert "DEMO_TOKEN" in errors[0], done.stderr
