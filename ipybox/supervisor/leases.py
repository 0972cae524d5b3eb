"""`LeaseTable`: who holds which kernel of a running workspace, and who answers its tool calls' `ask`s.

It is the one place that answers "which application answers kernel K's ask": an attached application
holds a *lease*; the kernels it was given from the warm pool are bound to that lease; each pool kernel
calls tools as a *caller* with a *token* of its own (issued by the tool server when the kernel started);
and a lease's application answers `ask`s over an *approval channel* (its websocket). So a call from
caller C is asked on the channel of the lease that holds C's kernel, and on no other.

Contract:

- Pure bookkeeping: no I/O, no awaits, nothing to start or stop. The supervisor does what the table tells
  it (revoke these tokens, release these kernels, disconnect this channel).
- Ids are `NewType`s (`LeaseId`, `KernelId`, `CallerId`, `CallerToken`).
- A lease holds one kernel at a time: binding a kernel to it hands back the one it held (its application
  replaced it after it died, or on reset), whose caller is forgotten then, so `ipybox status` counts one
  leased kernel per application and a dead kernel's token is revoked at once.
- A lease outlives a recycle of the kernels or a gateway restart (`unbind_kernels`), and the reaping of
  its idle kernel (`take`): its application gets a fresh kernel under it, and the answer says why its
  kernel was taken (`Bound.lost`).
- `UnknownLeaseError` (a `KeyError`) for a lease the table does not hold; the control endpoint answers
  404 to it.

Example:
    ```python
    table = LeaseTable()
    table.add_caller(CallerId("c1"), CallerToken("secret"))  # a pool kernel started
    lease = table.new_lease()
    table.bind(lease, KernelId("k1"), CallerId("c1"))  # the application was given that kernel
    table.open_channel(lease, ApprovalChannel(True, 60))  # its approval websocket connected
    assert table.answerer(CallerId("c1")) is table.channel(lease)
    table.add_caller(CallerId("c2"), CallerToken("other"))
    bound = table.bind(lease, KernelId("k2"), CallerId("c2"))  # k1 died: k1 to delete, "secret" to revoke
    released = table.release(lease)  # -> the kernels to delete, tokens to revoke, channel to close
    ```
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from uuid import uuid4

from ipybox.approval.ask_context import client_name
from ipybox.approval.channel import ApprovalChannel
from ipybox.errors import WorkspaceError
from ipybox.running.status import CallerId, CallerToken, KernelId, LeaseId


class UnknownLeaseError(WorkspaceError, KeyError):
    """A lease the workspace does not hold (never taken, or released)."""

    def __init__(self, lease: str) -> None:
        super().__init__(lease)
        self.lease = lease

    def __str__(self) -> str:
        return f"unknown lease {self.lease!r} (take one with POST /leases)"


@dataclass
class _Lease:
    kernels: dict[KernelId, CallerId | None] = field(default_factory=dict)
    channel: ApprovalChannel | None = None
    lost: str | None = None  # why the workspace took its kernel, until the next one is bound
    refusal: str | None = None  # why its kernels' asks are refused without asking anyone
    name: str | None = None  # the name people asked about its calls see (its client's)
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    cell: tuple[str, str] | None = None  # (SHA-256, text) of the cell its application registered last


@dataclass(frozen=True)
class Released:
    """What a released lease leaves for the supervisor to give back.

    Attributes:
        kernels: Its kernels, to return to the pool (deleted there).
        tokens: The tool tokens of their callers, to revoke at the tool server.
        channel: Its approval channel, to disconnect (its pending asks are then denied).
    """

    kernels: tuple[KernelId, ...]
    tokens: tuple[CallerToken, ...]
    channel: ApprovalChannel | None


@dataclass(frozen=True)
class Bound:
    """What binding a kernel to a lease leaves for the supervisor.

    Attributes:
        replaced: The kernel(s) the lease held before, to delete (its application has replaced them).
        tokens: The tool tokens of their callers, to revoke at the tool server.
        lost: Why the workspace took the lease's previous kernel (a gateway restart, a recycle), to tell
            its application; `None` when it did not.
    """

    replaced: tuple[KernelId, ...]
    tokens: tuple[CallerToken, ...]
    lost: str | None


class LeaseTable:
    """Leases, their kernels, the kernels' callers and tokens, and the leases' approval channels."""

    def __init__(self) -> None:
        self._leases: dict[LeaseId, _Lease] = {}
        self._tokens: dict[CallerId, CallerToken] = {}
        self._lease_of: dict[str, LeaseId] = {}  # caller -> lease

    # -- leases

    def new_lease(self, refusal: str | None = None, name: str | None = None) -> LeaseId:
        """A new lease; with `refusal`, an `ask` of its kernels is refused with that reason and nobody
        is asked (a lease whose kernel checks agent-written code); `name` is what people asked about its
        calls see (`client_name` makes it printable and short)."""
        lease = LeaseId(uuid4().hex)
        self._leases[lease] = _Lease(refusal=refusal, name=client_name(name))
        return lease

    def info(self, lease: str) -> tuple[str | None, datetime | None]:
        """The lease's name and when it was taken (`(None, None)` for a lease the table does not hold)."""
        entry = self._leases.get(LeaseId(lease))
        return (entry.name, entry.started) if entry is not None else (None, None)

    def register_cell(self, lease: LeaseId, code: str) -> str:
        """The lease's application is about to execute `code`: remember it (in place of the last one) as
        the lease's current cell; returns its SHA-256.

        Raises:
            UnknownLeaseError: The table holds no such lease.
        """
        # As IPython's history keeps it (trailing newlines dropped), whose SHA-256 the kernel reports.
        code = code.rstrip("\n")
        sha = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()
        self._lease(lease).cell = (sha, code)
        return sha

    def cell_text(self, lease: str, sha: str) -> str | None:
        """The text of the lease's latest registered cell, if its SHA-256 is `sha`."""
        entry = self._leases.get(LeaseId(lease))
        cell = entry.cell if entry is not None else None
        return cell[1] if cell is not None and hmac.compare_digest(cell[0], sha) else None

    def __contains__(self, lease: object) -> bool:
        return lease in self._leases

    def __len__(self) -> int:
        """The number of leases held."""
        return len(self._leases)

    @property
    def leases(self) -> tuple[LeaseId, ...]:
        return tuple(self._leases)

    @property
    def leased_kernels(self) -> int:
        """How many kernels the leases hold together."""
        return sum(len(entry.kernels) for entry in self._leases.values())

    def kernels(self, lease: LeaseId) -> tuple[KernelId, ...]:
        """Raises:
        UnknownLeaseError: The table holds no such lease."""
        return tuple(self._lease(lease).kernels)

    def release(self, lease: LeaseId) -> Released:
        """Forget a lease and its kernels' callers; returns what the supervisor gives back.

        Raises:
            UnknownLeaseError: The table holds no such lease.
        """
        entry = self._lease(lease)
        del self._leases[lease]
        tokens = [self._forget(caller) for caller in entry.kernels.values() if caller is not None]
        return Released(tuple(entry.kernels), tuple(t for t in tokens if t is not None), entry.channel)

    # -- kernels and callers

    def add_caller(self, caller: CallerId, token: CallerToken) -> None:
        """A pool kernel was started calling tools as `caller` with `token`."""
        self._tokens[caller] = token

    def bind(self, lease: LeaseId, kernel: KernelId, caller: CallerId | None) -> Bound:
        """`kernel` (calling tools as `caller`, if the pool knows it) now belongs to `lease`, in place of
        the kernel it held; returns that one, to give back, and why the workspace took it, if it did.

        Raises:
            UnknownLeaseError: The table holds no such lease (it was released while the kernel was claimed).
        """
        entry = self._lease(lease)
        replaced = {k: c for k, c in entry.kernels.items() if k != kernel}
        entry.kernels = {kernel: caller}
        tokens = [self._forget(old) for old in replaced.values() if old is not None]
        if caller is not None:
            self._lease_of[caller] = lease
        lost, entry.lost = entry.lost, None
        return Bound(tuple(replaced), tuple(t for t in tokens if t is not None), lost)

    def caller_of_token(self, token: str) -> CallerId | None:
        """The caller whose kernel was started with `token` (`add_caller`), while the table knows it."""
        for caller, known in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return caller
        return None

    def lease_of(self, caller: CallerId) -> LeaseId | None:
        """The lease whose application answers for `caller`'s kernel (`None`: a kernel nobody holds)."""
        return self._lease_of.get(caller)

    @property
    def callers(self) -> Mapping[str, LeaseId]:
        """A live, read-only view of `lease_of`: caller -> lease (for an approver that looks callers up)."""
        return MappingProxyType(self._lease_of)

    def unbind_kernels(self, lost: str | None = None) -> list[CallerToken]:
        """All kernels are being replaced (a recycle or a gateway restart): leases stay, without kernels;
        every caller is forgotten. Returns every token, to revoke at the tool server.

        Args:
            lost: Why, said of the kernel gateway; the leases that held a kernel get it back with their
                next one (`Bound.lost`).
        """
        for entry in self._leases.values():
            if entry.kernels and lost is not None:
                entry.lost = lost
            entry.kernels.clear()
        tokens = list(self._tokens.values())
        self._tokens.clear()
        self._lease_of.clear()
        return tokens

    def take(self, lease: LeaseId, kernel: KernelId, lost: str) -> tuple[CallerToken, ...] | None:
        """The workspace takes `kernel` from `lease` to delete it (idle too long, grown too large: see
        `ipybox.supervisor.kernel_health`): the lease stays, without a kernel, and gets `lost` back with
        its next one (`Bound.lost`). Returns the kernel's caller token, to revoke; `None` when the lease
        does not hold `kernel` (any more), and then nothing changed."""
        entry = self._leases.get(lease)
        if entry is None or kernel not in entry.kernels:
            return None
        caller = entry.kernels.pop(kernel)
        entry.lost = lost
        token = self._forget(caller) if caller is not None else None
        return (token,) if token is not None else ()

    # -- approval channels

    def open_channel(self, lease: LeaseId, channel: ApprovalChannel) -> ApprovalChannel:
        """The lease's approval channel: the one it has, else `channel`, which becomes its.

        Raises:
            UnknownLeaseError: The table holds no such lease.
        """
        entry = self._lease(lease)
        if entry.channel is None:
            entry.channel = channel
        return entry.channel

    def close_channel(self, lease: LeaseId, channel: ApprovalChannel) -> None:
        """`channel` disconnected: the lease has none until its application connects again."""
        entry = self._leases.get(lease)
        if entry is not None and entry.channel is channel:
            entry.channel = None

    def channel(self, lease: LeaseId) -> ApprovalChannel | None:
        entry = self._leases.get(lease)
        return entry.channel if entry is not None else None

    def refusal(self, caller: CallerId | str) -> str | None:
        """Why `caller`'s `ask`s are refused without asking anyone (its lease checks agent-written code);
        `None` for a kernel whose asks are routed."""
        lease = self._lease_of.get(CallerId(caller))
        entry = self._leases.get(lease) if lease is not None else None
        return entry.refusal if entry is not None else None

    def answerer(self, caller: CallerId | str) -> ApprovalChannel | None:
        """The open approval channel of the application holding `caller`'s kernel: who answers its
        `ask`s. `None` when no lease holds it or its application is not connected."""
        lease = self._lease_of.get(CallerId(caller))
        channel = self.channel(lease) if lease is not None else None
        return channel if channel is not None and channel.open else None

    def _lease(self, lease: LeaseId) -> _Lease:
        entry = self._leases.get(lease)
        if entry is None:
            raise UnknownLeaseError(lease)
        return entry

    def _forget(self, caller: CallerId) -> CallerToken | None:
        self._lease_of.pop(caller, None)
        return self._tokens.pop(caller, None)
