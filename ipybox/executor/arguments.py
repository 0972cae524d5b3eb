"""Which `CodeExecutor` arguments apply to which backend, and the error or warning for those that don't.

`CodeExecutor` has two backends, chosen by `workspace=`:

| argument | embedded (no `workspace`) | workspace (`workspace=DIR`) |
| --- | --- | --- |
| `images_dir`, `output_dir`, `max_output_chars`, `max_output_file_bytes`, `max_image_bytes`, `log_level`, `kernel_init_timeout` | yes | yes |
| `working_dir`, `kernel_env`, `sandbox`, `sandbox_config`, `limits`, `spare_kernel`, `mcp_servers`, `mcptools_dir`, `package_roots`, `approval_timeout`, `connect_timeout`, `approve_tool_calls`, `approve_shell_cmds`, `require_shell_escape` | yes | no: `ipybox.toml` decides |
| `tool_server_host`, `tool_server_port`, `kernel_gateway_host`, `kernel_gateway_port`, `kernel_gateway_url`, `kernel_gateway_token` | yes (see below) | no: the supervisor runs them |
| `execute_accepts_asks` | no: its `execute()` accepts every call already | yes |

Within the embedded backend some arguments exclude others (`sandbox=True` with `kernel_gateway_url` or
`tool_server_port`; `approve_shell_cmds=True` with `kernel_gateway_url`; `require_shell_escape=True` without
`approve_shell_cmds=True`; `limits` with `kernel_gateway_url`; `kernel_gateway_host`/`_port` with `kernel_gateway_url`; `kernel_gateway_token` without
it; `sandbox_config` without `sandbox=True`). Each such argument raises `ValueError` naming it and what to do.

An argument counts as given when the caller passed it, whatever its value (`CodeExecutor` defaults to
`UNSET`): `CodeExecutor(workspace=..., sandbox=False)` is refused as well, because the workspace, not the
caller, decides. Arguments kept from ipybox 0.9 that do nothing here get a `DeprecationWarning` (only
when passed): `tool_server_host` without `tool_server_port` (the tool server listens on a Unix socket).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import PurePath


class Unset(enum.Enum):
    """The type of `UNSET`, the default of `CodeExecutor`'s arguments: "not passed"."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset.UNSET

SHARED = frozenset(
    {
        "images_dir",
        "output_dir",
        "max_output_chars",
        "max_output_file_bytes",
        "max_image_bytes",
        "log_level",
        "kernel_init_timeout",
    }
)
"""Arguments that apply to both backends."""

_SET_BY_WORKSPACE: Mapping[str, str] = {
    "working_dir": "kernels run in the workspace directory",
    "kernel_env": "the kernels' environment is set by the workspace's ipybox.toml ([kernel] env)",
    "sandbox": "sandbox is set by the workspace's ipybox.toml ([sandbox])",
    "sandbox_config": "the sandbox policy is set by the workspace's ipybox.toml ([sandbox])",
    "spare_kernel": "the workspace's warm pool is the spare (ipybox.toml: [kernel] warm_pool)",
    "mcp_servers": "MCP servers are those of the workspace's ipybox.toml ([servers.NAME])",
    "mcptools_dir": "the tool packages are where the workspace's ipybox.toml says ([workspace] mcptools_dir)",
    "package_roots": "the workspace's tool packages are those of its ipybox.toml ([servers.NAME])",
    "approval_timeout": "an ask waits as long as the workspace's ipybox.toml says ([approval] ask_timeout)",
    "connect_timeout": "the workspace's supervisor starts the MCP servers",
    "approve_tool_calls": "tool calls are decided by the workspace's ipybox.toml ([approval] rules)",
    "approve_shell_cmds": "shell commands are asked about when the workspace's ipybox.toml says so "
    "([kernel] approve_shell = true, decided by [approval] rules)",
    "require_shell_escape": "the workspace's ipybox.toml decides it ([kernel] require_shell_escape)",
    "tool_server_host": "the workspace's supervisor runs the tool server",
    "tool_server_port": "the workspace's supervisor runs the tool server",
    "kernel_gateway_host": "the workspace's supervisor runs the kernel gateway",
    "kernel_gateway_port": "the workspace's supervisor runs the kernel gateway",
    "kernel_gateway_url": "the workspace's supervisor runs the kernel gateway",
    "kernel_gateway_token": "the workspace's supervisor runs the kernel gateway",
    "limits": "the kernels' limits are set by the workspace's ipybox.toml ([kernel.limits])",
}
"""Arguments of the embedded backend only, with why they don't apply to a workspace."""


