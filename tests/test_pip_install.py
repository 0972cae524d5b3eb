"""The first ten minutes of a new user, for real: the wheel built from this checkout, installed with pip
into a fresh venv outside the checkout (with a fresh 0700 home), then the README's quick start verbatim (the
block under "## Quick start", read from README.md: `ipybox init`, `ipybox server add` of a real MCP server
from PyPI, `ipybox up -d`, a tool call with `ipybox exec`), a call from an MCP client over the
workspace's streamable HTTP endpoint, and `ipybox down`, with nothing of the checkout on the path: what
works here works after `pip install .` from a checkout.

The venv is built once per run and shared with other tests (tests/pip_installed.py: pip resolves the
dependencies against the index, with its cache).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
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


CLAUDE = ROOT / ".cache" / "npm-clients" / "node_modules" / ".bin" / "claude"


def readme_block(heading: str, index: int = 0) -> list[str]:
    """The command lines of the README's `index`th shell block under `## heading`."""
    section = (ROOT / "README.md").read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n")[index + 1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def readme_quick_start() -> list[str]:
    """The command lines of the README's quick start: its first shell block under "## Quick start"."""
    return readme_block("Quick start")


# A realistic project file of another client, as Claude Code's `.mcp.json`: hyphenated names, an argument,
# and a token written literally (which must not reach ipybox.toml, a file meant to be committed).
MCP_JSON = {
    "mcpServers": {
        "time-berlin": {"command": "mcp-server-time", "args": ["--local-timezone", "Europe/Berlin"]},
        "time-tokyo": {
            "type": "stdio",
            "command": "mcp-server-time",
            "args": ["--local-timezone", "Asia/Tokyo"],
            "env": {"TIME_API_TOKEN": "tok-literal-4711"},
        },
    }
}


@pytest.fixture
def workspace_dir(tmp_path: Path, installed: Installed) -> Iterator[Path]:
    directory = tmp_path / "my-workspace"  # the README's quick start makes it
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


def test_the_readme_quick_start_is_what_this_test_runs() -> None:
    lines = readme_quick_start()
    assert lines[0].startswith("mkdir my-workspace && cd my-workspace")
    assert any(line.startswith("ipybox up -d") for line in lines)
    assert any(line.startswith("ipybox exec") for line in lines)


async def test_the_readme_quick_start_then_an_mcp_call_and_down_work_from_a_pip_install(
    installed: Installed, workspace_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"  # Claude Code writes its configuration there
    home.mkdir(mode=0o700)
    installed = installed.in_home(home)
    assert oct(Path(installed.env["HOME"]).stat().st_mode & 0o777) == "0o700"
    # The README's quick start, verbatim, as one shell script in a fresh directory (sandboxed: `ipybox
    # init`'s default where bubblewrap works); its last line prints the line that connects Claude Code.
    started = time.monotonic()
    lines = readme_quick_start()
    assert lines[-1].startswith("ipybox connect claude")
    script = "set -e\n" + "\n".join(lines) + "\n"
    assert workspace_dir.name == "my-workspace"
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=installed.env, capture_output=True, text=True, timeout=600
    )
    out = _checked(done)
    assert "ipybox.toml" in os.listdir(workspace_dir)
    assert ".ipybox/" in (workspace_dir / ".gitignore").read_text().splitlines()
    written = tomllib.loads((workspace_dir / "ipybox.toml").read_text())
    assert written["servers"]["time"]["command"] == "mcp-server-time"
    assert written["sandbox"]["enabled"] is True and written["servers"]["time"]["sandbox"] is True
    assert "ipybox is up" in out
    assert "UTC" in out.splitlines(), out  # the quick start's tool call, through the workspace's rules
    listed = json.loads(
        _checked(installed.run("server", "list", "--workspace", str(workspace_dir), "--json", cwd=tmp_path))
    )
    assert "time" in json.dumps(listed)

    # What `ipybox connect claude` printed, run as the README says, then Claude Code's health check.
    add = out.splitlines()[-1]
    assert shlex.split(add)[:3] == ["claude", "mcp", "add"] and str(workspace_dir) in add, out
    assert CLAUDE.exists(), "Claude Code is not installed: run `bash scripts/setup --tests`"
    claude_env = {**installed.env, "PATH": f"{CLAUDE.parent}:{installed.env['PATH']}"}
    claude_env.update(
        DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1"
    )
    for command in (add, "claude mcp list"):
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=workspace_dir,
            env=claude_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        listing = _checked(done)
    assert any(
        line.startswith("ipybox: ") and line.endswith("✔ Connected") for line in listing.splitlines()
    ), listing
    print(
        f"from the quick start's first line to Claude Code's health check: {time.monotonic() - started:.1f} s"
    )

    # The README's import of another client's servers, verbatim: hyphenated names mapped, the literal
    # token moved to the workspace's .env, both servers started and callable.
    (tmp_path / ".mcp.json").write_text(json.dumps(MCP_JSON))
    [import_line] = [line for line in readme_block("Connect your agent", 1) if " import .mcp.json" in line]
    imported = _checked(
        subprocess.run(
            ["bash", "-c", import_line],
            cwd=tmp_path,
            env=installed.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    )
    assert "time-berlin" in imported and "time_berlin" in imported, imported
    config = (workspace_dir / "ipybox.toml").read_text()
    assert "[servers.time_berlin]" in config and "[servers.time_tokyo]" in config
    assert "tok-literal-4711" not in config and "tok-literal-4711" in (workspace_dir / ".env").read_text()
    code = (
        "from mcptools.time_berlin import get_current_time as b\n"
        "from mcptools.time_tokyo import get_current_time as t\n"
        "print(b.run(b.Params(timezone='Europe/Berlin')).timezone, t.run(t.Params(timezone='Asia/Tokyo')).timezone)"
    )
    ran = _checked(installed.run("exec", "-w", str(workspace_dir), code, cwd=tmp_path))
    assert ran.split() == ["Europe/Berlin", "Asia/Tokyo"], ran

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
