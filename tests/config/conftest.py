"""Workspace configuration tests: a workspace directory to write `ipybox.toml` into, and an environment
without `IPYBOX_*` variables (which would override what the tests write)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_ipybox_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("IPYBOX_"):
            monkeypatch.delenv(name)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "demo"
    path.mkdir()
    return path


@pytest.fixture
def write_config(workspace: Path) -> Callable[[str], Path]:
    """Write `ipybox.toml` in the workspace; returns its path."""

    def write(text: str) -> Path:
        path = workspace / "ipybox.toml"
        path.write_text(text)
        return path

    return write
