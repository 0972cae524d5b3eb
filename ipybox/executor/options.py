"""What a `CodeExecutor` is configured with: one immutable value object per concern, one per mode.

- [EmbeddedOptions][ipybox.executor.options.EmbeddedOptions]: an executor with a tool server, a gateway and
  a kernel of its own ([EmbeddedBackend][ipybox.executor.backends.EmbeddedBackend]). It holds
  `KernelOptions` (working dir, environment, spare kernel, start timeout, limits and `SandboxOptions`), the
  gateway (`EmbeddedGateway`, or `ExternalGateway` for one you run), `ToolOptions` (MCP servers, tool
  packages, the tool server's address), `ApprovalOptions` and `OutputOptions`.
- [WorkspaceOptions][ipybox.executor.options.WorkspaceOptions]: a lease on a workspace `ipybox up` runs
  ([WorkspaceBackend][ipybox.executor.backends.WorkspaceBackend]), whose `ipybox.toml` decides everything
  else; only `OutputOptions`, the kernel start timeout and what `execute()` does with `ask`s are its own.

```python
options = EmbeddedOptions(
    kernel=KernelOptions(working_dir=Path("project"), sandbox=SandboxOptions()),
    approval=ApprovalOptions(shell_cmds=True),
)
async with CodeExecutor(options=options) as executor:
    ...
```

Combinations that can't work are either impossible to write (a sandbox policy file without a sandbox, a
host for a gateway given by URL) or refused when the options are made, with one `ValueError` that names
the settings involved and what to do: a sandbox (or `limits`, or shell approval) with an external
gateway, a sandbox with the tool server on a TCP port, `require_shell_escape` without shell approval, an
external gateway's call-channel certificate without its key.
Nothing here starts a process or reads a file. `CodeExecutor`'s keyword arguments (ipybox 0.9.2's and
later ones) are a thin layer that builds these ([arguments][ipybox.executor.arguments]).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from ipybox.approval.channel import Answers
from ipybox.kernels.kernel_client import DEFAULT_MAX_OUTPUT_CHARS
from ipybox.limits import ResourceLimits

__all__ = [
    "Answers",
    "ApprovalOptions",
    "EmbeddedGateway",
    "EmbeddedOptions",
    "ExternalGateway",
    "KernelOptions",
    "OutputOptions",
    "SandboxOptions",
    "ToolOptions",
    "WorkspaceOptions",
]


def _positive_bytes(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"{name} takes a positive number of bytes, not {value!r}")


@dataclass(frozen=True)
class OutputOptions:
    """What becomes of an execution's output (both modes).

    Attributes:
        images_dir: Where displayed images (plots) are saved; `None`: `images` in the working dir.
        output_dir: Where complete outputs too large for `max_output_chars` are saved.
        max_output_chars: Output kept in memory per execution; a larger one is shortened to its head and
            tail, the whole saved under `output_dir`.
        max_output_file_bytes: Bytes of one execution's output (and its images) saved; `None`: 256 MiB, or
            with a workspace its `ipybox.toml`'s `[kernel]` setting.
        max_image_bytes: The largest image saved; `None`: 32 MiB, or the workspace's setting.

    Raises:
        ValueError: A byte limit that is not a positive integer.
    """

    images_dir: Path | None = None
    output_dir: Path | None = None
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    max_output_file_bytes: int | None = None
    max_image_bytes: int | None = None

    def __post_init__(self) -> None:
        _positive_bytes("max_output_file_bytes", self.max_output_file_bytes)
        _positive_bytes("max_image_bytes", self.max_image_bytes)


@dataclass(frozen=True)
class SandboxOptions:
    """Kernels (and all they start) run in ipybox's sandbox (`ipybox.sandbox`); a machine that can't
    sandbox fails `start()` with `SandboxUnavailableError`, never runs them unsandboxed.

    Attributes:
        config: A policy file (JSON, sandbox-runtime format) extending the default policy.
    """

    config: Path | None = None


@dataclass(frozen=True)
class KernelOptions:
    """The embedded executor's kernels.

    Attributes:
        working_dir: Their working directory, restored before each cell (ipybox 0.9.2's `working_dir`);
            `None`: the current directory, not restored.
        env: Environment variables for them, taken literally (they inherit nothing else of the host).
        spare_kernel: Keep a started kernel in reserve, so `reset()` is a swap.
        init_timeout: Seconds a new kernel gets to become ready (`None`: no limit).
        limits: What a kernel, with everything it starts, may use.
        sandbox: Sandbox them (`None`: unsandboxed).
    """

    working_dir: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    spare_kernel: bool = True
    init_timeout: float | None = 60
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    sandbox: SandboxOptions | None = None


@dataclass(frozen=True)
class EmbeddedGateway:
    """A kernel gateway of the executor's own, on loopback (`port=None`: a free one)."""

    host: str = "localhost"
    port: int | None = None


@dataclass(frozen=True)
class ExternalGateway:
    """A kernel gateway you run (e.g. Jupyter Enterprise Gateway, kernels on other machines), at `url`
    with `token`.

    Its kernels need not share a file with this machine: right after one answers, the executor sets it up
    (`ipybox.kernels.remote_setup`): it pins the tool server's certificate, gets the tool server's call
    token and `KernelOptions.env`, and imports the generated `mcptools` / `gentools` / `mcpparse` from the
    tool server. So the kernel spec's Python must have ipybox installed (the host's version); a kernel
    that can't be set up is deleted and `start()` (or `reset()`) fails saying so. The kernels reach the
    tool server over TCP with TLS, at `calls_advertise` (default: `calls_bind`'s host and bound port);
    the start request carries only the `KERNEL_*` variables of `KernelOptions.env` (which a gateway
    passes on to its kernel templates), never the call token.

    Attributes:
        url: The gateway's base URL (`http://` or `https://`).
        token: Its auth token (empty: none).
        kernelspec: The kernel spec kernels start from (`None`: the gateway's default); checked at start.
        ca_file: A CA bundle the gateway's `https://` certificate is checked against (default: the
            system's CAs).
        calls_bind: `HOST:PORT` where the tool server listens for the kernels' calls (port 0: a free one);
            default loopback only, for a gateway on this machine. Beyond loopback it listens with TLS only.
        calls_advertise: `HOST` or `HOST:PORT` the kernels dial, when it differs from `calls_bind` (a
            cluster's Service name, a forwarded port); required when `calls_bind` is a wildcard (`0.0.0.0`).
        calls_cert: A certificate (PEM) for the call channel; with `calls_key`. Default: a self-signed one
            the executor makes for the advertised host, kept in a private directory removed at `stop()`.
            Kernels pin whichever it is.
        calls_key: `calls_cert`'s private key (PEM, unencrypted).

    Raises:
        ValueError: `calls_cert` without `calls_key` or the other way round, or an address that is not
            `HOST:PORT` (`calls_bind` must name a port).
    """

    url: str
    token: str = ""
    kernelspec: str | None = None
    ca_file: Path | None = None
    calls_bind: str = "127.0.0.1:0"
    calls_advertise: str | None = None
    calls_cert: Path | None = None
    calls_key: Path | None = None

    def __post_init__(self) -> None:
        # Here, not at the top: it loads `cryptography`, which `from ipybox import CodeExecutor` need not.
        from ipybox.tool_server.remote_calls import split_host_port

        if (self.calls_cert is None) != (self.calls_key is None):
            raise ValueError(
                "calls_cert and calls_key go together (the call channel's certificate and its key): pass "
                "both, or neither for a certificate the executor makes"
            )
        if self.kernelspec is not None and not self.kernelspec.strip():
            raise ValueError("kernelspec names a kernel spec of the gateway: pass its name, or None")
        _, port = split_host_port(self.calls_bind, "calls_bind")
        if port is None:
            raise ValueError(
                f"calls_bind must name a port (HOST:PORT, 0 for a free one), not {self.calls_bind!r}"
            )
        if self.calls_advertise is not None:
            split_host_port(self.calls_advertise, "calls_advertise")
        for name in ("ca_file", "calls_cert", "calls_key"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))


