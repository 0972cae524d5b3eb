"""`ControlClient`: talks to a running workspace's control endpoint (for the CLI and attached
applications).

Contract: every answer comes back as its model of `ipybox.running.status` (validated), never as a bare
dict; an unreachable endpoint is `NotRunningError`, an answer other than 200 a `RuntimeError` carrying the
endpoint's one-line `ControlError`.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from ipybox.errors import WorkspaceError
from ipybox.running.state import NotRunningError, SupervisorState, read_state
from ipybox.running.status import (
    ConsoleLogin,
    ControlError,
    KernelId,
    KernelLeased,
    LeaseCreated,
    LeaseId,
    LeaseReleased,
    ServerOutcome,
    ShutdownAccepted,
    WorkspaceStatus,
)

_Answer = TypeVar("_Answer", bound=BaseModel)


class ControlRequestError(WorkspaceError, RuntimeError):
    """The running workspace refused a control request (the message is its answer), or answered in a form
    this version of ipybox does not know."""


class ControlClient:
    """A connection to the control endpoint of the workspace's supervisor.

    Args:
        state: The supervisor's state (`read_state(workspace)`).

    Example:
        ```python
        async with ControlClient(read_state(Path("example-workspace"))) as control:
            print((await control.status()).pool)
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

    async def status(self) -> WorkspaceStatus:
        return await self._call("GET", "/status", WorkspaceStatus)

    async def shutdown(self) -> None:
        await self._call("POST", "/shutdown", ShutdownAccepted)

    async def new_lease(self) -> LeaseId:
        return (await self._call("POST", "/leases", LeaseCreated)).lease

    async def lease_kernel(self, lease: LeaseId) -> KernelId:
        return (await self.take_kernel(lease)).kernel_id

    async def take_kernel(self, lease: LeaseId) -> KernelLeased:
        """A kernel from the pool for `lease`, in place of the one it held, and why the workspace took
        that one if it did (`KernelLeased.lost`)."""
        return await self._call("POST", f"/leases/{lease}/kernels", KernelLeased)

    async def release(self, lease: LeaseId) -> None:
        await self._call("DELETE", f"/leases/{lease}", LeaseReleased)

    async def apply_server(self, name: str) -> ServerOutcome:
        """Have the workspace apply its current `ipybox.toml` now; returns server `name`'s outcome once it
        has one (started and generated, failed, a configuration problem, or absent)."""
        return await self._call("POST", f"/servers/{name}/apply", ServerOutcome)

    async def console_login(self) -> ConsoleLogin:
        """A new one-time login link for the workspace's web console (`ipybox console`).

        Raises:
            ControlRequestError: The console is off (`[endpoints] console = false`).
        """
        return await self._call("POST", "/console/login", ConsoleLogin)

    async def _call(self, method: str, path: str, answer: type[_Answer]) -> _Answer:
        if self._http is None:
            raise RuntimeError("use 'async with ControlClient(...)'")
        try:
            async with self._http.request(method, f"http://localhost{path}") as response:
                body = await response.read()
        except aiohttp.ClientConnectionError as e:
            raise NotRunningError(f"cannot reach ipybox in {self.state.workspace}: {e}") from None
        try:
            if response.status != 200:
                error = ControlError.model_validate_json(body).error
                raise ControlRequestError(f"ipybox in {self.state.workspace}: {error}")
            return answer.model_validate_json(body)
        except ValidationError:
            raise ControlRequestError(
                f"ipybox in {self.state.workspace} answered {method} {path} with HTTP {response.status} and "
                f"an unexpected body ({body[:200]!r}): is it the same ipybox version?"
            ) from None
