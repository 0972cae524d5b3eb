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

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.config.secrets import PLACEHOLDER_PREFIX
from ipybox.limits import unenforceable_defaults
from ipybox.sandbox.platforms import sandbox_supported
from ipybox.supervisor import Supervisor
from tests.sandbox.tls_harness import OriginServer, start_origin

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sandbox_supported(), reason="the sandbox can't run here (ipybox doctor)"),
]

REAL = "real-demo-token-4f1c9a7e2b"
"""The secret's value, in the workspace's `.env` (hidden from kernels)."""


def workspace_file() -> str:
    lifted = unenforceable_defaults(sandboxed=True)
    limits = "[kernel.limits]\n" + "".join(f'{n} = "unlimited"\n' for n in lifted) + "\n" if lifted else ""
    return (
        f"[kernel]\nwarm_pool = 1\n\n{limits}"
        "[sandbox]\nenabled = true\n\n"
        '[sandbox.network]\nallowedDomains = ["localhost"]\n\n'
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


def request_code(port: int) -> str:
    """A kernel's request with its placeholder, through `HTTPS_PROXY`, trusting `SSL_CERT_FILE`."""
    return (
        "import json, os, urllib.request\n"
        # The proxy variables leave local names out (NO_PROXY): the test origin is one, a real host isn't.
        "for name in ('NO_PROXY', 'no_proxy'):\n"
        "    os.environ.pop(name, None)\n"
        "token = os.environ['DEMO_TOKEN']\n"
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
