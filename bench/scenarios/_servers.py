"""The real MCP servers the benchmarks start, as absolute commands.

Both interpreters must start the very same server processes, so nothing here depends on PATH lookups
at server start or on either venv. The servers are installed by ``bash scripts/setup``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
NPM_SCOPE = REPO_ROOT / ".cache" / "npm" / "node_modules" / "@modelcontextprotocol"
SERVERS_VENV = REPO_ROOT / ".cache" / "servers-venv"

SERVER_NAMES = ("everything", "filesystem", "git")


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node not found: the npm MCP servers need Node.js (see scripts/setup)")
    return node


def _require(path: Path) -> str:
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run `bash scripts/setup`")
    return str(path)


def server_params(name: str, workdir: Path) -> dict[str, Any]:
    """Stdio server parameters for `name`; server state (allowed dir, git repo) goes under `workdir`."""
    if name == "everything":
        entry = _require(NPM_SCOPE / "server-everything" / "dist" / "index.js")
        return {"command": _node(), "args": [entry, "stdio"]}
    if name == "filesystem":
        entry = _require(NPM_SCOPE / "server-filesystem" / "dist" / "index.js")
        allowed = workdir / "fs-root"
        allowed.mkdir(parents=True, exist_ok=True)
        return {"command": _node(), "args": [entry, str(allowed)]}
    if name == "git":
        command = _require(SERVERS_VENV / "bin" / "mcp-server-git")
        repo = workdir / "git-repo"
        if not (repo / ".git").exists():
            repo.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "init", "-q", str(repo)], check=True)
        return {"command": command, "args": ["--repository", str(repo)]}
    raise ValueError(f"unknown server {name!r}; known: {', '.join(SERVER_NAMES)}")


def populate_fs_root(workdir: Path, files: int = 5) -> Path:
    """The filesystem server's allowed directory under `workdir`, with `files` small files to list."""
    root = workdir / "fs-root"
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"file{i}.txt").write_text("x")
    return root
