"""`ControlClient`: talks to a running workspace's control endpoint (for the CLI and attached
applications)."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp

from ipybox.running.state import NotRunningError, SupervisorState, read_state


class ControlClient:
    """A connection to the control endpoint of the workspace's supervisor.

    Args:
        state: The supervisor's state (`read_state(workspace)`).

    Example:
        ```python
        async with ControlClient(read_state(Path("example-workspace"))) as control:
            print((await control.status())["pool"])
        ```
    """

    def __init__(self, state: SupervisorState) -> None:
        self.state = state
        self._http: aiohttp.ClientSession | None = None

    @classmethod
    def of(cls, workspace: Path) -> ControlClient:
        """Raises:
        NotRunningError: No supervisor runs for `workspace`."""
        return cls(read_state(workspace))

    async def __aenter__(self) -> Self:
        self._http = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.state.control_socket),
            headers={"Authorization": f"Bearer {self.state.control_token}"},
            timeout=aiohttp.ClientTimeout(total=120),
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def status(self) -> dict[str, Any]:
        return await self._call("GET", "/status")

    async def shutdown(self) -> None:
        await self._call("POST", "/shutdown")

    async def new_lease(self) -> str:
        lease: str = (await self._call("POST", "/leases"))["lease"]
        return lease

    async def lease_kernel(self, lease: str) -> str:
        kernel_id: str = (await self._call("POST", f"/leases/{lease}/kernels"))["kernel_id"]
        return kernel_id

    async def release(self, lease: str) -> None:
        await self._call("DELETE", f"/leases/{lease}")

    async def _call(self, method: str, path: str) -> dict[str, Any]:
        if self._http is None:
            raise RuntimeError("use 'async with ControlClient(...)'")
        try:
            async with self._http.request(method, f"http://localhost{path}") as response:
                body: dict[str, Any] = await response.json()
        except aiohttp.ClientConnectionError as e:
            raise NotRunningError(f"cannot reach ipybox in {self.state.workspace}: {e}") from None
        if response.status != 200:
            raise RuntimeError(f"ipybox in {self.state.workspace}: {body.get('error', response.status)}")
        return body
