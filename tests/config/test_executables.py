"""The check before a server starts, and the warnings of `ipybox doctor`/`validate`, on a workspace's
configuration (no process runs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ipybox.config import load_config
from ipybox.config.executables import (
    LiveKernels,
    ServerCodeGuard,
    protect,
    workspace_executables,
    workspace_warnings,
)
from ipybox.mcp_client import ServerCodeWritableError
from ipybox.mcp_client.params import StdioServerParams, parse_server_params
from ipybox.sandbox.policy import SandboxPolicy

CONFIG = """
[sandbox]
enabled = true
filesystem = {{ allowWrite = ["{tools}"] }}

[servers.local]
command = "python3"
args = ["tools/server.py"]

[servers.allowed]
command = "{tools}/server"
env = {{ TOKEN = "${{SECRET}}" }}
"""


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    path = tmp_path / "allowed"
    path.mkdir()
    (path / "server").write_text("")
    return path


@pytest.fixture
def configured(workspace: Path, tools: Path, write_config: Callable[[str], Path]) -> Path:
    (workspace / "tools").mkdir()
    (workspace / "tools" / "server.py").write_text("")
    write_config(CONFIG.format(tools=tools))
    return workspace


def guard(workspace: Path, policy: SandboxPolicy | None) -> ServerCodeGuard:
    config = load_config(workspace / "ipybox.toml")
    servers = {name: config.server_params(name) for name in config.enabled_servers()}
    kernels = [LiveKernels("a kernel of this workspace", policy)] if policy is not None else []
    return ServerCodeGuard(workspace, lambda: servers, lambda: kernels, environ={"SECRET": "s3"})


def params(workspace: Path, name: str) -> StdioServerParams:
    config = load_config(workspace / "ipybox.toml")
    parsed = parse_server_params(name, config.server_params(name), environ={"SECRET": "s3"})
    assert isinstance(parsed, StdioServerParams)
    return parsed


def kernel_policy(workspace: Path) -> SandboxPolicy:
    config = load_config(workspace / "ipybox.toml")
    return protect(config.sandbox.policy(), workspace_executables(config, workspace))


def test_kernels_get_a_servers_directory_read_only(configured: Path) -> None:
    assert str(configured / "tools") in kernel_policy(configured).filesystem.deny_write


def test_a_server_whose_command_kernels_can_write_is_refused_saying_why(
    configured: Path, tools: Path
) -> None:
    check = guard(configured, kernel_policy(configured))
    assert check.check("local", params(configured, "local")) == params(configured, "local")
    with pytest.raises(ServerCodeWritableError) as refused:
        check.check("allowed", params(configured, "allowed"), secrets=True)
    message = str(refused.value)
    assert f"{tools}/server" in message and "its ${VAR} secrets would reach" in message
    assert "[sandbox] allowWrite" in message and "s3" not in message


def test_a_kernel_started_before_the_server_was_added_refuses_it(configured: Path) -> None:
    older = load_config(configured / "ipybox.toml").sandbox.policy()  # tools/ not protected yet
    check = ServerCodeGuard(
        configured, dict, lambda: [LiveKernels("the kernel of session s1", older, "reset session s1")]
    )
    with pytest.raises(ServerCodeWritableError, match=r"session s1 can write .*tools.*reset session s1"):
        check.check("local", params(configured, "local"))


def test_unsandboxed_kernels_refuse_nothing(configured: Path) -> None:
    assert guard(configured, None).check("allowed", params(configured, "allowed"), secrets=True)


def test_a_sandboxed_server_gets_what_the_host_runs_read_only(configured: Path, tmp_path: Path) -> None:
    sandboxed = StdioServerParams(command="/usr/bin/true", cwd=str(configured / "data"), sandbox=True)
    checked = guard(configured, None).check("fs", sandboxed)
    assert isinstance(checked, StdioServerParams) and checked.sandbox is not None
    deny_write = checked.sandbox.filesystem.deny_write
    # The other server's code, the workspace's protected names (its cwd is a subdirectory).
    assert {str(configured / "tools"), str(configured / "ipybox.toml"), str(configured / ".venv")} <= set(
        deny_write
    )


def test_doctor_warns_about_a_top_level_script_and_a_command_kernels_can_write(
    configured: Path, tools: Path, write_config: Callable[[str], Path]
) -> None:
    (configured / "server.py").write_text("")
    write_config(CONFIG.format(tools=tools).replace('"tools/server.py"', '"server.py"'))
    warnings = workspace_warnings(load_config(configured / "ipybox.toml"), configured)
    assert any(
        line.startswith("server 'local'") and "move server.py into a directory of its own" in line
        for line in warnings
    )
    assert any(line.startswith("server 'allowed'") and f"{tools}/server" in line for line in warnings)
    write_config("[sandbox]\nenabled = false\n[servers.local]\ncommand = 'python3'\nargs = ['server.py']\n")
    assert workspace_warnings(load_config(configured / "ipybox.toml"), configured) == []
