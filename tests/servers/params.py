"""Server parameters for the real MCP servers the tests run against, and for our own edge server.

Every helper fails (never skips) with a message saying to run `bash scripts/setup` when the server
is not installed, and in a test not marked `integration`, installed or not (the fast tier needs nothing).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache"
NPM_SCOPE = CACHE / "npm" / "node_modules" / "@modelcontextprotocol"
SERVERS_VENV_BIN = CACHE / "servers-venv" / "bin"
EDGE_SERVER = Path(__file__).resolve().parent / "edge_server.py"


running: pytest.Item | None = None
"""The test running now (set by tests/conftest.py), `None` outside one (collection, session teardown)."""


def _require(path: Path, what: str) -> Path:
    # The fast tier (`-m "not integration"`) needs nothing installed: a test outside it that needs a server
    # of set-up's fails here even where the server is installed, so it is marked before a fresh clone finds it.
    if running is not None and running.get_closest_marker("integration") is None:
        pytest.fail(
            f"{running.nodeid} needs {what} but is not marked `integration`: the fast tier needs nothing "
            "installed. Mark it, or give it parameters that need nothing (`params.edge()`) if it starts no server",
            pytrace=False,
        )
    if not path.exists():
        pytest.fail(f"{what} is not installed ({path} is missing): run `bash scripts/setup`", pytrace=False)
    return path


def _npm_server(package: str, *args: str) -> dict[str, Any]:
    entry = _require(
        NPM_SCOPE / package / "dist" / "index.js", f"npm package @modelcontextprotocol/{package}"
    )
    return {"command": "node", "args": [str(entry), *args]}


def everything() -> dict[str, Any]:
    """`@modelcontextprotocol/server-everything` over stdio."""
    return _npm_server("server-everything", "stdio")


def filesystem(*roots: Path) -> dict[str, Any]:
    """`@modelcontextprotocol/server-filesystem`, allowed to access `roots`."""
    return _npm_server("server-filesystem", *(str(root) for root in roots))


def memory(memory_file: Path) -> dict[str, Any]:
    """`@modelcontextprotocol/server-memory`, storing its knowledge graph in `memory_file`."""
    params = _npm_server("server-memory")
    params["env"] = {"MEMORY_FILE_PATH": str(memory_file)}
    return params


def time_server() -> dict[str, Any]:
    """PyPI `mcp-server-time`, with UTC as its local timezone."""
    command = _require(SERVERS_VENV_BIN / "mcp-server-time", "PyPI package mcp-server-time")
    return {"command": str(command), "args": ["--local-timezone", "UTC"]}


def git(repository: Path) -> dict[str, Any]:
    """PyPI `mcp-server-git`, serving `repository`."""
    command = _require(SERVERS_VENV_BIN / "mcp-server-git", "PyPI package mcp-server-git")
    return {"command": str(command), "args": ["--repository", str(repository)]}


def edge(*args: str) -> dict[str, Any]:
    """Our own edge-case server over stdio (extra `args` such as `--exit-at-once`)."""
    return {"command": sys.executable, "args": [str(EDGE_SERVER), *args]}


def edge_http_command(transport: str, port: int, *args: str) -> list[str]:
    """The command line serving the edge server over `streamable-http` (at `/mcp`) or `sse` (`/sse`)."""
    return [sys.executable, str(EDGE_SERVER), "--transport", transport, "--port", str(port), *args]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def edge_http_server(transport: str, *args: str) -> Iterator[str]:
    """Serve the edge server over `streamable-http` or `sse` in a subprocess; yields its endpoint URL."""
    port = free_port()
    process = subprocess.Popen(
        edge_http_command(transport, port, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                stderr = process.stderr.read().decode() if process.stderr else ""
                pytest.fail(f"the edge server exited with {process.returncode}: {stderr}", pytrace=False)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the edge server did not start listening within 30 s", pytrace=False)
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/{'sse' if transport == 'sse' else 'mcp'}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()