@dataclass(frozen=True)
class ToolOptions:
    """The MCP servers the kernels' code may call, and the tool server that runs them.

    Attributes:
        mcp_servers: Server parameters by name, in addition to those `generate_mcp_sources` recorded; a
            name here comes first.
        mcptools_dir: Where the generated tool packages are; `None`: `mcptools` in the working dir.
        package_roots: More directories tool packages were generated into, whose servers may be called
            (relative paths: to the current directory); a call from any other directory is refused.
        connect_timeout: Seconds an MCP server gets to start.
        server_port: Serve the tool server on this loopback TCP port (`None`: a private Unix socket).
        server_host: Its loopback host, with `server_port`.

    Raises:
        ValueError: `package_roots` is one path instead of a list of them.
    """

    mcp_servers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    mcptools_dir: Path | None = None
    package_roots: tuple[Path, ...] = ()
    connect_timeout: float = 30
    server_port: int | None = None
    server_host: str = "localhost"

    def __post_init__(self) -> None:
        if isinstance(self.package_roots, str | PurePath):
            raise ValueError("package_roots takes a list of directories: pass package_roots=[...]")
        object.__setattr__(self, "package_roots", tuple(Path(root).resolve() for root in self.package_roots))


@dataclass(frozen=True)
class ApprovalOptions:
    """What the application is asked about (`ApprovalRequest`s in `stream()`).

    Attributes:
        tool_calls: Ask before each MCP tool call (`False`: they run unasked).
        shell_cmds: Ask before each shell command of the code (`!cmd`, `%%bash`, ...).
        require_shell_escape: With `shell_cmds`: starting processes other than through `!` raises.
        timeout: Seconds a call waits for a decision (`None`: as long as it takes).

    Raises:
        ValueError: `require_shell_escape` without `shell_cmds`.
    """

    tool_calls: bool = True
    shell_cmds: bool = False
    require_shell_escape: bool = False
    timeout: float | None = 60

    def __post_init__(self) -> None:
        if self.require_shell_escape and not self.shell_cmds:
            raise ValueError(
                "require_shell_escape=True requires approve_shell_cmds=True (it makes shell commands go "
                "through approval): pass approve_shell_cmds=True (ApprovalOptions(shell_cmds=True)) or drop "
                "require_shell_escape="
            )


