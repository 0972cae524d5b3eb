"""`workspace_status`: what a running workspace reports (`WorkspaceStatus`, for `ipybox status`, the
control endpoint and the web console), assembled from its services; `applied_outcome`, a server's
outcome once the current `ipybox.toml` was applied; `with_servers`, the configuration in effect.

Contract: pure reads of memory, plus two cheap reads of the workspace: the place of each server's table in
`ipybox.toml` (`ConfigPositions`, read again only when the file's size or mtime changed) and the saved code
actions' manifests (never their code: it is agent-written). Nothing here raises for what it reads: an
unreadable file leaves the places out, a broken `gentools/` the actions (logged).

The reconciler's status comes typed from the reconciler (`ReconcilerStatus`, `ipybox.reconcile.status`);
this adds what only the supervisor knows: each server's place in `ipybox.toml` and why it stopped. Where
the status sits among the services: `docs/design.md`, "Services".
"""

from __future__ import annotations

import contextlib
import logging
import os
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ipybox.approval.asks import AskBoard
from ipybox.codeact.actions import read_actions
from ipybox.codeact.analysis import analyse_action
from ipybox.codeact.layout import action_tool_name, gentools_dir
from ipybox.config import CONFIG_FILE, WorkspaceConfig
from ipybox.config.loading import MAX_NESTING
from ipybox.config.positions import KeyPath, Position, key_positions, too_deep
from ipybox.executor.remote_kernels import remote_limits_env
from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.remote_gateway import RemoteGateway
from ipybox.progress import Progress, ProgressEvent, ProgressHub, server_part
from ipybox.reconcile.pins import ToolPins
from ipybox.reconcile.reconciler import Reconciler
from ipybox.running.status import (
    ActionStatus,
    GatewayStatus,
    PolicyStatus,
    PoolStatus,
    ReconcilerStatus,
    ServerOutcome,
    ToolServerStatus,
    WorkspaceStatus,
)
from ipybox.supervisor.kernels import KernelsService
from ipybox.supervisor.leases import LeaseTable
from ipybox.supervisor.outcome import server_outcome
from ipybox.supervisor.tools import ToolsService

logger = logging.getLogger("ipybox.supervisor")


@dataclass(frozen=True)
class StatusSources:
    """What a workspace's status is read from."""

    workspace: Path
    started_at: datetime
    config: WorkspaceConfig
    state_dir: Path
    leases: LeaseTable
    board: AskBoard
    kernels: KernelsService | None
    tools: ToolsService | None
    reconciler: Reconciler | None
    mcp: str | None
    console: str | None
    pins: ToolPins | None = None


def workspace_status(sources: StatusSources, positions: ConfigPositions) -> WorkspaceStatus:
    s, kernels, tools, reconciler = sources, sources.kernels, sources.tools, sources.reconciler
    gateway = kernels.gateway if kernels is not None else None
    pool = kernels.pool if kernels is not None else None
    reconciled = reconciler_status(reconciler)
    if tools is not None and tools.server is not None:
        reconciled = with_stops(reconciled, tools)
    return WorkspaceStatus(
        workspace=str(s.workspace),
        pid=os.getpid(),
        started_at=s.started_at.isoformat(),
        uptime_s=round((datetime.now(UTC) - s.started_at).total_seconds(), 1),
        sandbox=s.config.sandbox.enabled and s.config.kernel.gateway is None,
        gateway=gateway_status(s.config, gateway, kernels),
        tool_server=ToolServerStatus(running=tools is not None and tools.server is not None),
        pool=PoolStatus(
            size=s.config.kernel.warm_pool,
            idle=pool.idle if pool is not None else 0,
            leased=s.leases.leased_kernels,
        ),
        leases=len(s.leases),
        kernel_generation=kernels.generation if kernels is not None else 0,
        restarts={
            "gateway": kernels.restarts if kernels is not None else 0,
            "tool_server": tools.restarts if tools is not None else 0,
        },
        config_error=str(reconciler.error) if reconciler is not None and reconciler.error else None,
        reconciler=positions.locate(reconciled),
        state_dir=str(s.state_dir),
        mcp=s.mcp,
        console=s.console,
        pending_asks=len(s.board.pending),
        actions=action_statuses(reconciler),
        policy=policy_status(reconciler.config if reconciler and reconciler.config else s.config, s.pins),
    )


def policy_status(config: WorkspaceConfig, pins: ToolPins | None) -> PolicyStatus:
    """The admin tiers, the pins' differences and the lint mode of the policy in effect."""
    policy = config.approval
    tiers = [
        f"{tier.name}: {tier.source} ({len(tier.rules)} rule{'s' * (len(tier.rules) != 1)})"
        for tier in policy.admin
    ]
    warnings = []
    if any(tier.name == "user" for tier in policy.admin) and not config.sandbox.enabled:
        warnings.append(
            "the user admin policy is only as strong as the kernels' sandbox, which is off: unsandboxed kernels "
            "run as you and can edit it (use the system tier, /etc/ipybox/policy.toml)"
        )
    return PolicyStatus(
        tiers=tiers,
        lint=policy.lint,
        pins=pins.lines() if pins is not None else {},
        changed_tools=policy.changed_tools,
        pins_error=pins.error if pins is not None else None,
        warnings=warnings,
    )


def with_servers(config: WorkspaceConfig, reconciler: Reconciler | None) -> WorkspaceConfig:
    """`config` (whose kernel settings the kernels run with) with the servers the reconciler last applied,
    which may be newer: it starts servers before it replaces kernels for the same edit."""
    applied = reconciler.config if reconciler is not None else None
    if applied is None or applied.servers == config.servers:
        return config
    return config.model_copy(update={"servers": applied.servers})


