"""`ipybox.workspace`: the published import path of the workspace configuration, kept.

The code lives in [config][ipybox.config] (`ipybox.toml` -> `WorkspaceConfig`) and
[reconcile][ipybox.reconcile] (applying edits to a running workspace).
"""

from ipybox.config import (
    CONFIG_FILE as CONFIG_FILE,
)
from ipybox.config import (
    ConfigError as ConfigError,
)
from ipybox.config import (
    ConfigProblem as ConfigProblem,
)
from ipybox.config import (
    EndpointsSection as EndpointsSection,
)
from ipybox.config import (
    KernelSection as KernelSection,
)
from ipybox.config import (
    SandboxSection as SandboxSection,
)
from ipybox.config import (
    ServerSection as ServerSection,
)
from ipybox.config import (
    WorkspaceConfig as WorkspaceConfig,
)
from ipybox.config import (
    WorkspaceSection as WorkspaceSection,
)
from ipybox.config import (
    check_server_name as check_server_name,
)
from ipybox.config import (
    load_config as load_config,
)
from ipybox.config import (
    suggest_server_name as suggest_server_name,
)

__all__ = [
    "CONFIG_FILE",
    "ConfigError",
    "ConfigProblem",
    "EndpointsSection",
    "KernelSection",
    "SandboxSection",
    "ServerSection",
    "WorkspaceConfig",
    "WorkspaceSection",
    "check_server_name",
    "load_config",
    "suggest_server_name",
]
