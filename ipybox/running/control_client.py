"""`ControlClient`: talks to a running workspace's control endpoint (for the CLI and attached
applications).

Contract: every answer comes back as its model of `ipybox.running.status` (validated), never as a bare
dict; an unreachable endpoint is `NotRunningError`, an answer other than 200 a `RuntimeError` carrying the
endpoint's one-line `ControlError`. A streamed answer (`apply_server` with `progress`) is read line by
line, each line validated by its `kind`; a stream that breaks off is `NotRunningError` (the workspace
went away), one that ends without its last line or with a line this version does not know a
`ControlRequestError`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncGenerator
from pathlib import Path
from types import TracebackType
from typing import Annotated, Self, TypeVar
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from ipybox.errors import WorkspaceError
from ipybox.progress import Progress, ProgressEvent, emit_to
from ipybox.running.state import NotRunningError, SupervisorState, read_state
from ipybox.running.status import (
    CellRegistered,
    CellSubmitted,
    ConsoleLogin,
    ControlError,
    KernelId,
    KernelLeased,
    LeaseCreated,
    LeaseId,
    LeaseReleased,
    LeaseRequest,
    LockAccepted,
    ServerOutcome,
    ShutdownAccepted,
    StreamFailure,
    TokenRotated,
    WorkspaceStatus,
)

_Answer = TypeVar("_Answer", bound=BaseModel)

_NDJSON = "application/x-ndjson"
# The longest line of a stream read: an outcome with every problem of a large ipybox.toml fits easily.
_MAX_LINE = 16 * 1024 * 1024


@functools.cache
def _apply_line_adapter() -> TypeAdapter[ProgressEvent | ServerOutcome | StreamFailure]:
    # Built on first use: only `ipybox server add` reads the stream, and building it costs milliseconds
    # every process that imports this module would pay.
    return TypeAdapter(Annotated[ProgressEvent | ServerOutcome | StreamFailure, Field(discriminator="kind")])


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

    async def accept_pins(self, server: str | None = None) -> list[str]:
        """Pin what `server` (or every server that differs) serves now in `ipybox.lock`; the servers
        accepted."""
        path = "/lock/accept" + (f"?server={quote(server)}" if server is not None else "")
        return (await self._call("POST", path, LockAccepted)).accepted

    async def new_lease(self, *, check: bool = False, client: str | None = None) -> LeaseId:
        """A new lease; with `check`, one whose kernels check agent-written code (their `ask`s are refused
        without asking anyone); `client` names it for the people asked about its calls."""
        body = LeaseRequest(check=check, client=client) if check or client is not None else None
        return (await self._call("POST", "/leases", LeaseCreated, body)).lease

    async def register_cell(self, lease: LeaseId, code: str) -> str:
        """Tell the workspace the cell `lease`'s application executes next (shown as verified to the
        people asked about its calls); its SHA-256."""
        body = CellSubmitted(code=code)
        return (await self._call("POST", f"/leases/{lease}/cells", CellRegistered, body)).sha

    async def lease_kernel(self, lease: LeaseId) -> KernelId:
        return (await self.take_kernel(lease)).kernel_id

    async def take_kernel(self, lease: LeaseId) -> KernelLeased:
        """A kernel from the pool for `lease`, in place of the one it held, and why the workspace took
        that one if it did (`KernelLeased.lost`)."""
        return await self._call("POST", f"/leases/{lease}/kernels", KernelLeased)

    async def release(self, lease: LeaseId) -> None:
        await self._call("DELETE", f"/leases/{lease}", LeaseReleased)

    async def apply_server(self, name: str, progress: Progress | None = None) -> ServerOutcome:
        """Have the workspace apply its current `ipybox.toml` now; returns server `name`'s outcome once it
        has one (started and generated, failed, a configuration problem, or absent).

        With `progress`, it is called with each of the server's `ProgressEvent`s as the workspace reaches
        them (connecting, listing tools, generating, ...), before the outcome returns.
        """
        path = f"/servers/{name}/apply"
        if progress is None:
            return await self._call("POST", path, ServerOutcome)
        try:
            async with contextlib.aclosing(self._stream("POST", path)) as lines:
                async for line in lines:
                    answer = self._apply_line(path, line)
                    if isinstance(answer, ProgressEvent):
                        emit_to(progress, answer)
                    elif isinstance(answer, StreamFailure):
                        raise ControlRequestError(f"ipybox in {self.state.workspace}: {answer.error}")
                    else:
                        return answer
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise NotRunningError(
                f"lost ipybox in {self.state.workspace} while it applied {name!r}: {e}"
            ) from None
        raise ControlRequestError(
            f"ipybox in {self.state.workspace} ended its answer to POST {path} before the outcome: "
            "is it the same ipybox version?"
        )

    def _apply_line(self, path: str, line: bytes) -> ProgressEvent | ServerOutcome | StreamFailure:
        try:
            return _apply_line_adapter().validate_json(line)
        except ValidationError:
            pass
        try:  # a supervisor that does not stream answers with the outcome alone, untagged
            return ServerOutcome.model_validate_json(line)
        except ValidationError:
            raise self._unexpected("POST", path, 200, line) from None

    async def console_login(self) -> ConsoleLogin:
        """A new one-time login link for the workspace's web console (`ipybox console`).

        Raises:
            ControlRequestError: The console is off (`[endpoints] console = false`).
        """
        return await self._call("POST", "/console/login", ConsoleLogin)

    async def rotate_mcp_token(self) -> TokenRotated:
        """Replace the MCP endpoint's persisted bearer token (`ipybox token rotate`); the running endpoint
        refuses the old one from then on."""
        return await self._call("POST", "/mcp/token", TokenRotated)

    async def _stream(self, method: str, path: str) -> AsyncGenerator[bytes]:
        """The lines of a streamed (NDJSON) answer, as they arrive; an answer other than 200 raises as
        `_call` does."""
        if self._http is None:
            raise RuntimeError("use 'async with ControlClient(...)'")
        try:
            response = await self._http.request(
                method, f"http://localhost{path}", headers={"Accept": _NDJSON}
            )
        except aiohttp.ClientConnectionError as e:
            raise NotRunningError(f"cannot reach ipybox in {self.state.workspace}: {e}") from None
        async with response:
            if response.status != 200:
                body = await response.read()
                try:
                    error = ControlError.model_validate_json(body).error
                except ValidationError:
                    raise self._unexpected(method, path, response.status, body) from None
                raise ControlRequestError(f"ipybox in {self.state.workspace}: {error}")
            buffered = b""
            async for chunk in response.content.iter_any():
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield line
                if len(buffered) > _MAX_LINE:
                    raise self._unexpected(method, path, 200, buffered)
            if buffered.strip():
                yield buffered

    def _unexpected(self, method: str, path: str, status: int, body: bytes) -> ControlRequestError:
        return ControlRequestError(
            f"ipybox in {self.state.workspace} answered {method} {path} with HTTP {status} and "
            f"an unexpected body ({body[:200]!r}): is it the same ipybox version?"
        )

    async def _call(
        self, method: str, path: str, answer: type[_Answer], request: BaseModel | None = None
    ) -> _Answer:
        if self._http is None:
            raise RuntimeError("use 'async with ControlClient(...)'")
        data = request.model_dump_json() if request is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self._http.request(
                method, f"http://localhost{path}", data=data, headers=headers
            ) as response:
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
