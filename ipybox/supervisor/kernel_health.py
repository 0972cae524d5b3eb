"""`KernelHealth`: what each kernel of a workspace uses, for `ipybox status` and the web console, and the
reaper that deletes idle leased kernels (`[kernel] max_idle`, `[kernel] recycle_rss`).

Both read the gateway's kernel models, one `GET /api/kernels` at a time: each model carries the kernel's
`execution_state`, `last_activity` and `"ipybox"` (mechanism, limits, usage: see
`ipybox.kernels.gateway_kernels`). The gateway runs outside the kernels' limits, so it answers also when
every kernel is at its limit; it answered in 2-3 ms here with one kernel.

Contract:

- `status()` never raises and returns within `STATUS_TIMEOUT` whatever the gateway does: a gateway that is
  down, restarting or stuck gives `KernelsStatus(reported=False, error=...)`, and the rest of the status is
  answered as before.
- The reaper (`reap()`, one watcher of the supervisor) checks every `check_interval(max_idle)` seconds
  (`max_idle / 4`, at most 30 s, at least 0.25 s; 30 s without `max_idle`) and, when a leased kernel exists
  and `max_idle` or `recycle_rss` is set, asks the gateway once. It deletes a *leased* kernel whose
  `execution_state` is `idle` and that
  - has neither run anything nor been leased for longer than `max_idle`, or
  - uses more memory than `recycle_rss` (`usage.memory`) and has been idle for at least one interval
    (not merely between two cells of a busy application).
  Kernels of the warm pool are never reaped: they are the spares.
- Never a running cell: a kernel that is not `idle` is skipped, and its model is asked for once more just
  before it is deleted: if it ran anything since (`last_activity` moved) or runs now, it stays. What can
  remain is an execute request sent in the few milliseconds between that look and the deletion: its cell
  then fails as a kernel that died does, and the notice below says why.
- A reaped kernel is taken from its lease (`Supervisor.reclaim_kernel`: the lease stays, the kernel's tool
  token is revoked, the kernel deleted). The lease's next kernel comes with the reason
  (`KernelLeased.lost`), which the application's next execution shows in a notice before its output
  (`ipybox.running.leased_client`).
- The settings are read from the configuration in effect (the reconciler's): editing `max_idle` or
  `recycle_rss` in `ipybox.toml` applies within a second (`SETTINGS_POLL`), without a restart or a
  recycle. When neither is set the reaper only sleeps (no request). Nothing it meets stops the workspace:
  a failed check is logged and the next one runs on time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError

from ipybox.config.sections import KernelSection
from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.pool import KernelPool
from ipybox.kernels.remote_gateway import RemoteGateway
from ipybox.limits import format_bytes
from ipybox.running.status import KernelId, KernelsStatus, KernelStatus, KernelUsage, LeaseId
from ipybox.supervisor.leases import LeaseTable

logger = logging.getLogger("ipybox.supervisor")

STATUS_TIMEOUT = 2.0
"""Seconds `status()` waits for the gateway: `ipybox status` must answer also when the gateway does not."""

MAX_INTERVAL = 30.0
"""The longest the reaper sleeps between checks: how late a `max_idle` of an hour may act, at most."""

MIN_INTERVAL = 0.25
"""The shortest: a check costs a request (2-3 ms of the gateway's time), so even `max_idle = 1` keeps the
CPU nearly idle."""

SETTINGS_POLL = 1.0
"""While sleeping, the reaper looks at the settings this often (no request: a look at the configuration in
memory), so a `max_idle` set or shortened in `ipybox.toml` takes effect within a second, not 30."""


def check_interval(max_idle: float | None) -> float:
    """Seconds between two checks of the reaper: a quarter of `max_idle`, within the bounds above (a kernel
    is then deleted at most a quarter late)."""
    if max_idle is None:
        return MAX_INTERVAL
    return max(MIN_INTERVAL, min(max_idle / 4, MAX_INTERVAL))


class HealthTarget(Protocol):
    """What `KernelHealth` reads and asks of the supervisor."""

    @property
    def gateway(self) -> KernelGateway | RemoteGateway | None:
        """The gateway the kernels are on (`None` while there is none)."""
        ...

    pool: KernelPool | None
    leases: LeaseTable

    def kernel_settings(self) -> KernelSection:
        """`[kernel]` of the configuration in effect now."""
        ...

    async def reclaim_kernel(self, lease: LeaseId, kernel: KernelId, why: str) -> bool:
        """Take `kernel` from `lease` and delete it; the lease's next kernel comes with `why`. `False` when
        the lease no longer holds it."""
        ...


class _Report(BaseModel):
    model_config = ConfigDict(extra="ignore")

    mechanism: str | None = None
    limits: dict[str, int | float] = {}
    usage: KernelUsage | None = None


class _GatewayKernel(BaseModel):
    """A kernel model as the gateway serves it (what is read of it)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    execution_state: str | None = None
    last_activity: datetime | None = None
    ipybox: _Report | None = None


class KernelHealth:
    """Each kernel's usage for the status, and the reaper; see the module docstring.

    Args:
        target: The supervisor.
    """

    def __init__(self, target: HealthTarget) -> None:
        self.target = target
        self.reaped = 0
        self.recycled = 0
        self._leased_at: dict[KernelId, datetime] = {}

    def leased(self, kernel: KernelId) -> None:
        """`kernel` was just leased: its idle time counts from now (a pool kernel may have waited long)."""
        self._forget_leased_at(self._leased_kernels())  # kernels given back or deleted since
        self._leased_at[kernel] = datetime.now(UTC)

    # -- status

    async def status(self) -> KernelsStatus:
        """Every kernel of the gateway with its usage, and the limits. Never raises."""
        settings = self.target.kernel_settings()
        common: dict[str, Any] = {
            "max_idle": settings.max_idle,
            "recycle_rss": settings.recycle_rss,
            "reaped": self.reaped,
            "recycled": self.recycled,
        }
        models = await self._models()
        if isinstance(models, str):
            return KernelsStatus(reported=False, error=models, **common)
        leased = self._leased_kernels()
        pool = self.target.pool
        in_pool = set(pool.idle_kernels) if pool is not None else set()
        now = datetime.now(UTC)
        kernels = [
            self._kernel_status(model, leased.get(KernelId(model.id)), model.id in in_pool, now)
            for model in models
        ]
        order = {"leased": 0, "pool": 1, "other": 2}
        kernels.sort(key=lambda kernel: (order[kernel.role], kernel.lease or "", kernel.kernel_id))
        report = next((model.ipybox for model in models if model.ipybox is not None), None)
        return KernelsStatus(
            reported=True,
            mechanism=report.mechanism if report is not None else None,
            limits=report.limits if report is not None else {},
            kernels=kernels,
            **common,
        )

    def _kernel_status(
        self, model: _GatewayKernel, lease: LeaseId | None, in_pool: bool, now: datetime
    ) -> KernelStatus:
        idle = self._idle_seconds(model, now)
        return KernelStatus(
            kernel_id=KernelId(model.id),
            role="leased" if lease is not None else "pool" if in_pool else "other",
            lease=lease,
            execution_state=model.execution_state,
            last_activity=model.last_activity.isoformat() if model.last_activity is not None else None,
            idle_s=round(idle, 1) if idle is not None else None,
            usage=model.ipybox.usage if model.ipybox is not None else None,
        )

    # -- the reaper

    async def reap(self) -> None:
        """Check the leased kernels until cancelled (see the module docstring). Never raises."""
        while True:
            await self._sleep()
            settings = self.target.kernel_settings()
            if settings.max_idle is None and settings.recycle_rss is None:
                continue
            try:
                await self.check(settings)
            except Exception:  # the next check runs anyway; the workspace keeps running
                logger.exception("checking the kernels for idle ones failed")

    async def _sleep(self) -> None:
        """One check interval, cut short when the settings' interval shrinks meanwhile."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            left = started + check_interval(self.target.kernel_settings().max_idle) - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(left, SETTINGS_POLL))

    async def check(self, settings: KernelSection) -> list[tuple[KernelId, str]]:
        """One check: delete the leased kernels `settings` say are done. Returns each deleted kernel with
        the reason its lease is given."""
        leased = self._leased_kernels()
        self._forget_leased_at(leased)
        if not leased:
            return []
        models = await self._models()
        if isinstance(models, str):
            logger.debug("not checking for idle kernels: %s", models)
            return []
        interval = check_interval(settings.max_idle)
        deleted = []
        for model in models:
            lease = leased.get(KernelId(model.id))
            if lease is None:
                continue
            why, recycle = self._verdict(model, settings, interval)
            if why is None or not await self._still_idle(model):
                continue
            if await self.target.reclaim_kernel(lease, KernelId(model.id), why):
                logger.warning("deleted kernel %s of lease %s: %s", model.id, lease, why)
                if recycle:
                    self.recycled += 1
                else:
                    self.reaped += 1
                self._leased_at.pop(KernelId(model.id), None)
                deleted.append((KernelId(model.id), why))
        return deleted

    def _verdict(
        self, model: _GatewayKernel, settings: KernelSection, interval: float
    ) -> tuple[str | None, bool]:
        """Why `model`'s kernel is to be deleted (`None`: it stays), and whether for its memory."""
        idle = self._idle_seconds(model, datetime.now(UTC))
        if idle is None:
            return None, False
        usage = model.ipybox.usage if model.ipybox is not None else None
        memory = usage.memory if usage is not None else None
        # Memory first: when both apply, the reason names the size, which says more than the idle time.
        rss = settings.recycle_rss
        if rss is not None and memory is not None and memory > rss and idle >= interval:
            return (
                f"it was idle and used {format_bytes(memory)} of memory, more than [kernel] recycle_rss "
                f"({format_bytes(rss)}), so ipybox recycled it"
            ), True
        if settings.max_idle is not None and idle > settings.max_idle:
            return (
                f"it was idle for {_duration(idle)}, longer than [kernel] max_idle ({_duration(settings.max_idle)}), "
                "so ipybox deleted it to free its memory"
            ), False
        return None, False

    async def _still_idle(self, model: _GatewayKernel) -> bool:
        """Whether the kernel, asked again now, is idle and has run nothing since `model` was read."""
        models = await self._models(model.id)
        if isinstance(models, str) or len(models) != 1:
            return False
        return models[0].execution_state == "idle" and models[0].last_activity == model.last_activity

    # -- shared

    def _idle_seconds(self, model: _GatewayKernel, now: datetime) -> float | None:
        """Seconds since the kernel's last activity or its lease, whichever is later; `None` unless idle."""
        if model.execution_state != "idle" or model.last_activity is None:
            return None
        since = model.last_activity
        leased_at = self._leased_at.get(KernelId(model.id))
        if leased_at is not None and leased_at > since:
            since = leased_at
        return max(0.0, (now - since).total_seconds())

    def _leased_kernels(self) -> dict[KernelId, LeaseId]:
        leases = self.target.leases
        return {kernel: lease for lease in leases.leases for kernel in leases.kernels(lease)}

    def _forget_leased_at(self, leased: Iterable[KernelId]) -> None:
        keep = set(leased)
        for kernel in [k for k in self._leased_at if k not in keep]:
            del self._leased_at[kernel]

    async def _models(self, kernel_id: str | None = None) -> list[_GatewayKernel] | str:
        """The gateway's kernel models (all, or the one of `kernel_id`), asked with `STATUS_TIMEOUT`; or
        why there are none: the gateway is not running, refused, or did not answer in time."""
        gateway = self.target.gateway
        if gateway is None or not gateway.running:
            return "the kernel gateway is not running"
        endpoint = gateway.endpoint
        path = "/api/kernels" + (f"/{kernel_id}" if kernel_id is not None else "")
        started = time.monotonic()
        try:
            async with (
                endpoint.session(timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT)) as http,
                http.get(f"{endpoint.url}{path}") as response,
            ):
                if response.status != 200:
                    return f"the kernel gateway answered {response.status} to GET {path}"
                data = await response.json(content_type=None)
        except TimeoutError:
            return f"the kernel gateway did not answer within {STATUS_TIMEOUT:g} s"
        except (aiohttp.ClientError, OSError, ValueError) as e:
            return f"the kernel gateway did not answer: {e or type(e).__name__}"
        logger.debug("GET %s took %.1f ms", path, (time.monotonic() - started) * 1000)
        return _parse_models(data if kernel_id is None else [data])


def _parse_models(data: Any) -> list[_GatewayKernel]:
    """The kernel models in `data` that can be read (one broken model does not hide the others)."""
    if not isinstance(data, list):
        return []
    models = []
    for item in data:
        try:
            models.append(_GatewayKernel.model_validate(item))
        except ValidationError as e:
            logger.debug("a kernel model of the gateway could not be read: %s", e)
    return models


def _duration(seconds: float) -> str:
    """`1.5 s`, `42 s`, `31 min`, `2 h 5 min`: how long a kernel was idle, or `max_idle`."""
    if seconds < 10:
        return f"{round(seconds, 1):g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min" if minutes % 60 else f"{minutes // 60} h"
