"""The typed protocol of a running workspace's control endpoint: what `GET /status` reports, what each
control request answers, and a server's outcome after `POST /servers/{name}/apply`.

Contract:

- The supervisor builds these models; the control endpoint serves them as JSON
  (`model_dump(mode="json")`); `ControlClient` validates the JSON back into them. Nothing between the
  processes is a bare `dict`.
- `WorkspaceStatus` serializes to the JSON `ipybox status --json` has always printed (same keys, same
  nesting; keys are only ever added, like `kernels`), so scripts reading it keep working.
- `ServerOutcome` is the one answer to "what became of server X": `ready` (its package is generated, at
  `generation`), `failed` (it could not be started: `error`), `config_error` (`ipybox.toml` does not load:
  `problems` are the ones located in `[servers.X]`, or all of them when none is, with `about_server`
  saying which) or `absent` (the configuration that runs has no enabled server X).
- `POST /servers/{name}/apply` with `Accept: application/x-ndjson` streams one JSON line per
  `ipybox.progress.ProgressEvent` of that server (`kind` "progress"), then the `ServerOutcome` (`kind`
  "outcome") or, when applying failed, a `StreamFailure` (`kind` "error"); `kind` tells the lines apart.
- The reconciler's part (`ReconcilerStatus`, `MCPServerStatus`) is defined by the reconciler's layer
  (`ipybox.reconcile.status`, which `Reconciler.status()` returns) and re-exported here.
- Ids are `NewType`s of `str`: a lease, a kernel and a kernel's caller are never mixed up in a signature.
"""

from __future__ import annotations

from typing import Literal, NewType

from pydantic import BaseModel, ConfigDict, Field

from ipybox.approval.ask_context import MAX_REGISTERED_CELL

# Typed where the reconciler builds it (`Reconciler.status()`), served here: re-exported for clients.
from ipybox.reconcile.status import MCPServerStatus as MCPServerStatus
from ipybox.reconcile.status import ReconcilerStatus as ReconcilerStatus
from ipybox.reconcile.status import ServerState as ServerState

LeaseId = NewType("LeaseId", str)
"""An attached application's share of the workspace (`POST /leases`)."""
KernelId = NewType("KernelId", str)
"""A kernel of the gateway (its id there)."""
CallerId = NewType("CallerId", str)
"""Whom the tool server sees calling: one per pool kernel, named in its tool token."""
CallerToken = NewType("CallerToken", str)
"""The secret a caller's kernel authenticates its tool calls with (`IPYBOX_TOOL_TOKEN`)."""


class _Model(BaseModel):
    # Extra keys are ignored, not refused: a newer supervisor may report more than this client knows.
    model_config = ConfigDict(frozen=True, extra="ignore")


class GatewayStatus(_Model):
    """Where the kernels run: the workspace's own kernel gateway (`pid`), or a remote gateway (`url`,
    `[kernel.gateway]`).

    Attributes:
        running: Whether it runs (a remote one: answered the last check).
        pid: The local gateway's process.
        url: The remote gateway's URL; `None` for kernels on this machine.
        kernelspec: The kernel spec remote kernels start from.
        isolation: What isolates remote kernels (not ipybox's sandbox).
        requested_limits: The `KERNEL_*` limits each remote kernel's start request asks its template for.
        problem: Why it is not running or answering, while it is not.
    """

    running: bool
    pid: int | None = None
    url: str | None = None
    kernelspec: str | None = None
    isolation: str | None = None
    requested_limits: dict[str, str] = {}
    problem: str | None = None


class ToolServerStatus(_Model):
    running: bool


class PoolStatus(_Model):
    """The warm pool: `size` configured, `idle` ready to lease, `leased` held by attached applications."""

    size: int
    idle: int
    leased: int


class ActionStatus(_Model):
    """A saved code action (`gentools/<category>/<name>/`), found by parsing only.

    Attributes:
        name: `category.name`.
        tool: Its MCP tool name (`category__name`).
        calls: What it may call, one line (`ipybox.codeact.analysis.ActionCalls.summary`).
        stale: Its `api.py` changed after it was saved: its manifest is described again when it is next
            listed as an MCP tool.
    """

    name: str
    tool: str
    calls: str
    stale: bool = False


