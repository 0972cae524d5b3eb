"""The peer: the published ipybox 0.9.2 in its own venv, created once and reused."""

from __future__ import annotations

import subprocess
import sys

from bench.paths import PEER_PYTHON, PEER_VENV

# mcp<2: ipybox 0.9.2 imports `streamablehttp_client`, which mcp 2.x removed.
PEER_REQUIREMENTS = ("ipybox==0.9.2", "mcp<2")
_STAMP = PEER_VENV / "bench.stamp"


def ensure_peer_venv() -> None:
    """Create the peer venv unless it already holds exactly `PEER_REQUIREMENTS` (idempotent)."""
    wanted = "\n".join(PEER_REQUIREMENTS)
    if PEER_PYTHON.exists() and _STAMP.exists() and _STAMP.read_text() == wanted:
        return
    print(f"[bench] creating the peer venv at {PEER_VENV} ({', '.join(PEER_REQUIREMENTS)})", file=sys.stderr)
    if not PEER_PYTHON.exists():
        # `-m venv` from inside our venv bases the new venv on the same base interpreter.
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    pip = [str(PEER_PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *PEER_REQUIREMENTS], check=True)
    # -P: with `-c`, the working directory (maybe this checkout, with its own `ipybox/`) is not put on sys.path.
    subprocess.run(
        [str(PEER_PYTHON), "-P", "-c", "from ipybox import CodeExecutor, generate_mcp_sources"], check=True
    )
    _STAMP.write_text(wanted)


def peer_version() -> str:
    out = subprocess.run(
        [str(PEER_PYTHON), "-P", "-c", "import importlib.metadata as m; print(m.version('ipybox'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()
