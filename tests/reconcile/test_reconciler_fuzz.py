"""The reconciler's load path against mangled files: whatever an editor leaves in `ipybox.toml` or `.env`
mid-edit, loading fails only with `ConfigError`, and the last good configuration stays in place."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from ipybox.config import ConfigError, WorkspaceConfig
from ipybox.mcp_client.pool import MCPServers
from ipybox.reconcile.reconciler import Reconciler
from tests.config.conftest import ROOT

pytestmark = pytest.mark.integration

SEED = 20240611
CASES = 200
DOTENV = "IPYBOX_KERNEL__TIMEOUT=30\nIPYBOX_KERNEL__WARM_POOL=2\nTOKEN=secret\n"
SPECIAL_BYTES = b"\"'[]{}=,.#\n\\ \t\x00\xff\xc3-_0123456789truefalse"


class NoHooks:
    async def rules_changed(self, policy: object) -> None:
        raise AssertionError("loading must not apply anything")

    async def provenance_changed(self, settings: object) -> None:
        raise AssertionError("loading must not apply anything")

    async def kernels_changed(self, config: object, reasons: list[str]) -> None:
        raise AssertionError("loading must not apply anything")

    async def network_changed(self, config: object, reasons: list[str]) -> None:
        raise AssertionError("loading must not apply anything")


def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            break
        position = rng.randrange(len(out))
        out[position] = rng.choice(SPECIAL_BYTES) if rng.random() < 0.7 else rng.randrange(256)
    return bytes(out)


def delete_line(data: bytes, rng: random.Random) -> bytes:
    lines = data.splitlines(keepends=True)
    if lines:
        del lines[rng.randrange(len(lines))]
    return b"".join(lines)


def duplicate_line(data: bytes, rng: random.Random) -> bytes:
    lines = data.splitlines(keepends=True)
    if lines:
        index = rng.randrange(len(lines))
        lines.insert(rng.randrange(len(lines) + 1), lines[index])
    return b"".join(lines)


def swap_values(data: bytes, rng: random.Random) -> bytes:
    lines = data.splitlines(keepends=True)
    assignments = [i for i, line in enumerate(lines) if b"=" in line and not line.lstrip().startswith(b"#")]
    if len(assignments) < 2:
        return data
    first, second = rng.sample(assignments, 2)
    key1, value1 = lines[first].split(b"=", 1)
    key2, value2 = lines[second].split(b"=", 1)
    lines[first], lines[second] = key1 + b"=" + value2, key2 + b"=" + value1
    return b"".join(lines)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


MUTATIONS: list[Callable[[bytes, random.Random], bytes]] = [
    flip_bytes,
    delete_line,
    duplicate_line,
    swap_values,
    truncate,
]


def mutate(data: bytes, rng: random.Random) -> bytes:
    for _ in range(rng.randint(1, 3)):
        data = rng.choice(MUTATIONS)(data, rng)
    return data


def test_mutated_files_fail_only_with_config_error_and_keep_the_last_good_config(workspace: Path) -> None:
    rng = random.Random(SEED)
    valid = (ROOT / "ipybox.toml.example").read_bytes()
    (workspace / "ipybox.toml").write_bytes(valid)
    (workspace / ".env").write_text(DOTENV)
    reconciler = Reconciler(workspace, MCPServers(), NoHooks())
    last_good: WorkspaceConfig = reconciler.load()
    failures = 0

    for case in range(CASES):
        toml, dotenv = valid, DOTENV.encode()
        if rng.random() < 0.85:
            toml = mutate(toml, rng)
        else:
            dotenv = mutate(dotenv, rng)
        (workspace / "ipybox.toml").write_bytes(toml)
        (workspace / ".env").write_bytes(dotenv)
        try:
            config = reconciler.load()
        except ConfigError as e:
            failures += 1
            assert reconciler.config is last_good, case
            assert reconciler.error is e and str(e) and e.problems, case
            assert all(problem.reason for problem in e.problems), case
        else:
            assert reconciler.error is None and reconciler.config is config, case
            last_good = config

    # About half the mutations break the file; the others hit comments (the example is mostly comments).
    assert CASES // 4 < failures < CASES


def test_a_dotenv_that_does_not_decode_keeps_the_last_good_config(workspace: Path) -> None:
    (workspace / "ipybox.toml").write_text("[kernel]\nwarm_pool = 0\n")
    reconciler = Reconciler(workspace, MCPServers(), NoHooks())
    last_good = reconciler.load()
    (workspace / ".env").write_bytes(b"IPYBOX_KERNEL__TIMEOUT=\xff\n")
    with pytest.raises(ConfigError, match=r"\.env: not UTF-8 text"):
        reconciler.load()
    assert reconciler.config is last_good and reconciler.error is not None
