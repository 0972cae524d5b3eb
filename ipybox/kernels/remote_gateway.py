"""`RemoteGateway`: a gateway someone else runs (Jupyter Enterprise Gateway), given by URL, in the place a
workspace's own `KernelGateway` process takes.

There is nothing to start or stop: `start()` checks that the gateway answers with the token and offers the
kernel spec (one clear `GatewayStartError` otherwise, before any kernel is asked for), and `check()` says
whether it still answers, which the workspace's watcher asks every few seconds (a gateway that stops
answering and comes back has lost its kernels: the pool is refilled, leases get new kernels).

Attributes mirror `KernelGateway` where the supervisor reads them (`endpoint`, `running`, `pid`, `log_path`,
`token`), so status and state files treat both alike; `pid` and `log_path` are `None` (not this machine's).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ipybox.kernels.gateway import GatewayEndpoint, GatewayStartError

logger = logging.getLogger(__name__)

CHECK_TIMEOUT = 5.0
"""Seconds one check (`GET /api/kernelspecs`) may take before the gateway counts as not answering."""


class RemoteGateway:
    """A remote gateway at `endpoint` whose kernels start from `kernel_name` (`None`: the gateway's default;
    see the module docstring). `token_setting` and `kernelspec_setting` name, in its errors, where the
    caller configured them (`[kernel.gateway] token`, or `kernel_gateway_token` for a `CodeExecutor`)."""

    pid: int | None = None
    log_path = None
    unix_socket = None
    runtime_dir = None

    def __init__(
        self,
        endpoint: GatewayEndpoint,
        kernel_name: str | None,
        *,
        token_setting: str = "[kernel.gateway] token",
        kernelspec_setting: str = "[kernel.gateway] kernelspec",
    ) -> None:
        self.endpoint = endpoint
        self.kernel_name = kernel_name
        self.token_setting = token_setting
        self.kernelspec_setting = kernelspec_setting
        self.running = False

    @property
    def token(self) -> str:
        return self.endpoint.token

    @property
    def url(self) -> str:
        return self.endpoint.url

    async def start(self) -> None:
        """Check the gateway (see `check`).

        Raises:
            GatewayStartError: It does not answer, refuses the token, or has no such kernel spec.
        """
        problem = await self.check()
        if problem is not None:
            raise GatewayStartError(problem)

    async def check(self) -> str | None:
        """`None` when the gateway answers and offers the kernel spec, else what is wrong, in one line
        (also kept in `running`)."""
        problem = await self._problem()
        self.running = problem is None
        return problem

    async def _problem(self) -> str | None:
        import aiohttp

        url = f"{self.endpoint.url}/api/kernelspecs"
        try:
            async with (
                self.endpoint.session(timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT)) as http,
                http.get(url) as response,
            ):
                if response.status in (401, 403):
                    return (
                        f"the gateway at {self.endpoint.url} refused the token (HTTP {response.status}): "
                        f"check {self.token_setting}"
                    )
                if response.status != 200:
                    return f"the gateway at {self.endpoint.url} answered HTTP {response.status} to {url}"
                body: Any = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            reason = str(e) or type(e).__name__
            return f"the gateway at {self.endpoint.url} does not answer ({reason})"
        specs = body.get("kernelspecs") if isinstance(body, dict) else None
        if not isinstance(specs, dict):
            return f"the gateway at {self.endpoint.url} did not list kernel specs: is it a Jupyter gateway?"
        # No name: the gateway's default, which must be one it offers.
        name = self.kernel_name if self.kernel_name is not None else body.get("default")
        if name not in specs:
            offered = ", ".join(sorted(specs)) or "none"
            which = f"kernel spec {name!r}" if self.kernel_name is not None else "default kernel spec"
            return (
                f"the gateway at {self.endpoint.url} has no {which} (it offers: {offered}): set "
                f"{self.kernelspec_setting}"
            )
        return None

    async def stop(self) -> None:
        """Nothing of the gateway is this machine's to stop (its kernels are deleted by the pool)."""
        self.running = False

    async def wait_until_answering(self, interval: float = 2.0) -> None:
        """Return once `check()` passes (the watcher's wait after the gateway stopped answering)."""
        while True:
            if await self.check() is None:
                return
            await asyncio.sleep(interval)
