"""A sandboxed executor over a workspace full of things it must not touch, shared by the module."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipybox import CodeExecutor, generate_mcp_sources
from tests.servers import params

# Host directories a test needs outside /tmp (which the sandbox replaces) go here: any user may write it.
OUTSIDE_PARENT = "/var/tmp"
# Set (to the user's name) in the run of these tests that test_unprivileged.py starts as another user.
UNPRIVILEGED_USER_VARIABLE = "IPYBOX_TEST_UNPRIVILEGED_USER"


@pytest.fixture(scope="module")
def monkeymodule() -> Iterator[pytest.MonkeyPatch]:
    """`monkeypatch` for module-scoped fixtures (a module's shared executor and its environment)."""
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@dataclass
class Sandboxed:
    executor: CodeExecutor
    workspace: Path
    outside: Path  # a host directory outside the workspace and /tmp: writable, but not from the sandbox
    secret_file: Path  # outside the workspace, hidden by the policy file
    host_port: int  # a TCP server on the host's 127.0.0.1

    async def run(self, code: str) -> str:
        result = await self.executor.execute(code, timeout=60)
        return (result.text or "").strip()


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers with the request it got, so tests see what reached the server."""

    def do_GET(self) -> None:
        body = f"{self.command} {self.path}\n{self.headers}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def host_http_server() -> Iterator[int]:
    """An HTTP server on the host's 127.0.0.1: a sandbox can reach it only through the proxy."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
async def sandboxed(
    tmp_path_factory: pytest.TempPathFactory, host_tcp_server: int
) -> AsyncIterator[Sandboxed]:
    base = tmp_path_factory.mktemp("sandbox")
    workspace = base / "workspace"
    workspace.mkdir()
    (workspace / ".env").write_text("API_KEY=sandbox-secret-in-dotenv\n")
    (workspace / ".env.local").write_text("OTHER=sandbox-secret-local\n")
    (workspace / "ipybox.toml").write_text("# the workspace's own policy\n")
    (workspace / "data.txt").write_text("ordinary data\n")
    (workspace / "out").mkdir()
    (workspace / "log.txt").write_text("")
    os.symlink(workspace / ".env", workspace / "innocent.txt")
    git = ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    # The workspace is under /tmp, which the sandbox replaces with its own: the host directory for
    # "outside" tests is elsewhere, and one this user may write on the host (as root any is; as another
    # user the repository is not), so only the sandbox stands between a kernel and writing there.
    outside = Path(tempfile.mkdtemp(prefix="ipybox-sandbox-outside-", dir=OUTSIDE_PARENT))
    (outside / "__init__.py").write_text("# a host file outside the workspace\n")
    assert os.access(outside, os.W_OK)
    secrets_dir = base / "secrets"
    secrets_dir.mkdir()
    secret_file = secrets_dir / "token.txt"
    secret_file.write_text("sandbox-secret-named-by-policy\n")
    policy = base / "policy.json"
    policy.write_text(json.dumps({"filesystem": {"denyRead": [str(secrets_dir)]}}))
    await generate_mcp_sources("everything", params.everything(), workspace / "mcptools")
    try:
        async with CodeExecutor(
            working_dir=workspace, sandbox=True, sandbox_config=policy, approval_timeout=10
        ) as executor:
            yield Sandboxed(executor, workspace, outside, secret_file, host_tcp_server)
    finally:
        shutil.rmtree(outside)