@dataclass(frozen=True)
class EmbeddedOptions:
    """An executor with a tool server, a gateway (unless external) and kernels of its own.

    Attributes:
        log_level: Log level of what it starts (its gateway process and tool server); the `ipybox`
            logger's own level is the application's to set.

    Raises:
        ValueError: A combination that can't work (see the module), naming the settings and what to do.
    """

    kernel: KernelOptions = field(default_factory=KernelOptions)
    gateway: EmbeddedGateway | ExternalGateway = field(default_factory=EmbeddedGateway)
    tools: ToolOptions = field(default_factory=ToolOptions)
    approval: ApprovalOptions = field(default_factory=ApprovalOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    log_level: str = "WARNING"

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_level", self.log_level.upper())
        external = isinstance(self.gateway, ExternalGateway)
        if external and self.approval.shell_cmds:
            raise ValueError(
                "approve_shell_cmds=True needs ipybox's own kernels (a gateway at kernel_gateway_url starts "
                "kernels that would run shell commands unasked): drop one of the two"
            )
        if external and self.kernel.limits.any:
            raise ValueError(
                "limits= applies to kernels of the embedded gateway; a gateway at kernel_gateway_url starts "
                "kernels its own way (set limits there): drop one of the two"
            )
        if self.kernel.sandbox is not None and external:
            raise ValueError(
                "sandbox=True sandboxes kernels of the embedded gateway; a gateway at kernel_gateway_url "
                "runs kernels its own way: drop one of the two"
            )
        if self.kernel.sandbox is not None and self.tools.server_port is not None:
            raise ValueError(
                "sandbox=True needs the tool server on a Unix socket (a sandboxed kernel has no network): "
                "leave tool_server_port unset"
            )

    @property
    def working_dir(self) -> Path:
        """The kernels' working directory, absolute (the current directory unless `kernel` names one)."""
        return (self.kernel.working_dir or Path.cwd()).resolve()

    @property
    def mcptools_dir(self) -> Path:
        """Where the generated tool packages are (`tools.mcptools_dir`, else `mcptools` in the working dir)."""
        return self.tools.mcptools_dir or self.working_dir / "mcptools"


@dataclass(frozen=True)
class WorkspaceOptions:
    """A lease on the workspace `ipybox up` runs in `workspace`: its kernels, sandbox, environment, MCP
    servers and approval rules.

    Attributes:
        workspace: The workspace directory (made absolute).
        output: As for an embedded executor; unset byte limits are the workspace's `[kernel]` settings.
        kernel_init_timeout: Seconds a new kernel gets to become ready (`None`: no limit).
        execute_accepts_asks: `execute()` accepts every call a rule answers with `ask` (off: it answers
            none; they go to the workspace's people, or are denied).
        answers: What this application does with the `ask`s of its kernel (`stream()` decides them):
            `application`; `elicitation` or `none` for an MCP server's sessions, by what their client can do.
        log_level: Accepted as for an embedded executor; the workspace's processes log as `ipybox up` says.
        client: The name people asked about this application's calls see (web console, `ipybox
            approve`); default: `<program> (pid N)`.
    """

    workspace: Path
    output: OutputOptions = field(default_factory=OutputOptions)
    kernel_init_timeout: float | None = 60
    execute_accepts_asks: bool = False
    answers: Answers = "application"
    log_level: str = "WARNING"
    client: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "workspace", Path(self.workspace).resolve())
        object.__setattr__(self, "log_level", self.log_level.upper())
