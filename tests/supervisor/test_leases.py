"""`LeaseTable` in process: who holds which kernel, whose token is whose, and who answers an `ask`."""

from __future__ import annotations

import pytest

from ipybox.approval.channel import ApprovalChannel
from ipybox.running.status import CallerId, CallerToken, KernelId, LeaseId
from ipybox.supervisor.leases import LeaseTable, UnknownLeaseError

A, B = CallerId("caller-a"), CallerId("caller-b")
TOKEN_A, TOKEN_B = CallerToken("token-a"), CallerToken("token-b")
K1, K2 = KernelId("k1"), KernelId("k2")


def connected() -> ApprovalChannel:
    """A channel someone answers on (an in-process handler)."""

    async def handler(request: object) -> None: ...

    return ApprovalChannel(True, 5, handler=handler)


@pytest.fixture
def table() -> LeaseTable:
    table = LeaseTable()
    table.add_caller(A, TOKEN_A)
    table.add_caller(B, TOKEN_B)
    return table


def test_an_ask_goes_to_the_application_holding_the_calling_kernel(table: LeaseTable) -> None:
    first, second = table.new_lease(), table.new_lease()
    table.bind(first, K1, A)
    table.bind(second, K2, B)
    channel_1, channel_2 = connected(), connected()
    table.open_channel(first, channel_1)
    table.open_channel(second, channel_2)
    assert table.answerer(A) is channel_1
    assert table.answerer(B) is channel_2
    assert table.lease_of(A) == first and table.callers == {A: first, B: second}


def test_nobody_answers_for_a_kernel_no_lease_holds(table: LeaseTable) -> None:
    lease = table.new_lease()
    table.open_channel(lease, connected())
    assert table.answerer(A) is None
    assert table.answerer("a caller never seen") is None


def test_nobody_answers_while_the_application_is_not_connected(table: LeaseTable) -> None:
    lease = table.new_lease()
    table.bind(lease, K1, A)
    assert table.answerer(A) is None  # no channel yet
    table.open_channel(lease, ApprovalChannel(True, 5))
    assert table.answerer(A) is None  # a channel nobody listens on


def test_a_lease_keeps_the_first_channel_until_it_closes(table: LeaseTable) -> None:
    lease = table.new_lease()
    first, second = connected(), connected()
    assert table.open_channel(lease, first) is first
    assert table.open_channel(lease, second) is first
    table.close_channel(lease, second)  # not its channel: nothing happens
    assert table.channel(lease) is first
    table.close_channel(lease, first)
    assert table.channel(lease) is None
    assert table.open_channel(lease, second) is second


def test_releasing_a_lease_hands_back_its_kernels_tokens_and_channel(table: LeaseTable) -> None:
    lease, other = table.new_lease(), table.new_lease()
    table.bind(lease, K1, A)
    table.bind(other, K2, B)
    channel = table.open_channel(lease, connected())
    released = table.release(lease)
    assert released.kernels == (K1,) and released.tokens == (TOKEN_A,) and released.channel is channel
    assert lease not in table and len(table) == 1
    assert table.answerer(A) is None and table.lease_of(A) is None
    assert table.kernels(other) == (K2,) and table.leased_kernels == 1


def test_a_kernel_whose_caller_is_unknown_is_held_but_answers_to_nobody(table: LeaseTable) -> None:
    lease = table.new_lease()
    table.bind(lease, K1, None)
    assert table.leased_kernels == 1
    assert table.release(lease).tokens == ()


def test_replacing_all_kernels_keeps_the_leases_and_revokes_every_token(table: LeaseTable) -> None:
    lease = table.new_lease()
    table.bind(lease, K1, A)
    channel = table.open_channel(lease, connected())
    assert sorted(table.unbind_kernels()) == [TOKEN_A, TOKEN_B]  # idle pool kernels' tokens too
    assert lease in table and table.kernels(lease) == () and table.leased_kernels == 0
    assert table.answerer(A) is None  # A's kernel is gone; the new kernel is bound under a new caller
    assert table.channel(lease) is channel  # the application stays connected across the recycle
    assert table.unbind_kernels() == []


def test_an_unknown_lease_is_one_clear_key_error(table: LeaseTable) -> None:
    unknown = LeaseId("nope")
    for attempt in (
        lambda: table.kernels(unknown),
        lambda: table.release(unknown),
        lambda: table.bind(unknown, K1, A),
        lambda: table.open_channel(unknown, connected()),
    ):
        with pytest.raises(UnknownLeaseError, match="unknown lease 'nope'") as raised:
            attempt()
        assert isinstance(raised.value, KeyError)
    assert table.lease_of(A) is None  # a failed bind binds nothing


def test_the_callers_view_is_live_and_read_only(table: LeaseTable) -> None:
    view = table.callers
    lease = table.new_lease()
    table.bind(lease, K1, A)
    assert view[A] == lease
    with pytest.raises(TypeError):
        view[B] = lease  # type: ignore[index]


def test_a_lease_given_a_new_kernel_hands_back_the_one_it_held(table: LeaseTable) -> None:
    """Its application replaced its kernel (it died, or on reset): one leased kernel, not two."""
    lease = table.new_lease()
    assert table.bind(lease, K1, A).replaced == ()
    bound = table.bind(lease, K2, B)
    assert bound.replaced == (K1,) and bound.tokens == (TOKEN_A,) and bound.lost is None
    assert table.kernels(lease) == (K2,) and table.leased_kernels == 1
    assert table.lease_of(A) is None and table.lease_of(B) == lease


def test_a_lease_whose_kernel_the_workspace_took_is_told_why_with_its_next_kernel(table: LeaseTable) -> None:
    holding, idle = table.new_lease(), table.new_lease()
    table.bind(holding, K1, A)
    table.unbind_kernels("it exited with signal 9 (SIGKILL) and ipybox restarted it")
    table.add_caller(B, TOKEN_B)
    bound = table.bind(holding, K2, B)
    assert bound.lost == "it exited with signal 9 (SIGKILL) and ipybox restarted it"
    assert bound.replaced == () and bound.tokens == ()  # its kernel was already unbound
    assert table.bind(holding, K1, None).lost is None  # told once
    assert table.bind(idle, KernelId("k3"), None).lost is None  # it held no kernel: nothing was taken


def test_a_kernel_taken_from_its_lease_revokes_its_token_and_the_next_kernel_says_why(
    table: LeaseTable,
) -> None:
    """The idle kernel reaper's way: one kernel goes, the lease stays and is told with its next one."""
    lease, other = table.new_lease(), table.new_lease()
    table.bind(lease, K1, A)
    table.bind(other, K2, B)
    assert table.take(lease, K1, "it was idle for 2 s, longer than [kernel] max_idle (1 s)") == (TOKEN_A,)
    assert table.kernels(lease) == () and table.lease_of(A) is None and lease in table
    assert table.kernels(other) == (K2,) and table.lease_of(B) == other  # the other lease keeps its kernel
    assert table.take(lease, K1, "again") is None  # taken already: nothing changes
    assert table.take(other, K1, "not its kernel") is None
    table.add_caller(CallerId("c3"), CallerToken("token-3"))
    bound = table.bind(lease, KernelId("k3"), CallerId("c3"))
    assert bound.lost == "it was idle for 2 s, longer than [kernel] max_idle (1 s)"
    assert bound.replaced == () and bound.tokens == ()
