import time

from ipybox.kernels.timer import Cancellation, ExecutionTimer


def test_timer_expires_after_timeout() -> None:
    timer = ExecutionTimer(0.05)
    assert not timer.expired()
    time.sleep(0.06)
    assert timer.expired()
    assert timer.remaining() == 0.0


def test_paused_time_does_not_count() -> None:
    timer = ExecutionTimer(0.05)
    timer.pause()
    timer.pause()  # two approvals pending at once
    time.sleep(0.08)
    assert not timer.expired()
    assert timer.remaining(poll=0.25) == 0.25
    timer.resume()
    assert timer.paused
    timer.resume()
    assert not timer.paused
    assert timer.used < 0.05
    remaining = timer.remaining()
    assert remaining is not None and 0 < remaining <= 0.05


def test_no_timeout_never_expires() -> None:
    timer = ExecutionTimer(None)
    assert timer.remaining() is None
    assert not timer.expired()


def test_a_cancellation_wakes_the_execution_once_whether_it_came_before_or_after_registration() -> None:
    woken: list[str] = []
    late = Cancellation()
    late.on_cancel(lambda: woken.append("late"))
    assert woken == []
    late.cancel()
    late.cancel()  # repeated: nothing more
    early = Cancellation()
    early.cancel()
    early.on_cancel(lambda: woken.append("early"))  # delivered at registration
    assert woken == ["late", "early"] and late.cancelled and early.cancelled


def test_an_unregistered_waker_is_not_called() -> None:
    woken: list[bool] = []
    cancellation = Cancellation()
    cancellation.on_cancel(lambda: woken.append(True))
    cancellation.on_cancel(None)
    cancellation.cancel()
    assert woken == [] and cancellation.cancelled
