"""Attacks on what the host executes later: code in the workspace that a server, or ipybox itself, runs.

A workspace with a virtualenv of its own (a real one), a `node_modules/` and a server run from them
(`.venv/bin/python server.py`): each test is agent code in a sandboxed kernel (or a sandboxed server doing
what a kernel's approved call asks) trying to change what the host runs next, or a server whose command
a kernel can write trying to get its `${VAR}` secret. One executor (one kernel) serves the module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import mcp_types as types
import pytest

from ipybox import CodeExecutor
from ipybox.mcp_client import ServerCodeWritableError
from tests.sandbox.conftest import OUTSIDE_PARENT
from tests.servers import params

pytestmark = pytest.mark.integration

SECRET = "host-executes-secret"
_SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def attempt(action: str) -> str:
    """Code that prints `ok: <result>` when `action` (an expression) works, else `denied: <error type>`."""
    return f"try:\n    print('ok:', {action})\nexcept Exception as e:\n    print('denied:', type(e).__name__)"


@dataclass
class HostExecutes:
    executor: CodeExecutor
    workspace: Path
    tools: Path  # an allowWrite directory outside the workspace

    async def run(self, code: str) -> str:
        result = await self.executor.execute(code, timeout=60)
        return (result.text or "").strip()


@pytest.fixture(scope="module")
async def host(monkeymodule: pytest.MonkeyPatch) -> AsyncIterator[HostExecutes]:
    parent = Path(tempfile.mkdtemp(prefix="ipybox-host-executes-", dir=OUTSIDE_PARENT))
    workspace, tools = parent / "ws", parent / "tools"
    workspace.mkdir()
    tools.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(workspace / ".venv")], check=True)
    (workspace / "server.py").write_text("import util\n")
    (workspace / "util.py").write_text("VALUE = 1\n")
    # What running server.py once leaves: the compiled module its import found.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(workspace / ".venv/bin/python"), "server.py"], cwd=workspace, env=env, check=True)
    assert any((workspace / "__pycache__").iterdir())
    (workspace / "node_modules" / "left-pad").mkdir(parents=True)
    (workspace / "node_modules" / "left-pad" / "index.js").write_text("module.exports = 1\n")
    (workspace / "out").mkdir()
    policy = parent / "policy.json"
    policy.write_text(json.dumps({"filesystem": {"allowWrite": [str(tools)]}}))
    monkeymodule.setenv("HOST_EXECUTES_SECRET", SECRET)
    servers = {
        "local": {"command": ".venv/bin/python", "args": ["server.py"], "cwd": str(workspace)},
        # Its command lives where kernels may write (allowWrite), and it gets a secret.
        "leaky": {"command": str(tools / "server"), "env": {"TOKEN": "${HOST_EXECUTES_SECRET}"}},
        # A sandboxed server writing the workspace, as an approved call of a kernel would have it.
        "fs": {**params.filesystem(workspace), "cwd": str(workspace), "sandbox": True},
    }
    try:
        async with CodeExecutor(
            working_dir=workspace, sandbox=True, sandbox_config=policy, mcp_servers=servers
        ) as executor:
            yield HostExecutes(executor, workspace, tools)
    finally:
        shutil.rmtree(parent)


@pytest.mark.parametrize(
    "path",
    [
        f".venv/{_SITE}/evil.pth",  # run by every start of the venv's python
        f"__pycache__/server.{sys.implementation.cache_tag}.pyc",  # run instead of server.py (its header)
        "node_modules/left-pad/index.js",  # what a local Node server imports
        "node_modules/evil/index.js",
    ],
)
async def test_a_kernel_cannot_plant_code_the_host_runs(host: HostExecutes, path: str) -> None:
    code = f"import os\nos.makedirs(os.path.dirname({path!r}), exist_ok=True)\nopen({path!r}, 'w').write('x')"
    out = await host.run(attempt(f"exec({code!r})"))
    assert out == "denied: OSError"
    assert not (host.workspace / path).exists() or (host.workspace / path).read_text() != "x"


async def test_a_kernel_cannot_rewrite_a_servers_script(host: HostExecutes) -> None:
    out = await host.run(attempt("open('server.py', 'a').write('import os; os.system(\"id\")')"))
    assert out == "denied: OSError"
    out = await host.run(attempt("open('util.py', 'a').write('import os')"))  # which server.py imports
    assert out == "denied: OSError"
    assert (host.workspace / "server.py").read_text() == "import util\n"
    # The rest of the workspace stays writable.
    assert await host.run(attempt("open('out/result.txt', 'w').write('fine')")) == "ok: 4"


async def test_a_sandboxed_server_cannot_change_what_the_host_runs(host: HostExecutes) -> None:
    connection = await host.executor.tool_server.servers.connection("fs")
    for path in (f".venv/{_SITE}/evil.pth", "server.py", "__pycache__/x.pyc", "node_modules/evil.js"):
        result = await connection.call_tool(
            "write_file", {"path": str(host.workspace / path), "content": "import os"}
        )
        assert result.is_error, path
        assert "read-only" in _text(result).lower(), path
    assert (host.workspace / "server.py").read_text() == "import util\n"
    assert not (host.workspace / ".venv" / _SITE / "evil.pth").exists()


async def test_a_server_whose_command_a_kernel_can_write_does_not_get_its_secret(
    host: HostExecutes,
) -> None:
    stolen, command = host.tools / "stolen", host.tools / "server"
    script = f"#!/bin/sh\nprintenv TOKEN > {stolen}\n"
    code = f"import os\np = {str(command)!r}\nopen(p, 'w').write({script!r})\nos.chmod(p, 0o755)"
    assert await host.run(attempt(f"exec({code!r})")) == "ok: None"  # allowWrite: the kernel may write it
    with pytest.raises(ServerCodeWritableError) as refused:
        await host.executor.tool_server.servers.connection("leaky")
    assert str(command) in str(refused.value)
    assert "secrets" in str(refused.value) and "allowWrite" in str(refused.value)
    assert not stolen.exists()


def _text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))
