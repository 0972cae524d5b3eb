"""`CodeExecutor`'s keyword arguments (ipybox 0.9.2's and later ones), read into its options.

A thin layer: `options_of` turns the arguments a caller passed into
[EmbeddedOptions][ipybox.executor.options.EmbeddedOptions] or
[WorkspaceOptions][ipybox.executor.options.WorkspaceOptions], which are the configuration; what can't
work together is refused there, or here when the options can't even express it (a `sandbox_config`
without `sandbox=True`, a `kernel_gateway_host` next to a `kernel_gateway_url`).

An argument counts as given when the caller passed it, whatever its value: `CodeExecutor(workspace=...,
sandbox=False)` is refused, because the workspace, not the caller, decides. With `workspace`, only the
arguments `WorkspaceOptions` holds apply (`images_dir`, `output_dir`, `max_output_chars`,
`max_output_file_bytes`, `max_image_bytes`, `kernel_init_timeout`, `log_level`, `execute_accepts_asks`);
any other raises `ValueError` naming where the workspace's `ipybox.toml` sets it. Arguments kept from
ipybox 0.9 that do nothing warn (`tool_server_host` without `tool_server_port`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypedDict

from ipybox.executor.options import (
    ApprovalOptions,
    EmbeddedGateway,
    EmbeddedOptions,
    ExternalGateway,
    KernelOptions,
    OutputOptions,
    SandboxOptions,
    ToolOptions,
    WorkspaceOptions,
)
from ipybox.limits import ResourceLimits

__all__ = ["UNSET", "ExecutorArguments", "LaterArguments", "PublishedArguments", "Unset", "options_of"]


class Unset(enum.Enum):
    """The type of `UNSET`, the default of the 0.9.2 positional arguments: "not passed"."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset.UNSET


class PublishedArguments(TypedDict, total=False):
    """ipybox 0.9.2's arguments of `CodeExecutor`, in their positional order, as passed."""

    tool_server_host: str
    tool_server_port: int | None
    kernel_gateway_host: str
    kernel_gateway_port: int | None
    kernel_env: Mapping[str, str] | None
    images_dir: str | Path | None
    approval_timeout: float | None
    connect_timeout: float
    sandbox: bool
    sandbox_config: str | Path | None
    log_level: str


class LaterArguments(TypedDict, total=False):
    """The keyword-only arguments of `CodeExecutor` added since (but `workspace` and `options`), as passed."""

    working_dir: str | Path | None
    kernel_gateway_url: str | None
    kernel_gateway_token: str
    max_output_chars: int
    output_dir: str | Path | None
    max_output_file_bytes: int
    max_image_bytes: int
    spare_kernel: bool
    mcp_servers: Mapping[str, Mapping[str, Any]] | None
    mcptools_dir: str | Path | None
    package_roots: Sequence[str | Path] | None
    kernel_init_timeout: float | None
    approve_tool_calls: bool
    approve_shell_cmds: bool
    require_shell_escape: bool
    limits: ResourceLimits | None
    execute_accepts_asks: bool
    client: str | None


class ExecutorArguments(PublishedArguments, LaterArguments, total=False):
    """Every argument of `CodeExecutor` but `workspace` and `options`, as passed (see its docstring)."""


LATER_NAMES: Final = frozenset(LaterArguments.__optional_keys__)

_FOR_WORKSPACE: Final = frozenset(
    {
        "images_dir",
        "output_dir",
        "max_output_chars",
        "max_output_file_bytes",
        "max_image_bytes",
        "kernel_init_timeout",
        "log_level",
        "execute_accepts_asks",
        "client",
    }
)
"""The arguments `WorkspaceOptions` holds."""

_SET_BY_WORKSPACE: Final[Mapping[str, str]] = {
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
    "limits": "the kernels' limits are set by the workspace's ipybox.toml ([kernel.limits])",
}
"""Why each embedded-only argument does not apply to a workspace (the rest: its supervisor runs them)."""


