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
