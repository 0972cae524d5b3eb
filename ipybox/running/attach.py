"""`WorkspaceSession`: an application's share of a running workspace: a lease, kernels from the warm
pool, and the websocket on which the workspace asks the application about tool calls (`ask` rules)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from ipybox.approval.approval_client import ApprovalClient
from ipybox.approval.ask_context import MAX_REGISTERED_CELL
from ipybox.approval.channel import Answers
from ipybox.approval.request import ApprovalRequest
from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.rules.calls import ToolCall
from ipybox.running.control_client import ControlClient
from ipybox.running.leased_client import LeasedKernelClient
from ipybox.running.state import read_state
from ipybox.running.status import LeaseId
from ipybox.safefs import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_OUTPUT_FILE_BYTES

logger = logging.getLogger(__name__)

_closing: set[asyncio.Future[None]] = set()  # leases being given back after a failed open


def default_client_name() -> str:
    """The name of a session whose application gives none: `<program> (pid N)`."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return f"{program or 'python'} (pid {os.getpid()})"


class WorkspaceSession:
    """Attach to the workspace running in `workspace` (see `CodeExecutor(workspace=...)`).

    Args:
        workspace: The directory `ipybox up` runs in.
        on_approval: Gets each `ask` for this session's kernels.
        pause_timer: Pauses the running execution's timeout while a human decides; returns the resume.
        images_dir, output_dir, max_output_chars, max_output_file_bytes, max_image_bytes: As for
            `KernelClient`.
        kernel_init_timeout: Seconds until a kernel from the pool answers, the wait for the pool to have
            one included when the kernels are local (`KernelClient`'s `ready_timeout`; `None`: no limit).
        answers: What the application does with `ask`s: decides them (`application`), asks its MCP
            client (`elicitation`), or neither (`none`: the workspace asks people instead, and only tells
            it, so the execution's clock stops while they decide).
        declines: Asked about each `ask` before `on_approval` is: why the application does not answer this
            one (`None`: it does). Declined, it goes to the people present, or is denied
            (`ApprovalClient`'s `declines`).
        check: The session checks agent-written code (`CodeExecutor.check_in_fresh_kernel`): the
            workspace refuses its kernels' `ask`s without asking anyone.
        client: The name people asked about this session's calls see (an MCP client's `name version`);
            default: `<program> (pid N)` of this process.

    Each cell is registered with the workspace before it is executed (`POST /leases/{lease}/cells`, at
    most `MAX_REGISTERED_CELL` characters), so that people asked about its calls see its text as
    verified rather than as the kernel reports it. A registration that fails is logged and skipped.
    """

    def __init__(
        self,
        workspace: Path,
        on_approval: Callable[[ApprovalRequest], Awaitable[None]],
        pause_timer: Callable[[], Callable[[], None]],
        *,
        images_dir: Path | None = None,
        output_dir: Path | None = None,
        max_output_chars: int,
        max_output_file_bytes: int = DEFAULT_MAX_OUTPUT_FILE_BYTES,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
        kernel_init_timeout: float | None = 60,
        answers: Answers = "application",
        declines: Callable[[ToolCall], str | None] | None = None,
        check: bool = False,
        client: str | None = None,
    ) -> None:
        self.workspace = workspace
        self.answers: Answers = answers
        self.declines = declines
        self.check = check
        self.client = client if client is not None else default_client_name()
        self.on_approval = on_approval
        self.pause_timer = pause_timer
        self.state = read_state(workspace)
        self.control = ControlClient(self.state)
        self.lease: LeaseId | None = None
        state = self.state
        if state.gateway_url is not None:  # a remote gateway ([kernel.gateway]): its kernels are there
            ca_file = Path(state.gateway_ca_file) if state.gateway_ca_file else None
            endpoint = GatewayEndpoint(state.gateway_url, state.gateway_token, ca_file=ca_file)
        else:
            endpoint = GatewayEndpoint(
                "http://localhost", state.gateway_token, unix_socket=Path(state.gateway_socket)
            )
        self.kernel_client = LeasedKernelClient(
            endpoint,
            images_dir=images_dir,
            output_dir=output_dir,
            max_output_chars=max_output_chars,
            max_output_file_bytes=max_output_file_bytes,
            max_image_bytes=max_image_bytes,
            spare_kernel=False,  # the workspace's pool is the spare
            ready_timeout=kernel_init_timeout,
            kernel_source=self._lease_kernel,
            # A remote gateway's pod may take minutes: the workspace bounds that by its start_timeout.
            source_wait_bounded=state.gateway_url is None,
            gateway_loss=self._gateway_loss,
            replaced=self._replaced,
            submitting=self._register_cell,
        )
        self._approvals: ApprovalClient | None = None
        self._lost: str | None = None  # the last lease answer's `lost`, until asked for

    async def open(self) -> None:
        """Take a lease, connect its approval websocket and a kernel from the pool.

        Raises:
            NotRunningError: The workspace is not running (any more).
        """
        await self.control.__aenter__()
        try:
            self.lease = await self.control.new_lease(check=self.check, client=self.client)
            self._approvals = ApprovalClient(
                self._on_request,
                address=f"unix:{self.state.control_socket}",
                token=self.state.control_token,
                path=f"/leases/{self.lease}/approval",
                answers=self.answers,
                on_waiting=self.pause_timer,
                declines=self.declines,
            )
            await self._approvals.connect()
            await self.kernel_client.connect()
        except BaseException:
            # In a task of its own, the one task here that no group owns: under a cancelled anyio scope (an
            # MCP session closed while opening) every await of this task fails at once, and the lease would
            # be kept until the sweep. No group can take it: starting one needs an await, which fails there
            # too, and the session's caller has none that outlives this call. `_closing` holds it until done.
            closing = asyncio.ensure_future(self.close())
            _closing.add(closing)
            closing.add_done_callback(_closing.discard)
            # Cancelled meanwhile, the caller sees its cancellation (the close goes on in its task).
            await asyncio.shield(closing)
            raise

    async def close(self) -> None:
        """Give back the lease: its kernels are deleted. Never raises."""
        with contextlib.suppress(Exception):
            await self.kernel_client.disconnect()
        if self._approvals is not None:
            with contextlib.suppress(Exception):
                await self._approvals.disconnect()
            self._approvals = None
        if self.lease is not None:
            with contextlib.suppress(Exception):
                await self.control.release(self.lease)
            self.lease = None
        await self.control.close()

    async def _lease_kernel(self) -> str:
        assert self.lease is not None
        self._lost = None  # a stale answer must not explain a later death
        leased = await self.control.take_kernel(self.lease)
        self._lost = leased.lost
        return leased.kernel_id

    async def _gateway_loss(self) -> str | None:
        # The supervisor restarted the gateway before it answered the lease of the replacement kernel,
        # and said so in that answer.
        lost, self._lost = self._lost, None
        return lost

    def _replaced(self) -> str | None:
        # Why the workspace took the kernel this lease held before the current one (reaped while idle,
        # recycled, its gateway restarted), for the notice of the next execution; told once.
        lost, self._lost = self._lost, None
        return lost

    async def _register_cell(self, code: str) -> None:
        if self.lease is None or len(code) > MAX_REGISTERED_CELL or self.check:
            return
        try:
            await self.control.register_cell(self.lease, code)
        except Exception as e:  # an older workspace, or one going away: the asks show the kernel's text
            logger.debug("registering a cell with the workspace failed: %s", e)

    async def _on_request(self, request: ApprovalRequest) -> None:
        resume = self.pause_timer()
        request.add_done_callback(lambda accepted: resume())
        await self.on_approval(request)
