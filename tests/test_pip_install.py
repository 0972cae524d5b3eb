"""The first ten minutes of a new user, for real: the wheel built from this checkout, installed with pip
into a fresh venv outside the checkout (with a fresh 0700 home), then the README's quick start verbatim (the
block under "## Quick start", read from README.md: `ipybox init`, `ipybox server add` of a real MCP server
from PyPI, `ipybox up -d`, a tool call with `ipybox exec`), a call from an MCP client over the
workspace's streamable HTTP endpoint, and `ipybox down`, with nothing of the checkout on the path: what
works here works after `pip install .` from a checkout.

The venv is built once per session (pip resolves the dependencies against the index, with its cache).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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

# Building the venv (pip against the index, with its cache) counts against the first test.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]


class Installed:
    """ipybox installed from its wheel into a fresh venv, and a clean environment to run it in."""

    def __init__(self, venv: Path, home: Path) -> None:
        self.venv = venv
        self.env = {
            "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }

    def run(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ipybox", *args], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )


def _checked(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("pip-install")
    assert not base.is_relative_to(ROOT), "the install must stand outside the checkout"
    wheels = base / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _checked(
        subprocess.run(
            [*pip, "wheel", "--no-deps", "-w", str(wheels), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    )
    (wheel,) = wheels.glob("ipybox-*.whl")
    venv = base / "venv"
    _checked(
        subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120)
    )
    python = venv / "bin" / "python"
    # As the README's install section: ipybox and the MCP server the quick start adds.
    install = [
        str(python),
        "-m",
        "pip",
        "--disable-pip-version-check",
        "-q",
        "install",
        str(wheel),
        "mcp-server-time",
    ]
    _checked(subprocess.run(install, capture_output=True, text=True, timeout=900))
    home = base / "home"
    home.mkdir(mode=0o700)
    return Installed(venv, home)


# TODO(integrator, issue 37): run these lines of the quick start too once `ipybox connect` and `ipybox server
# import` are merged (delete them here), and check what `ipybox connect claude` printed.
QUICK_START_PENDING = ("ipybox connect", "ipybox server import")


def readme_quick_start() -> list[str]:
    """The command lines of the README's quick start: its first shell block under "## Quick start"."""
    section = (ROOT / "README.md").read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


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
    assert oct(Path(installed.env["HOME"]).stat().st_mode & 0o777) == "0o700"
    # The README's quick start, verbatim, as one shell script in a fresh directory (sandboxed: `ipybox
    # init`'s default where bubblewrap works).
    lines = [line for line in readme_quick_start() if not line.startswith(QUICK_START_PENDING)]
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
