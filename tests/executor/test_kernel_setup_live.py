"""The environment rules of the shared kernel builder, seen from inside real kernels: a workspace's (`ipybox
up`) and an embedded executor's, started in the same directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.in_kernel.tool_runner import SERVER_ENV, TOKEN_ENV
from ipybox.supervisor import Supervisor

pytestmark = pytest.mark.integration

SHOW_ENV = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k in NAMES}))"
NAMES = ["PLAIN", "FILLED", "PREFIXED", "IPYBOX_TEST_FILLED", "KERNEL_ENV_PREFIXED", SERVER_ENV, TOKEN_ENV]


async def _kernel_env(executor: CodeExecutor) -> dict[str, str]:
    result = await executor.execute(f"NAMES = {NAMES!r}\n{SHOW_ENV}")
    env: dict[str, str] = json.loads(result.text or "{}")
    return env


async def test_workspace_and_embedded_kernels_follow_their_documented_environment_rules(
    tmp_path: Path,
) -> None:
    (tmp_path / "ipybox.toml").write_text(
        '[kernel]\nwarm_pool = 1\nenv = { PLAIN = "p", FILLED = "${IPYBOX_TEST_FILLED}" }\n\n'
        "[sandbox]\nenabled = false\n"
    )
    (tmp_path / ".env").write_text("IPYBOX_TEST_FILLED=from-dotenv\nKERNEL_ENV_PREFIXED=pre\n")
    supervisor = Supervisor(tmp_path)
    await supervisor.start()
    try:
        async with CodeExecutor(workspace=tmp_path) as attached:
            workspace_env = await _kernel_env(attached)
    finally:
        await supervisor.stop()
    async with CodeExecutor(
        working_dir=tmp_path, kernel_env={"PLAIN": "p", "FILLED": "${IPYBOX_TEST_FILLED}"}, spare_kernel=False
    ) as embedded:
        embedded_env = await _kernel_env(embedded)

    # ipybox.toml's [kernel] env is filled from .env, KERNEL_ENV_X arrives as X, .env itself stays out.
    assert {k: workspace_env.get(k) for k in ("PLAIN", "FILLED", "PREFIXED")} == {
        "PLAIN": "p",
        "FILLED": "from-dotenv",
        "PREFIXED": "pre",
    }
    # kernel_env is what the caller passed, literally; nothing of the host's .env.
    assert {k: embedded_env.get(k) for k in ("PLAIN", "FILLED", "PREFIXED")} == {
        "PLAIN": "p",
        "FILLED": "${IPYBOX_TEST_FILLED}",
        "PREFIXED": None,
    }
    for env in (workspace_env, embedded_env):
        assert "IPYBOX_TEST_FILLED" not in env and "KERNEL_ENV_PREFIXED" not in env
        assert env[SERVER_ENV].startswith("unix:") and env[TOKEN_ENV]
