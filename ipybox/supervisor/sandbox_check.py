"""`check_sandboxed`, `check_running_sandboxed`: what `--sandbox` asks of a workspace, checked before it
runs (`ipybox up --sandbox`) or before a command attaches to one that runs.

Contract: each raises one `ConfigError` placed at what turned the sandbox off (the file, `.env` or an
environment variable) and saying how to change it, or returns.
"""

from __future__ import annotations

from pathlib import Path

from ipybox.config import CONFIG_FILE, ConfigError, ConfigProblem, WorkspaceConfig
from ipybox.config.loading import setting_source
from ipybox.running.control_client import ControlClient
from ipybox.running.state import SupervisorState


def check_sandboxed(config: WorkspaceConfig) -> None:
    """Check that `config`, the effective configuration (`ipybox.toml` with `.env` and the environment
    over it), runs kernels sandboxed, as `--sandbox` asks.

    Raises:
        ConfigError: It doesn't; placed at what turned the sandbox off, and saying how to change it.
    """
    if config.kernel.gateway is not None:
        source, line, column = setting_source(config, ("kernel", "gateway"))
        reason = (
            "sandboxed kernels were asked for (--sandbox), but [kernel.gateway] runs kernels on a remote gateway, which ipybox does "
            "not sandbox (its cluster isolates them): don't ask for them (leave out --sandbox), or remove [kernel.gateway]"
        )
        path = config.path if config.path is not None else config.root / CONFIG_FILE
        raise ConfigError(path, [ConfigProblem(source, line, column, reason)])
    if config.sandbox.enabled:
        return
    source, line, column = setting_source(config, ("sandbox", "enabled"))
    if source.startswith("environment variable"):
        reason = "this variable turns the sandbox off (over ipybox.toml): unset it"
    elif source == str(config.root / ".env"):
        reason = "this line turns the sandbox off (over ipybox.toml): remove it"
    else:
        reason = (
            "this file does not enable the sandbox: set `enabled = true` under [sandbox] (its policy applies)"
        )
    reason = f"sandboxed kernels were asked for (--sandbox), but {reason}, or don't ask for them (leave out --sandbox)"
    path = config.path if config.path is not None else config.root / CONFIG_FILE
    raise ConfigError(path, [ConfigProblem(source, line, column, reason)])


async def check_running_sandboxed(state: SupervisorState) -> None:
    """Check that the workspace running with `state` (an `ipybox up` of its own, with its own environment)
    runs kernels sandboxed, as `--sandbox` asks of a command that attaches to it.

    Raises:
        ConfigError: It runs them unsandboxed.
        NotRunningError: It stopped meanwhile.
    """
    async with ControlClient(state) as control:
        if (await control.status()).sandbox:
            return
    path = Path(state.workspace) / CONFIG_FILE
    reason = (
        f"sandboxed kernels were asked for (--sandbox), but the workspace running in {state.workspace} runs kernels unsandboxed (its "
        "[sandbox] enabled is false, from ipybox.toml, .env or the environment of the `ipybox up` that runs "
        "it): stop it with `ipybox down`, enable the sandbox, or don't ask for them (leave out --sandbox)"
    )
    raise ConfigError(path, [ConfigProblem(str(path), None, None, reason)])
