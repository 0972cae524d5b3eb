"""Workspaces: a directory with an `ipybox.toml` declaring MCP servers, the sandbox, the kernels'
environment, tool-call approval rules and endpoints.

Example:
    ```python
    from ipybox.config import ConfigError, load_config

    try:
        config = load_config("example-workspace")
    except ConfigError as e:
        print(e)  # example-workspace/ipybox.toml:12:1: unknown key 'comand' in [servers.fs] (...)
    ```
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ipybox.config.errors import ConfigError, ConfigProblem
    from ipybox.config.loading import CONFIG_FILE, load_config
    from ipybox.config.rule_writer import RuleWriteError, WrittenRule, write_answer_rule
    from ipybox.config.sections import EndpointsSection, KernelSection, SandboxSection, WorkspaceSection
    from ipybox.config.server_writer import ServerEdit, ServerWriteError, remove_server, write_server
    from ipybox.config.servers import (
        RemoteServerSection,
        ServerSection,
        StdioServerSection,
        check_server_name,
        suggest_server_name,
    )
    from ipybox.config.workspace_config import WorkspaceConfig

# Imported on first use: the package's modules (`executables`, `sections`, ...) are imported on their own by
# every executor, which must not pay for loading and writing `ipybox.toml` (pydantic-settings, tomlkit).
_EXPORTS = {
    "CONFIG_FILE": "ipybox.config.loading",
    "ConfigError": "ipybox.config.errors",
    "ConfigProblem": "ipybox.config.errors",
    "EndpointsSection": "ipybox.config.sections",
    "KernelSection": "ipybox.config.sections",
    "RemoteServerSection": "ipybox.config.servers",
    "RuleWriteError": "ipybox.config.rule_writer",
    "SandboxSection": "ipybox.config.sections",
    "ServerEdit": "ipybox.config.server_writer",
    "ServerSection": "ipybox.config.servers",
    "ServerWriteError": "ipybox.config.server_writer",
    "StdioServerSection": "ipybox.config.servers",
    "WorkspaceConfig": "ipybox.config.workspace_config",
    "WorkspaceSection": "ipybox.config.sections",
    "WrittenRule": "ipybox.config.rule_writer",
    "check_server_name": "ipybox.config.servers",
    "load_config": "ipybox.config.loading",
    "remove_server": "ipybox.config.server_writer",
    "suggest_server_name": "ipybox.config.servers",
    "write_answer_rule": "ipybox.config.rule_writer",
    "write_server": "ipybox.config.server_writer",
}

__all__ = [
    "CONFIG_FILE",
    "ConfigError",
    "ConfigProblem",
    "EndpointsSection",
    "KernelSection",
    "RemoteServerSection",
    "RuleWriteError",
    "SandboxSection",
    "ServerEdit",
    "ServerSection",
    "ServerWriteError",
    "StdioServerSection",
    "WorkspaceConfig",
    "WorkspaceSection",
    "WrittenRule",
    "check_server_name",
    "load_config",
    "remove_server",
    "suggest_server_name",
    "write_answer_rule",
    "write_server",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ipybox.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