class KernelUsage(_Model):
    """What one kernel, with everything it started, uses (`ipybox.limits.Usage`, as the gateway reports
    it: from the kernel's control group, or from `/proc` without one). `None`: not known here.

    Attributes:
        memory: Bytes in use now (its RSS; a control group also counts its page cache and `/tmp`).
        memory_peak: The most it has used.
        cpu_seconds: CPU time used.
        processes: Processes and threads now.
        oom_kills: Processes the out-of-memory killer ended for going over its memory limit.
    """

    memory: int | None = None
    memory_peak: int | None = None
    cpu_seconds: float | None = None
    processes: int | None = None
    oom_kills: int = 0


KernelRole = Literal["leased", "pool", "other"]
"""`leased`: held by an attached application; `pool`: ready in the warm pool; `other`: neither (being
started for the pool, or deleted)."""


class KernelStatus(_Model):
    """One kernel of the workspace's gateway, as the gateway reported it.

    Attributes:
        kernel_id: Its id on the gateway.
        role: See `KernelRole`.
        lease: The lease holding it (`leased`).
        execution_state: The gateway's word for it: `idle`, `busy`, `starting`, ...
        last_activity: When it last sent a message (ISO 8601, UTC).
        idle_s: Seconds since its last activity or since it was leased, whichever came later; `None`
            while it is not `idle`.
        usage: What it uses; `None` when the gateway did not say.
    """

    kernel_id: KernelId
    role: KernelRole
    lease: LeaseId | None = None
    execution_state: str | None = None
    last_activity: str | None = None
    idle_s: float | None = None
    usage: KernelUsage | None = None


class KernelsStatus(_Model):
    """Every kernel's usage against the workspace's limits, asked of the gateway for this status (one
    `GET /api/kernels`, with a short timeout: a gateway that does not answer leaves `kernels` empty).

    Attributes:
        reported: Whether the gateway answered.
        error: Why it did not.
        mechanism: How the limits are enforced (`cgroup2`, `cgroup1`, `rlimit`; `None`: no limits, or
            no kernel to ask).
        limits: Each kernel's limits by name (`memory` in bytes, `cpus`, `processes`, ...).
        max_idle: `[kernel] max_idle` in effect: a leased kernel idle longer (seconds) is deleted.
        recycle_rss: `[kernel] recycle_rss` in effect: an idle leased kernel using more (bytes) is deleted.
        reaped: Leased kernels deleted for `max_idle` since the workspace started.
        recycled: Leased kernels deleted for `recycle_rss` since the workspace started.
        kernels: Leased kernels first, then the warm pool's, then others.
    """

    reported: bool
    error: str | None = None
    mechanism: str | None = None
    limits: dict[str, int | float] = {}
    max_idle: float | None = None
    recycle_rss: int | None = None
    reaped: int = 0
    recycled: int = 0
    kernels: list[KernelStatus] = []


class PolicyStatus(_Model):
    """What decides tool calls besides the workspace's rules, and what does not fit.

    Attributes:
        tiers: The admin tiers in effect, strongest first: `system: /etc/ipybox/policy.toml (2 rules)`.
        lint: `[approval] lint` (`warn` or `error`); the findings are the reconciler's `lint`.
        pins: Each server whose tools differ from their pins in `ipybox.lock`, with the differences
            readably (`tool 'weather' changed: readOnlyHint: true -> false; description changed`, and the
            description's diff indented); its changed and new tools are decided `changed_tools`.
        changed_tools: `[approval] changed_tools`: `ask` or `deny`.
        pins_error: Why `ipybox.lock` can't be read, when it can't (every tool counts as changed).
        warnings: What weakens the policy (the user tier with kernels unsandboxed), one line each.
    """

    tiers: list[str] = []
    lint: Literal["warn", "error"] = "warn"
    pins: dict[str, list[str]] = {}
    changed_tools: Literal["ask", "deny"] = "ask"
    pins_error: str | None = None
    warnings: list[str] = []


class WorkspaceStatus(_Model):
    """`GET /status`: what runs in the workspace.

    Attributes:
        config_error: Why the last edit of `ipybox.toml` does not load (`file:line:column: reason` lines);
            the last good configuration keeps running.
        restarts: How often the supervisor restarted `gateway` and `tool_server` after they died.
        mcp: The streamable HTTP MCP endpoint, when it is served.
        console: The web console's address (without a login token), when it is served.
        pending_asks: `ask`s waiting for an answer now.
        actions: The saved code actions, with what each may call.
        kernels: Each kernel's RSS, CPU time and processes, and the limits (`GET /status` asks the
            gateway; `None` in a status built without asking it).
        policy: The admin tiers, tool pins and lint mode (`PolicyStatus`).
    """

    workspace: str
    pid: int
    started_at: str
    uptime_s: float
    sandbox: bool
    gateway: GatewayStatus
    tool_server: ToolServerStatus
    pool: PoolStatus
    leases: int
    kernel_generation: int
    restarts: dict[str, int]
    config_error: str | None = None
    reconciler: ReconcilerStatus = ReconcilerStatus()
    state_dir: str
    mcp: str | None = None
    console: str | None = None
    pending_asks: int = 0
    actions: list[ActionStatus] = []
    kernels: KernelsStatus | None = None
    policy: PolicyStatus = PolicyStatus()


