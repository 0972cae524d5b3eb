"""Kernels of a remote gateway (`[kernel.gateway]`, or a `CodeExecutor` given `kernel_gateway_url`): the
`RemoteGateway` a configuration names, and what its kernel start requests carry.

A start request carries no secret and nothing ipybox's kernel needs (that comes with the kernel's set-up,
`ipybox.kernels.remote_setup`): only `KERNEL_*` variables, which Enterprise Gateway passes on to its kernel
templates: `KERNEL_USERNAME`, and `KERNEL_MEMORY_LIMIT` / `KERNEL_CPUS_LIMIT`, which they turn into the
limits of the kernel's pod or container. Whether a template applies them is the deployment's: ipybox
reports them as requested, not as enforced (`ipybox status`).
"""

from __future__ import annotations

import getpass

from ipybox.config import WorkspaceConfig
from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.kernels.remote_gateway import RemoteGateway
from ipybox.limits import ResourceLimits
from ipybox.mcp_client.params import resolve_placeholders

MEMORY_LIMIT_ENV = "KERNEL_MEMORY_LIMIT"
CPUS_LIMIT_ENV = "KERNEL_CPUS_LIMIT"


def remote_gateway_of(config: WorkspaceConfig) -> RemoteGateway:
    """The gateway of `config`'s `[kernel.gateway]`, its token's `${VAR}` placeholders filled.

    Raises:
        ValueError: There is no `[kernel.gateway]`, or a placeholder names a variable that is not set.
    """
    gateway = config.kernel.gateway
    if gateway is None:
        raise ValueError("this workspace has no [kernel.gateway]")
    try:
        token = resolve_placeholders({"token": gateway.token}, dotenv_path=config.root / ".env")["token"]
    except ValueError as e:
        raise ValueError(f"[kernel.gateway] token: {e}") from None
    ca_file = config.resolve(gateway.ca_file) if gateway.ca_file is not None else None
    return RemoteGateway(GatewayEndpoint(gateway.url, token, ca_file=ca_file), gateway.kernelspec)


USERNAME_ENV = "KERNEL_USERNAME"


def remote_start_env(limits: ResourceLimits) -> dict[str, str]:
    """What a kernel start request carries: the user it is started for (as Jupyter's own gateway clients
    send it; Enterprise Gateway refuses a start without it when it runs as root, and its templates may
    run the kernel as that user) and the limits asked of its kernel template."""
    return {USERNAME_ENV: getpass.getuser(), **remote_limits_env(limits)}


def remote_limits_env(limits: ResourceLimits) -> dict[str, str]:
    """What a kernel start request asks of the gateway's kernel template (see the module docstring)."""
    env: dict[str, str] = {}
    if limits.memory is not None:
        env[MEMORY_LIMIT_ENV] = str(int(limits.memory))  # bytes: a Kubernetes quantity as it is
    if limits.cpus is not None:
        env[CPUS_LIMIT_ENV] = f"{limits.cpus:g}"
    return env
