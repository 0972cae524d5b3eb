"""What lies around a sandboxed workspace (issue 30, finding 7): other workspaces' state (their tokens and
audit logs), other projects' `.env` files beside it, and ipybox's own state on the host (the server
registry, with the secrets of every project's servers, and the gateways' tokens).

Each test is an attacker's attempt from agent code in a sandboxed kernel, or a sandboxed MCP server. The
workspace lies outside `/tmp` (which the sandbox replaces), among directories of the same user:

    <parent>/.ipybox/state.json           a workspace the workspace is inside of
    <parent>/ws/                          the workspace
    <parent>/other-ws/.ipybox/...         another workspace: state.json, logs/audit.jsonl
    <parent>/project/.env, README.md      another project
    <parent>/state-home/ipybox/...        XDG_STATE_HOME: mcp_servers.json, gateways/<host>-<port>.json
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.mcp_client import MCPConnection
from ipybox.mcp_client.params import parse_server_params
from ipybox.paths import user_state_dir
from tests.sandbox.conftest import OUTSIDE_PARENT
from tests.servers import params

pytestmark = pytest.mark.integration

SECRET = "neighbour-secret"


@dataclass
class Neighbours:
    executor: CodeExecutor
    parent: Path
    workspace: Path
    project: Path  # another project beside the workspace
    secrets: dict[str, Path]  # what holds a secret, by what it is

    async def read(self, *paths: Path) -> dict[str, str]:
        """What the kernel gets reading each path: `ok: <content>` or `denied: <error type>`."""
        code = (
            "import json\nout = {}\n"
            f"for path in {[str(p) for p in paths]!r}:\n"
            "    try:\n        out[path] = 'ok: ' + open(path).read()\n"
            "    except Exception as e:\n        out[path] = 'denied: ' + type(e).__name__\n"
            "print(json.dumps(out))"
        )
        result = await self.executor.execute(code, timeout=60)
        return dict(json.loads(result.text or "{}"))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
async def neighbours(monkeymodule: pytest.MonkeyPatch) -> AsyncIterator[Neighbours]:
    parent = Path(tempfile.mkdtemp(prefix="ipybox-neighbours-", dir=OUTSIDE_PARENT))
    workspace = parent / "ws"
    (workspace / "work").mkdir(parents=True)
    project = parent / "project"
    _write(project / "README.md", "an ordinary file of another project\n")
    monkeymodule.setenv("XDG_STATE_HOME", str(parent / "state-home"))
    state = user_state_dir()
    secrets = {
        "enclosing workspace's state": _write(parent / ".ipybox" / "state.json", f'{{"token": "{SECRET}"}}'),
        "other workspace's state": _write(parent / "other-ws" / ".ipybox" / "state.json", f'"{SECRET}"'),
        "other workspace's audit log": _write(
            parent / "other-ws" / ".ipybox" / "logs" / "audit.jsonl", SECRET
        ),
        "sibling's .env": _write(project / ".env", f"API_KEY={SECRET}\n"),
        "sibling's .env.local": _write(project / ".env.local", f"API_KEY={SECRET}\n"),
        "server registry": _write(
            state / "mcp_servers.json",
            json.dumps({str(project / "mcptools"): {"gh": {"command": "gh", "env": {"TOKEN": SECRET}}}}),
        ),
        "gateway token": _write(state / "gateways" / "127.0.0.1-8888.json", f'{{"token": "{SECRET}"}}'),
    }
    try:
        async with CodeExecutor(working_dir=workspace, sandbox=True, spare_kernel=False) as executor:
            yield Neighbours(executor, parent, workspace, project, secrets)
    finally:
        shutil.rmtree(parent)


async def test_a_kernel_reads_no_secret_around_its_workspace(neighbours: Neighbours) -> None:
    read = await neighbours.read(*neighbours.secrets.values())
    exposed = {
        what: read[str(path)] for what, path in neighbours.secrets.items() if SECRET in read[str(path)]
    }
    assert exposed == {}
    assert all(outcome.startswith("denied") for outcome in read.values()), read


async def test_a_kernel_cannot_list_ipyboxs_state_dir_or_another_workspaces_state(
    neighbours: Neighbours,
) -> None:
    places = [user_state_dir(), neighbours.parent / "other-ws" / ".ipybox", neighbours.parent / ".ipybox"]
    code = (
        "import json, os\nout = []\n"
        f"for path in {[str(p) for p in places]!r}:\n"
        "    try:\n        out.append(sorted(os.listdir(path)))\n"
        "    except OSError as e:\n        out.append(type(e).__name__)\n"
        "print(json.dumps(out))"
    )
    listed = json.loads((await neighbours.executor.execute(code, timeout=60)).text or "null")
    assert all(entry in ([], "FileNotFoundError") for entry in listed), listed


async def test_another_projects_other_files_stay_readable(neighbours: Neighbours) -> None:
    readme = neighbours.project / "README.md"
    assert (await neighbours.read(readme))[str(readme)] == "ok: an ordinary file of another project\n"


async def test_a_siblings_dotenv_rotated_or_created_after_the_kernel_started_stays_hidden(
    neighbours: Neighbours,
) -> None:
    env, later = neighbours.project / ".env", neighbours.project / ".env.production"
    rotated = _write(neighbours.project / ".env.next", f"API_KEY={SECRET}-rotated\n")
    os.replace(rotated, env)  # an editor's save, a secret rotation
    _write(later, f"API_KEY={SECRET}-later\n")
    try:
        read = await neighbours.read(env, later)
    finally:
        later.unlink()
    assert not any(SECRET in outcome for outcome in read.values()), read


async def test_a_sandboxed_server_reads_no_secret_around_its_directory(neighbours: Neighbours) -> None:
    # The filesystem server, allowed the whole parent, sandboxed with the workspace as its directory.
    server = {**params.filesystem(neighbours.parent), "cwd": str(neighbours.workspace), "sandbox": True}
    connection = MCPConnection("fs", parse_server_params("fs", server))
    await connection.start()
    try:
        answers = {}
        for what, path in neighbours.secrets.items():
            result = await connection.call_tool("read_text_file", {"path": str(path)})
            answers[what] = " ".join(getattr(block, "text", "") for block in result.content)
        readme = await connection.call_tool("read_text_file", {"path": str(neighbours.project / "README.md")})
    finally:
        await connection.stop()
    assert {what: answer for what, answer in answers.items() if SECRET in answer} == {}
    assert not readme.is_error