def options_of(
    given: ExecutorArguments, workspace: str | Path | None
) -> tuple[EmbeddedOptions | WorkspaceOptions, list[str]]:
    """The options the arguments a caller passed stand for.

    Returns:
        The options, and deprecation messages (one per no-op argument passed) for the caller to warn with.

    Raises:
        ValueError: An argument does not apply to the mode or to the other arguments; the message names it
            and what to do instead.
    """
    output = OutputOptions(
        images_dir=_path(given.get("images_dir")),
        output_dir=_path(given.get("output_dir")),
        max_output_chars=given.get("max_output_chars", OutputOptions.max_output_chars),
        # None: the default (with `workspace`: its ipybox.toml's, read when attaching).
        max_output_file_bytes=given.get("max_output_file_bytes"),
        max_image_bytes=given.get("max_image_bytes"),
    )
    if workspace is not None:
        for name in given:
            if name not in _FOR_WORKSPACE:
                reason = _SET_BY_WORKSPACE.get(name, _runs_it(name))
                raise ValueError(
                    f"{name} does not apply to CodeExecutor(workspace=...): {reason}; drop {name}="
                )
        return WorkspaceOptions(
            Path(workspace),
            output=output,
            kernel_init_timeout=given.get("kernel_init_timeout", 60),
            execute_accepts_asks=given.get("execute_accepts_asks", False),
            log_level=given.get("log_level", "WARNING"),
            client=given.get("client"),
        ), []
    if "client" in given:
        raise ValueError(
            "client names a session of a workspace for the people asked about its calls: it applies to "
            "CodeExecutor(workspace=...) only; drop client="
        )
    if "execute_accepts_asks" in given:
        raise ValueError(
            "execute_accepts_asks applies to CodeExecutor(workspace=...), whose rules may ask: an embedded "
            "executor's execute() accepts every tool call already; drop execute_accepts_asks="
        )
    options = EmbeddedOptions(
        kernel=KernelOptions(
            working_dir=_path(given.get("working_dir")),
            env=dict(given.get("kernel_env") or {}),
            spare_kernel=given.get("spare_kernel", True),
            init_timeout=given.get("kernel_init_timeout", 60),
            limits=given.get("limits") or ResourceLimits(),
            sandbox=_sandbox(given),
        ),
        gateway=_gateway(given),
        tools=ToolOptions(
            mcp_servers=dict(given.get("mcp_servers") or {}),
            mcptools_dir=_path(given.get("mcptools_dir")),
            package_roots=_roots(given.get("package_roots")),
            connect_timeout=given.get("connect_timeout", 30),
            server_port=given.get("tool_server_port"),
            server_host=given.get("tool_server_host", "localhost"),
        ),
        approval=ApprovalOptions(
            tool_calls=given.get("approve_tool_calls", True),
            shell_cmds=given.get("approve_shell_cmds", False),
            require_shell_escape=given.get("require_shell_escape", False),
            timeout=given.get("approval_timeout", 60),
        ),
        output=output,
        log_level=given.get("log_level", "WARNING"),
    )
    if "tool_server_host" in given and given.get("tool_server_port") is None:
        return options, [
            "tool_server_host does nothing without tool_server_port: the tool server listens on a private "
            "Unix socket; drop tool_server_host= (or pass tool_server_port= for a loopback TCP port)"
        ]
    return options, []


def _runs_it(name: str) -> str:
    part = "tool server" if name.startswith("tool_server_") else "kernel gateway"
    return f"the workspace's supervisor runs the {part}"


def _sandbox(given: ExecutorArguments) -> SandboxOptions | None:
    config = _path(given.get("sandbox_config"))
    if given.get("sandbox") is True:
        return SandboxOptions(config)
    if config is not None:
        raise ValueError(
            "sandbox_config applies only with sandbox=True (without it kernels run unsandboxed): "
            "pass sandbox=True or drop sandbox_config="
        )
    return None


def _gateway(given: ExecutorArguments) -> EmbeddedGateway | ExternalGateway:
    url = given.get("kernel_gateway_url")
    if url is None:
        if given.get("kernel_gateway_token"):
            raise ValueError(
                "kernel_gateway_token is for the gateway at kernel_gateway_url (the embedded gateway makes "
                "its own token): pass kernel_gateway_url= or drop kernel_gateway_token="
            )
        return EmbeddedGateway(
            given.get("kernel_gateway_host", "localhost"), given.get("kernel_gateway_port")
        )
    for name in ("kernel_gateway_host", "kernel_gateway_port"):
        if name in given:
            raise ValueError(
                f"{name} is for the embedded gateway; kernel_gateway_url names a gateway you run: drop {name}="
            )
    return ExternalGateway(url, given.get("kernel_gateway_token", ""))


def _roots(roots: Sequence[str | Path] | None) -> tuple[Path, ...]:
    if isinstance(roots, str | Path):
        raise ValueError("package_roots takes a list of directories: pass package_roots=[...]")
    return tuple(Path(root) for root in roots or ())


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None
