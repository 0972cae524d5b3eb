"""Filesystem locations the harness uses, all derived from the repository root."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "bench"
SCENARIOS_DIR = BENCH_DIR / "scenarios"
CACHE_DIR = REPO_ROOT / ".cache"

OURS_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
PEER_VENV = CACHE_DIR / "peer-venv"
PEER_PYTHON = PEER_VENV / "bin" / "python"

# Scenario subprocesses run with a scratch directory as their working directory, so that neither
# interpreter can import this checkout's `ipybox/` by accident (the kernel puts its cwd on sys.path)
# and so generated files (images/, mcptools/) land outside the tree.
SCRATCH_DIR = CACHE_DIR / "bench-scratch"