def reconciler_status(reconciler: Reconciler | None) -> ReconcilerStatus:
    """The reconciler's status (empty before it exists)."""
    return reconciler.status() if reconciler is not None else ReconcilerStatus()


def with_stops(status: ReconcilerStatus, tools: ToolsService) -> ReconcilerStatus:
    """`status` with why each server that ended by itself is not running (e.g. its memory limit)."""
    if tools.server is None or not status.servers:
        return status
    stopped = {name: tools.server.servers.stopped(name) for name in status.servers}
    servers = {
        name: server.model_copy(update={"stopped": stopped[name]}) if stopped[name] else server
        for name, server in status.servers.items()
    }
    return status.model_copy(update={"servers": servers})


class ConfigPositions:
    """Where each server's table is in `ipybox.toml`, read again when the file changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cached: tuple[tuple[int, int], dict[KeyPath, Position]] | None = None

    def locate(self, status: ReconcilerStatus) -> ReconcilerStatus:
        """`status` with each server's place in `ipybox.toml` (`ipybox.toml:LINE:COL` of its table)."""
        if not status.servers:
            return status
        try:
            info = self.path.stat()
            key = (info.st_mtime_ns, info.st_size)
            if self._cached is None or self._cached[0] != key:
                source = self.path.read_text(encoding="utf-8")
                # Positions of a file TOML accepts only: the scanner recurses on what it cannot read.
                loads = too_deep(source, MAX_NESTING) is None and _parses(source)
                self._cached = (key, key_positions(source) if loads else {})
            positions = self._cached[1]
        except (OSError, UnicodeDecodeError):
            return status
        servers = {}
        for name, server in status.servers.items():
            where = positions.get(("servers", name))
            location = f"{CONFIG_FILE}:{where[0]}:{where[1]}" if where is not None else None
            servers[name] = server.model_copy(update={"location": location})
        return status.model_copy(update={"servers": servers})


def action_statuses(reconciler: Reconciler | None) -> list[ActionStatus]:
    """The saved code actions and what each may call: manifests and `ast` only (cheap; their code is
    agent-written and never imported here)."""
    mcptools = reconciler.mcptools_dir if reconciler is not None else None
    if mcptools is None:
        return []
    gentools = gentools_dir(mcptools)
    try:
        listing = read_actions(gentools)
        statuses = [
            ActionStatus(name=f"{a.category}.{a.name}", tool=a.tool_name, calls=a.calls.summary())
            for a in listing.actions
        ]
        for category, name in listing.stale:
            calls = analyse_action(gentools, category, name).summary()
            tool = action_tool_name(category, name)
            statuses.append(ActionStatus(name=f"{category}.{name}", tool=tool, calls=calls, stale=True))
    except Exception as e:  # status reports what runs: a broken gentools/ is logged, never fatal
        logger.warning("saved code actions could not be listed: %s", e)
        return []
    return sorted(statuses, key=lambda status: status.name)


async def applied_outcome(
    reconciler: Reconciler, config_path: Path, name: str, hub: ProgressHub, progress: Progress | None = None
) -> ServerOutcome | Exception:
    """Apply `config_path` now (as the watcher would after an edit) and return server `name`'s outcome, once
    it has one, or the exception applying raised (returned, not raised: this runs in a task group that a
    failure would stop, and the caller raises it). `progress` is called with that server's events."""
    part = server_part(name)

    def of_server(event: ProgressEvent) -> None:
        if progress is not None and event.what == part:
            progress(event)

    unsubscribe = hub.subscribe(of_server)
    try:
        # A reload the watcher started meanwhile may still be starting the server: the next reload waits
        # for it (reloads take turns) and, the file being unchanged, only tries again what failed.
        for _ in range(3):
            await reconciler.reload()
            status = reconciler_status(reconciler)
            server = status.servers.get(name)
            if reconciler.error is not None or server is None or server.state != "starting":
                break
        return server_outcome(name, status, reconciler.error, _source_of(config_path))
    except Exception as e:
        logger.warning("applying server %s failed: %s", name, e)
        return e
    finally:
        unsubscribe()


def _source_of(path: Path) -> str | None:
    """The file's text (small, local: read in the loop, as the reconciler just did); `None` if unreadable."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return path.read_text(encoding="utf-8")
    return None


def _parses(source: str) -> bool:
    try:
        tomllib.loads(source)
    except tomllib.TOMLDecodeError:
        return False
    return True


def gateway_status(
    config: WorkspaceConfig, gateway: KernelGateway | RemoteGateway | None, kernels: KernelsService | None
) -> GatewayStatus:
    """Where the kernels run, as the status shows it: the workspace's own gateway process, or a remote
    gateway, with what isolates its kernels and which limits it was asked for (never shown as enforced:
    its kernel templates apply them, not ipybox)."""
    running = gateway is not None and gateway.running
    problem = kernels.failure_reason if kernels is not None else None
    remote = config.kernel.gateway
    if remote is None:
        return GatewayStatus(
            running=running, pid=gateway.pid if gateway is not None else None, problem=problem
        )
    requested = remote_limits_env(config.kernel.limits)
    return GatewayStatus(
        running=running,
        url=remote.url,
        kernelspec=remote.kernelspec,
        isolation="the gateway's cluster (ipybox's [sandbox] applies to kernels on this machine only)",
        requested_limits=requested,
        problem=problem,
    )
