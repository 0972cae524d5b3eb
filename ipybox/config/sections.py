"""The simple tables of `ipybox.toml`: `[workspace]`, `[kernel]`, `[sandbox]` and `[endpoints]`.

```toml
[workspace]
name = "demo"                 # default: the workspace directory's name
mcptools_dir = "mcptools"     # generated tool packages, relative to the workspace

[kernel]
env = { API_BASE = "http://localhost:8000", TOKEN = "${API_TOKEN}" }
warm_pool = 1
timeout = 120
approve_shell = true          # `!cmd` and `%%bash` are decided by [approval] rules (server "shell")
max_idle = 1800               # seconds: a leased kernel idle longer is deleted (default: never)
recycle_rss = "2GiB"          # an idle leased kernel using more memory is deleted (default: never)
max_output_file_bytes = "256MiB"  # a cell's complete output saved to a file, and its images together
max_image_bytes = "32MiB"     # the largest image saved (displayed, or returned by a tool)
[kernel.limits]               # per kernel; these are the defaults ("unlimited" lifts one)
memory = "4GiB"
processes = 256
open_files = 4096
tmp = "1GiB"                  # sandboxed kernels' private /tmp
[kernel.gateway]              # kernels from a Jupyter Enterprise Gateway elsewhere (default: local)
url = "https://eg.example.com:8888"
token = "${EG_TOKEN}"
kernelspec = "python3"

[sandbox]
enabled = true
[sandbox.filesystem]
denyRead = ["~/.config/secrets"]
[sandbox.network]
allowedDomains = []

[endpoints]
mcp = true
host = "127.0.0.1"
port = 0
[endpoints.calls]             # with [kernel.gateway]: where remote kernels send tool calls (TLS)
bind = "0.0.0.0:7450"
advertise = "ipybox-tools.ipybox.svc:7450"
```
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ByteSize, ConfigDict, Field, TypeAdapter, ValidationInfo, field_validator

from ipybox.config.addresses import is_wildcard, split_host_port
from ipybox.limits import WorkspaceLimits
from ipybox.mcp_client.params import ServerSandbox
from ipybox.safefs import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_OUTPUT_FILE_BYTES

LOOPBACK_HOSTS = ("127.0.0.1", "::1")


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class WorkspaceSection(_Table):
    """`[workspace]`: the workspace's name and where its files go. Relative paths are relative to the
    directory of `ipybox.toml`.

    Attributes:
        name: Name of the workspace, shown to agents and in logs (default: the directory's name; see
            `WorkspaceConfig.name`).
        mcptools_dir: Where the generated Python tool packages are written, one per server.
        images_dir: Where images displayed by code (plots) are saved.
        state_dir: ipybox's own files for this workspace (runtime state, tokens, logs), which sandboxed
            kernels can't write.
    """

    name: str | None = Field(default=None, min_length=1)
    mcptools_dir: str = Field(default="mcptools", min_length=1)
    images_dir: str = Field(default="images", min_length=1)
    state_dir: str = Field(default=".ipybox", min_length=1)


class GatewaySection(_Table):
    """`[kernel.gateway]`: the workspace's kernels (and its warm pool) come from a Jupyter Enterprise Gateway
    (or any gateway with the kernel gateway's REST and websocket API) instead of a local one. The tool
    server, approvals, the reconciler, the console and the MCP endpoints stay on this machine; kernels reach
    them over `[endpoints.calls]` (TLS). `[sandbox]` and most of `[kernel.limits]` apply to local kernels
    only: a remote kernel is isolated by its cluster (see `docs/scale-out.md`).

    Attributes:
        url: The gateway's base URL, `http://` or `https://`.
        token: Its auth token (sent as `Authorization: token ...`); `${VAR}` placeholders are filled from
            the environment or `.env` when kernels start. Empty: none.
        kernelspec: The kernel spec kernels are started from; its Python must have ipybox installed (the
            in-kernel part: tool calls, generated-module imports).
        ca_file: A CA bundle (PEM) the gateway's certificate is checked against, for a private CA (relative
            to the workspace). Default: the system's.
        start_timeout: Seconds a remote kernel may take to answer after it was asked for (a pod is
            scheduled, an image pulled).
    """

    url: str
    token: str = ""
    kernelspec: str = Field(default="python3", min_length=1)
    ca_file: str | None = Field(default=None, min_length=1)
    start_timeout: float = Field(default=300, gt=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"not a gateway URL: {url!r}; write its base URL, e.g. 'https://eg.example.com:8888'"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"the gateway URL takes no query or fragment: {url!r}")
        return url.rstrip("/")


class CallsSection(_Table):
    """`[endpoints.calls]`: where kernels of a `[kernel.gateway]` send their tool calls: the call channel,
    over TLS, on TCP. Local kernels keep the workspace's Unix socket. Only used with `[kernel.gateway]`.

    Attributes:
        bind: `host:port` the channel listens on. Loopback by default; anything else is reachable from the
            network, so it is served over TLS only (there is no plain-TCP mode) and each kernel still needs
            its own token.
        advertise: `host:port` (or `host`: the bound port) remote kernels dial, when it differs from
            `bind` (inside a cluster: the Service's name); required with a wildcard `bind` (`0.0.0.0`,
            `::`). Default: `bind`'s host and its bound port.
        cert: Your certificate (PEM) for the channel, relative to the workspace; with `key`. Default: a
            self-signed certificate ipybox generates in the state directory, which kernels pin.
        key: The private key (PEM) of `cert`.
    """

    bind: str = "127.0.0.1:0"
    # Checked when left out too: a wildcard bind needs it.
    advertise: str | None = Field(default=None, validate_default=True)
    cert: str | None = Field(default=None, min_length=1)
    # Checked when left out too: a cert without its key is the mistake to report.
    key: str | None = Field(default=None, min_length=1, validate_default=True)

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        if split_host_port(value, "bind")[1] is None:
            raise ValueError(
                f"bind takes 'host:port' (port 0: a free one), e.g. '0.0.0.0:7450', not {value!r}"
            )
        return value

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            split_host_port(value, "advertise")
            return value
        bind = info.data.get("bind")
        if isinstance(bind, str) and is_wildcard(split_host_port(bind, "bind")[0]):
            raise ValueError(
                f"bind = {bind!r} listens on every interface, which is no address to dial: set advertise to "
                "the 'host:port' kernels reach it at (inside a cluster: the Service's name)"
            )
        return value

    @field_validator("key")
    @classmethod
    def _pair(cls, key: str | None, info: ValidationInfo) -> str | None:
        if (key is None) != (info.data.get("cert") is None):
            raise ValueError("cert and key go together: give both (your own certificate) or neither")
        return key


class KernelSection(_Table):
    """`[kernel]`: the IPython kernels code runs in.

    Attributes:
        env: Environment variables for kernels, which do not inherit the host's environment. Values may
            contain `${VAR}` placeholders, filled from the host's environment or the workspace's `.env`
            when a kernel starts.
        warm_pool: Started kernels kept in reserve, so a new session or a reset does not wait for a
            kernel to start (about 0.5 s); each costs an idle kernel's memory (about 50 MB). 0 disables it.
        timeout: Default time limit of one execution, in seconds.
        approve_shell: Kernels ask before shell commands run (`!cmd`, `x = !cmd`, `!!cmd`, `%%bash`,
            `%%sh` and the other script cell magics), and the `[approval]` rules decide each command the
            line runs as a call of server `shell`, tool = the program (`ipybox.rules.shell_commands`).
        require_shell_escape: With `approve_shell`: code in kernels can't start processes but through the
            `!` form and the cell magics (`subprocess`, `os.system`, ... raise). A guard against mistakes,
            not a boundary: the sandbox is.
        limits: `[kernel.limits]`: what each kernel, with everything it starts, may use (memory, cpus,
            processes, open_files, tmp; `ipybox.limits.ResourceLimits`). On by default: memory 4 GiB, 256
            processes, 4096 open files, and a 1 GiB `/tmp` for sandboxed kernels. A limit this machine
            can't enforce stops `ipybox up` with an error naming it (`ipybox doctor` tells what it offers).
        max_idle: Seconds a leased kernel may sit idle (nothing executed, nothing running) before it is
            deleted to give its memory back; the application's next execution runs on a fresh kernel and
            its output starts with a notice saying so. Default: never (`None`): an attached agent may
            come back after hours, and its kernel's state should be there; the memory limit already
            bounds what an idle kernel can hold. Applies from the next check on, without a restart.
        recycle_rss: Memory (bytes, or `"2GiB"`) past which an idle leased kernel is deleted the same
            way, for kernels that grow over days. Default: never.
        max_output_file_bytes: What the host writes for one cell: its complete output file (when the
            output is longer than what is returned), and the images it displays together; past it nothing
            more is written, and the output says so. Default 256 MiB.
        max_image_bytes: The largest image saved as a file, whether code displayed it or a tool returned
            it; a larger one is not saved, and the output says so. Default 32 MiB.
        gateway: `[kernel.gateway]`: run the kernels on a Jupyter Enterprise Gateway elsewhere
            (`GatewaySection`). Default: a kernel gateway of the workspace's own, on this machine.
    """

    env: dict[str, str] = Field(default_factory=dict)
    warm_pool: int = Field(default=1, ge=0)
    timeout: float = Field(default=120, gt=0)
    approve_shell: bool = False
    require_shell_escape: bool = False
    limits: WorkspaceLimits = Field(default_factory=WorkspaceLimits)
    max_idle: float | None = Field(default=None, gt=0)
    recycle_rss: ByteSize | None = Field(default=None, gt=0)
    max_output_file_bytes: ByteSize = Field(default=ByteSize(DEFAULT_MAX_OUTPUT_FILE_BYTES), gt=0)
    max_image_bytes: ByteSize = Field(default=ByteSize(DEFAULT_MAX_IMAGE_BYTES), gt=0)
    gateway: GatewaySection | None = None

    @field_validator("max_idle", "recycle_rss", "max_output_file_bytes", "max_image_bytes", mode="before")
    @classmethod
    def _not_a_flag(cls, value: Any, info: ValidationInfo) -> Any:
        # TOML's `true` would pass as 1 (second, byte); leaving the key out is how to have none.
        if isinstance(value, bool):
            kind = "a number of seconds" if info.field_name == "max_idle" else "a size"
            raise ValueError(
                f"{info.field_name} takes {kind}, not {str(value).lower()}; leave it out for the default"
            )
        if info.field_name != "max_idle" and isinstance(value, str):
            try:
                TypeAdapter(ByteSize).validate_python(value)
            except ValueError:
                raise ValueError(
                    f'not a size: {value!r}; write bytes, or a number with a unit like "2GiB" or "512MiB"'
                ) from None
        return value

    @field_validator("require_shell_escape")
    @classmethod
    def _escape_needs_approval(cls, value: bool, info: ValidationInfo) -> bool:
        # A field validator, not a model one: the problem is then reported at this key's line.
        if value and not info.data.get("approve_shell", False):
            raise ValueError(
                "require_shell_escape = true needs approve_shell = true: the `!` form it requires is "
                "only decided when shell commands are approved"
            )
        return value


class SandboxSection(ServerSandbox):
    """`[sandbox]`: whether kernels run sandboxed, and the policy they run under.

    The policy keys are those of `SandboxPolicy` (the sandbox-runtime format, camelCase; snake_case is
    accepted too), and extend its defaults. A stdio server's `sandbox` table has the same keys
    (`ServerSandbox`, which this extends by its documentation only).

    Attributes:
        enabled: Run kernels (and everything they start) in a sandbox. When the machine can't sandbox,
            starting fails rather than running unsandboxed.
        filesystem: Paths (absolute, `~/...` or relative to the workspace; globs allowed) to hide
            (`denyRead`), to make writable (`allowWrite`) or to keep read-only (`denyWrite`), on top of the
            defaults: everything readable except `.env` files and credential stores in the home directory,
            only the workspace and a private `/tmp` writable.
        network: Hosts kernels may reach through ipybox's filtering proxy (`allowedDomains`; none by
            default) and hosts they never may (`deniedDomains`, which wins).

    Example:
        ```python
        section = SandboxSection.model_validate({"enabled": True, "filesystem": {"denyRead": ["~/.x"]}})
        assert section.filesystem.deny_read == ["~/.x"]
        ```
    """


class EndpointsSection(_Table):
    """`[endpoints]`: where `ipybox up` serves the workspace to agents. Endpoints bind to loopback only:
    a remote agent reaches them through a tunnel or proxy of its own. The one exception is the call channel
    remote kernels dial (`[endpoints.calls]`), which may bind elsewhere because it is TLS and per-kernel
    tokens only.

    Attributes:
        mcp: Serve the workspace as an MCP server over streamable HTTP.
        host: Loopback address to listen on: `127.0.0.1` or `::1`.
        port: TCP port; 0 picks a free one at each start (reported when `ipybox up` starts). Pin it so
            that a client configured once (`ipybox connect CLIENT --http`, whose bearer token is kept
            across restarts) keeps working across `ipybox down`/`up`; each running workspace needs its own.
        unix_socket: Also listen on a Unix socket in the state directory, which only users who can open
            that directory can reach.
        console: Serve the web console (where a person answers `ask`s and watches the workspace) on
            `host`, behind a one-time login link that `ipybox up` and `ipybox console` print.
        console_port: The console's TCP port; 0 picks a free one.
        kernel_idle: Seconds an MCP client's kernel may sit unused before it goes back to the pool: a
            kernel handle of a 2026-07-28 client (then unknown: the client is told to open a new one),
            and the kernel of a handshake-era session over HTTP.
        max_kernels: How many kernel handles one MCP client may hold at once (`kernel="new"`, or a call
            without a handle over HTTP, opens one; `close_kernel` closes one).
        calls: `[endpoints.calls]`: where kernels of a `[kernel.gateway]` send tool calls (`CallsSection`).
    """

    mcp: bool = True
    host: str = Field(default=LOOPBACK_HOSTS[0], json_schema_extra={"enum": list(LOOPBACK_HOSTS)})
    port: int = Field(default=0, ge=0, le=65535)
    unix_socket: bool = False
    console: bool = True
    console_port: int = Field(default=0, ge=0, le=65535)
    kernel_idle: float = Field(default=1800, gt=0)
    max_kernels: int = Field(default=8, ge=1)
    calls: CallsSection = Field(default_factory=CallsSection)

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, host: str) -> str:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(
                f"endpoints bind to loopback only: use '127.0.0.1' or '::1', not {host!r} "
                "(reach them from elsewhere through a tunnel or proxy)"
            )
        return host
