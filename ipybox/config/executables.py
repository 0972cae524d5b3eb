"""What a workspace's host side executes, kept out of its kernels' reach, and the check before a server starts.

The paths come from `ipybox.sandbox.executables` (how a server's command, script, modules and environment
are found there), applied here to a workspace's configuration (`workspace_executables`) or to the servers
a `CodeExecutor` knows (`servers_executables`). Three uses, one derivation:

- Kernels: `protect` adds the paths inside the workspace to a sandbox policy's `denyWrite`, so every
  sandboxed kernel sees them read-only, like the protected names (`ipybox.sandbox.policy`).
- Sandboxed servers: `ServerCodeGuard.check` adds the same paths to the server's own policy, together with
  the protected names of the workspace; a server whose `cwd` is a subdirectory also gets the paths as
  derived for that directory (its writable root, whose own entry a view can't protect), so a server
  can't change what it or the host runs next either.
- Starting a server: `ServerCodeGuard.check` refuses a server (`ServerCodeWritableError`) when a path it
  executes is still writable by a kernel that lives: one in an `allowWrite` directory, or one a kernel
  started before the server was added can write (its policy did not protect it yet). The server would
  run the kernel's code, on the host when it is unsandboxed, and with its `${VAR}` secrets. Nothing is
  refused while kernels run unsandboxed: they are on the host already.

Which kernels live, and under which policy, is the caller's. `CodeExecutor` has one policy for all its
kernels, fixed when it starts: a server found later (generated since) whose code they can write is
refused. The workspace's supervisor (`ipybox up`, where `ipybox.toml` is edited live) decides the live
case this way: before a server starts it derives the paths again, and when they changed it has the
gateway start kernels under the new policy and replaces the warm pool's idle kernels; a leased kernel
keeps the policy it started with, and while one lives that can write the new server's code, the server is
refused (secrets or not), naming that kernel's session: reset it (its next kernel comes from the new
pool), then save `ipybox.toml` again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ipybox.mcp_client.errors import ServerCodeWritableError, ServerParamsError
from ipybox.mcp_client.params import (
    ServerParams,
    ServerSandbox,
    StdioServerParams,
    parse_server_params,
    validate_server_params,
)
from ipybox.sandbox.executables import (
    Derived,
    deny_write_entries,
    interpreter_executables,
    kernel_writable,
    server_executables,
)
from ipybox.sandbox.policy import DEFAULT_DENY_WRITE, SandboxPolicy

if TYPE_CHECKING:
    from ipybox.config.workspace_config import WorkspaceConfig

_WORKSPACE_ENV = "IPYBOX_WORKSPACE"
_Policy = TypeVar("_Policy", bound=SandboxPolicy)


@dataclass(frozen=True)
class LiveKernels:
    """Kernels that live under one sandbox policy.

    Attributes:
        who: Who they are, for the error (`the workspace's kernels`, `the kernel of session 1f2e...`).
        policy: The policy they were started with.
        fix: What makes them go, when that is the fix (e.g. "reset session 1f2e..."); else empty.
    """

    who: str
    policy: SandboxPolicy
    fix: str = ""


def stdio_executables(name: str, params: StdioServerParams, workspace: Path) -> Derived:
    """What the stdio server `name` executes (`params` with placeholders filled in), inside `workspace` or
    not; its `cwd` defaults to the current directory, as when it starts."""
    # Here, not at the top: loading `ipybox.config` must not load the MCP SDK (it takes longer than the rest
    # of ipybox), and this runs only for a workspace or an executor that declares stdio servers.
    from mcp.client.stdio import get_default_environment

    environ = get_default_environment() | dict(params.env)
    cwd = params.cwd or os.getcwd()
    return server_executables(name, params.command, params.args, environ, cwd, str(workspace))


def servers_executables(
    servers: Mapping[str, Mapping[str, Any] | ServerParams],
    workspace: Path,
    *,
    environ: Mapping[str, str] | None = None,
    dotenv_path: Path | None = None,
) -> Derived:
    """What the interpreter ipybox runs on and `servers` execute, for `workspace`.

    Placeholders are filled from `environ` (default: the host's) and `dotenv_path`; a server whose
    variables are not set yet is derived with them left in (it can't start before they are, and is
    checked again then).
    """
    derived = interpreter_executables(str(workspace))
    for name, given in servers.items():
        params = _resolved(name, given, environ, dotenv_path)
        if isinstance(params, StdioServerParams):
            derived.extend(stdio_executables(name, params, workspace))
    return derived


def workspace_executables(config: WorkspaceConfig, workspace: Path) -> Derived:
    """What a workspace's enabled servers and ipybox's own interpreter execute (as `servers_executables`,
    with `${IPYBOX_WORKSPACE}` and the workspace's `.env`)."""
    servers = {name: config.server_params(name) for name in config.enabled_servers()}
    environ = {**os.environ, _WORKSPACE_ENV: str(workspace)}
    return servers_executables(servers, workspace, environ=environ, dotenv_path=workspace / ".env")


def protect(policy: SandboxPolicy, derived: Derived) -> SandboxPolicy:
    """`policy` with the derived paths inside the workspace added to its `denyWrite`."""
    return _deny_write(policy, deny_write_entries(derived.protected))


class ServerCodeGuard:
    """The check before a server starts (see the module).

    Args:
        workspace: The kernels' working directory.
        servers: The servers known now, by name (parameters as registered, placeholders left in).
        kernels: The kernels that live now, each group with its policy; empty when they run unsandboxed.
        environ: Fills in placeholders (default: the host's environment).
        dotenv_path: A `.env` file for placeholders missing from `environ`.
    """

    def __init__(
        self,
        workspace: Path,
        servers: Callable[[], Mapping[str, Mapping[str, Any] | ServerParams]],
        kernels: Callable[[], Sequence[LiveKernels]],
        *,
        environ: Mapping[str, str] | None = None,
        dotenv_path: Path | None = None,
    ) -> None:
        self.workspace = workspace.resolve()
        self.servers = servers
        self.kernels = kernels
        self.environ = environ
        self.dotenv_path = dotenv_path

    def derive(self, root: Path | None = None) -> Derived:
        """What the known servers and ipybox's interpreter execute, for `root` (default: the workspace)."""
        return servers_executables(
            self.servers(), root or self.workspace, environ=self.environ, dotenv_path=self.dotenv_path
        )

    def check(self, name: str, params: ServerParams, *, secrets: bool = False) -> ServerParams:
        """The parameters to start server `name` with (placeholders filled in): a sandboxed server's policy
        protects what the host executes; others are returned as they are.

        Args:
            secrets: Whether `${VAR}` placeholders were filled in (named in the error).

        Raises:
            ServerCodeWritableError: A kernel that lives could write a path the server executes.
        """
        if not isinstance(params, StdioServerParams):
            return params
        executed = stdio_executables(name, params, self.workspace)
        home = Path.home()
        for kernels in self.kernels():
            writable = kernel_writable(executed.executed, kernels.policy.view(self.workspace, home))
            if writable:
                raise ServerCodeWritableError(name, self._refusal(executed, writable[0], kernels, secrets))
        if params.sandbox is None or not params.sandbox.enabled:
            return params
        return params.model_copy(update={"sandbox": self._sandbox(params)})

    def _sandbox(self, params: StdioServerParams) -> ServerSandbox:
        assert params.sandbox is not None
        cwd = Path(params.cwd or os.getcwd()).resolve()
        entries = deny_write_entries(self.derive().protected)
        if cwd != self.workspace:
            # The workspace's protected names, wherever the server may write (its view protects them in
            # its cwd only), and what runs from its cwd as seen from there.
            entries += [str(self.workspace / name) for name in DEFAULT_DENY_WRITE]
            if cwd.is_relative_to(self.workspace):
                entries += deny_write_entries(self.derive(cwd).protected)
        return _deny_write(params.sandbox, entries)

    def _refusal(self, executed: Derived, path: str, kernels: LiveKernels, secrets: bool) -> str:
        why = next(
            (item.why.split(": ", 1)[-1] for item in executed.executed if path in (item.path, item.shown())),
            "code it runs",
        )
        runs = (
            "its ${VAR} secrets would reach the kernel's code"
            if secrets
            else "it would run the kernel's code"
        )
        fix = kernels.fix or (
            f"keep {path} out of the kernels' writable paths ([sandbox] allowWrite), or add it to "
            "[sandbox] denyWrite, or install the server where kernels can't write"
        )
        return f"not started: {kernels.who} can write {path} ({why}), so {runs}; {fix}"


def _resolved(
    name: str,
    given: Mapping[str, Any] | ServerParams,
    environ: Mapping[str, str] | None,
    dotenv_path: Path | None,
) -> ServerParams | None:
    try:
        return parse_server_params(name, given, environ=environ, dotenv_path=dotenv_path)
    except ServerParamsError:
        pass
    try:
        return validate_server_params(name, given)
    except ServerParamsError:
        return None  # invalid: it never starts


def _deny_write(policy: _Policy, entries: Sequence[str]) -> _Policy:
    """`policy` (a `SandboxPolicy` or a server's) with `entries` added to its `denyWrite`."""
    deny_write = list(dict.fromkeys([*policy.filesystem.deny_write, *entries]))
    if deny_write == policy.filesystem.deny_write:
        return policy
    files = policy.filesystem.model_copy(update={"deny_write": deny_write})
    return policy.model_copy(update={"filesystem": files})


def workspace_warnings(config: WorkspaceConfig, workspace: Path) -> list[str]:
    """What `ipybox doctor` and `ipybox validate` warn about: code the host or a server runs that a
    sandboxed kernel could still change, one line each, naming the server and the fix. Empty when the
    kernels run unsandboxed (they are on the host already)."""
    if not config.sandbox.enabled:
        return []
    workspace = workspace.resolve()
    derived = workspace_executables(config, workspace)
    warnings = list(derived.unprotected)
    view = protect(config.sandbox.policy(), derived).view(workspace, Path.home())
    for item in derived.executed:
        for path in kernel_writable([item], view):
            line = (
                f"{item.why} {path} is writable by kernels, so the server won't start: keep it out of "
                "[sandbox] allowWrite (or add it to denyWrite), or install it where kernels can't write"
            )
            if line not in warnings:
                warnings.append(line)
    return warnings