def check_arguments(given: Mapping[str, object], *, workspace: bool) -> list[str]:
    """Check the arguments a caller passed (name -> value, only those passed) for the chosen backend.

    Returns:
        Deprecation messages, one per no-op argument passed, for the caller to warn with.

    Raises:
        ValueError: An argument does not apply to the backend or to the other arguments; the message
            names it and what to do instead.
    """
    for name in ("max_output_file_bytes", "max_image_bytes"):
        value = given.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"{name} takes a positive number of bytes, not {value!r}")
    if workspace:
        for name in given:
            reason = _SET_BY_WORKSPACE.get(name)
            if reason is not None:
                raise ValueError(
                    f"{name} does not apply to CodeExecutor(workspace=...): {reason}; drop {name}="
                )
        return []
    if "execute_accepts_asks" in given:
        raise ValueError(
            "execute_accepts_asks applies to CodeExecutor(workspace=...), whose rules may ask: an embedded "
            "executor's execute() accepts every tool call already; drop execute_accepts_asks="
        )
    _check_embedded(given)
    if "tool_server_host" in given and given.get("tool_server_port") is None:
        return [
            "tool_server_host does nothing without tool_server_port: the tool server listens on a private "
            "Unix socket; drop tool_server_host= (or pass tool_server_port= for a loopback TCP port)"
        ]
    return []


def _check_embedded(given: Mapping[str, object]) -> None:
    if isinstance(given.get("package_roots"), str | PurePath):
        raise ValueError("package_roots takes a list of directories: pass package_roots=[...]")
    if given.get("require_shell_escape") is True and given.get("approve_shell_cmds") is not True:
        raise ValueError(
            "require_shell_escape=True requires approve_shell_cmds=True (it makes shell commands go through "
            "approval): pass approve_shell_cmds=True or drop require_shell_escape="
        )
    if given.get("approve_shell_cmds") is True and given.get("kernel_gateway_url") is not None:
        raise ValueError(
            "approve_shell_cmds=True needs ipybox's own kernels (a gateway at kernel_gateway_url starts "
            "kernels that would run shell commands unasked): drop one of the two"
        )
    sandbox = given.get("sandbox") is True
    url = given.get("kernel_gateway_url") is not None
    limits = given.get("limits")
    if url and limits is not None and getattr(limits, "any", False):
        raise ValueError(
            "limits= applies to kernels of the embedded gateway; a gateway at kernel_gateway_url starts "
            "kernels its own way (set limits there): drop one of the two"
        )
    if sandbox and url:
        raise ValueError(
            "sandbox=True sandboxes kernels of the embedded gateway; a gateway at kernel_gateway_url "
            "runs kernels its own way: drop one of the two"
        )
    if sandbox and given.get("tool_server_port") is not None:
        raise ValueError(
            "sandbox=True needs the tool server on a Unix socket (a sandboxed kernel has no network): "
            "leave tool_server_port unset"
        )
    if given.get("sandbox_config") is not None and not sandbox:
        raise ValueError(
            "sandbox_config applies only with sandbox=True (without it kernels run unsandboxed): "
            "pass sandbox=True or drop sandbox_config="
        )
    for name in ("kernel_gateway_host", "kernel_gateway_port"):
        if url and name in given:
            raise ValueError(
                f"{name} is for the embedded gateway; kernel_gateway_url names a gateway you run: drop {name}="
            )
    if given.get("kernel_gateway_token") and not url:
        raise ValueError(
            "kernel_gateway_token is for the gateway at kernel_gateway_url (the embedded gateway makes its "
            "own token): pass kernel_gateway_url= or drop kernel_gateway_token="
        )