class Problem(_Model):
    """One problem of an `ipybox.toml` that does not load (a `ConfigProblem` on the wire)."""

    source: str
    line: int | None = None
    column: int | None = None
    reason: str

    def __str__(self) -> str:
        if self.line is None:
            return f"{self.source}: {self.reason}"
        return f"{self.source}:{self.line}:{self.column or 1}: {self.reason}"


OutcomeState = Literal["ready", "failed", "config_error", "absent"]


class ServerOutcome(_Model):
    """What became of one MCP server once the supervisor applied the current `ipybox.toml`.

    Attributes:
        name: The server.
        state: `ready`, `failed`, `config_error` or `absent` (see the module docstring).
        generation: The generation its package was written at (`ready`; also `failed` when an older
            package stays).
        tools: Tools in its package.
        error: One line (or a few) saying what is wrong, for every state but `ready`.
        problems: With `config_error`: the problems in `[servers.<name>]`, or all when none is there.
        about_server: With `config_error`: whether `problems` are located in `[servers.<name>]`.
    """

    kind: Literal["outcome"] = "outcome"  # tells it from the progress lines of a streamed apply
    name: str
    state: OutcomeState
    generation: int | None = None
    tools: int | None = None
    error: str | None = None
    problems: list[Problem] = []
    about_server: bool = False


class LeaseRequest(_Model):
    """The body of `POST /leases` (optional).

    Attributes:
        check: The lease's kernels check agent-written code (an output parser, a saved action): an
            `ask` of theirs is refused at once, and nobody is asked.
        client: The name people asked about the lease's calls see for it (an MCP client's `name version`,
            an application's name); cut to `MAX_CLIENT_NAME` characters, control characters dropped.
    """

    check: bool = False
    client: str | None = Field(default=None, max_length=1000)


class CellSubmitted(_Model):
    """The body of `POST /leases/{lease}/cells`: a cell the lease's application is about to execute, which
    the workspace then shows as verified to people asked about a call that reports its SHA-256.

    Attributes:
        code: The cell's text (at most `MAX_REGISTERED_CELL` characters).
    """

    code: str = Field(max_length=MAX_REGISTERED_CELL)


class CellRegistered(_Model):
    sha: str


class LeaseCreated(_Model):
    lease: LeaseId


class KernelLeased(_Model):
    """A kernel for a lease, which gave back the one it held (a lease holds one kernel at a time).

    Attributes:
        kernel_id: The kernel, on the workspace's gateway.
        lost: When the workspace itself took the lease's previous kernel, why, said of the kernel gateway
            ("it exited with signal 9 (SIGKILL) and ipybox restarted it"): its application's running
            cell reports this instead of a refused connection. `None` otherwise.
    """

    kernel_id: KernelId
    lost: str | None = None


class LeaseReleased(_Model):
    released: Literal[True] = True


class LockAccepted(_Model):
    """`POST /lock/accept` (optionally `?server=NAME`): the servers whose tools as served now were pinned
    in `ipybox.lock` (none when nothing differed)."""

    accepted: list[str] = []


class ShutdownAccepted(_Model):
    stopping: Literal[True] = True


class ConsoleLogin(_Model):
    """`POST /console/login`: a new one-time login link for the web console (`ipybox console`)."""

    url: str


class TokenRotated(_Model):
    """`POST /mcp/token`: the MCP endpoint's bearer token was replaced (`ipybox token rotate`). `live`: the
    endpoint serves with the new token now and refuses the old one; false when this supervisor serves no
    HTTP endpoint (the next `ipybox up` uses the new token)."""

    live: bool
    mcp_url: str | None = None


class ControlError(_Model):
    """The body of every answer that is not 200: what went wrong, in one line."""

    error: str


class StreamFailure(_Model):
    """The last line of a streamed answer (`POST /servers/{name}/apply` as NDJSON) that failed after the
    stream began: what went wrong, in one line (the status was 200 already)."""

    kind: Literal["error"] = "error"
    error: str
