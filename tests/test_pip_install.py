"""The first ten minutes of a new user, for real: the wheel built from this checkout, installed with pip
into a fresh venv outside the checkout, then `ipybox init`, `ipybox server add` of a real MCP server from
PyPI (as the README's quick start: installed with ipybox, added by its command), `ipybox up -d`, a call from an MCP client over the workspace's streamable HTTP endpoint, and
`ipybox down`, with nothing of the checkout on the path: what works here works after `pip install ipybox`.

The venv is built once per run and shared with other tests (tests/pip_installed.py: pip resolves the
dependencies against the index, with its cache).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.pip_installed import Installed
from tests.pip_installed import checked as _checked

# Building the venv (pip against the index, with its cache) counts against the first test.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(pip_installed: Installed) -> Installed:
    # Built once per run for every test that needs it (tests/pip_installed.py).
    return pip_installed


@pytest.fixture
def workspace_dir(tmp_path: Path, installed: Installed) -> Iterator[Path]:
    directory = tmp_path / "ws"
    yield directory
    if (directory / ".ipybox").exists():  # a failed test leaves nothing running
        installed.run("down", str(directory), cwd=tmp_path, timeout=120)


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Installed, tmp_path: Path) -> None:
    code = "import ipybox, importlib.resources as r; print(ipybox.__file__); print((r.files('ipybox') / 'data').is_dir())"
    done = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=installed.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    where, data = _checked(done).split()
    assert Path(where).is_relative_to(installed.venv) and data == "True"
    assert Path(_checked(installed.run("schema", cwd=tmp_path)).strip()).is_relative_to(installed.venv)


async def test_init_server_add_up_an_mcp_call_and_down_work_from_a_pip_install(
    installed: Installed, workspace_dir: Path, tmp_path: Path
) -> None:
    _checked(installed.run("init", str(workspace_dir), cwd=tmp_path))
    assert "ipybox.toml" in os.listdir(workspace_dir)
    assert ".ipybox/" in (workspace_dir / ".gitignore").read_text().splitlines()

    # The README's quick start, in the workspace (sandboxed: `ipybox init`'s default where bubblewrap works).
    _checked(installed.run("server", "add", "time", "--", "mcp-server-time", cwd=workspace_dir))
    written = tomllib.loads((workspace_dir / "ipybox.toml").read_text())
    assert written["servers"]["time"]["command"] == "mcp-server-time"
    assert written["sandbox"]["enabled"] is True and written["servers"]["time"]["sandbox"] is True

    up = _checked(installed.run("up", "-d", str(workspace_dir), cwd=tmp_path))
    assert "ipybox is up" in up
    listed = json.loads(
        _checked(installed.run("server", "list", "--workspace", str(workspace_dir), "--json", cwd=tmp_path))
    )
    assert "time" in json.dumps(listed)

    state = json.loads((workspace_dir / ".ipybox" / "state.json").read_text())
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"allow": True})

    code = "from mcptools.time import get_current_time as t\nprint(t.run(t.Params(timezone='UTC')).timezone)"
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {state['mcp_token']}"}, timeout=120)
        )
        read, write = await stack.enter_async_context(
            streamable_http_client(state["mcp_url"], http_client=http)
        )
        session = await stack.enter_async_context(ClientSession(read, write, elicitation_callback=elicit))
        await session.initialize()
        result = await session.call_tool("execute_ipython_cell", {"code": code})
    output = "".join(part.text for part in result.content if isinstance(part, types.TextContent))
    assert not result.is_error, output
    assert output.strip() == "UTC"

    supervisor_pid = state["pid"]
    assert "is down" in _checked(installed.run("down", str(workspace_dir), cwd=tmp_path, timeout=120))
    with pytest.raises(ProcessLookupError):
        os.kill(supervisor_pid, 0)
    leftovers = subprocess.run(["pgrep", "-f", str(installed.venv)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", f"processes left behind: {leftovers.stdout}"
    shutil.rmtree(workspace_dir / ".ipybox", ignore_errors=True)
