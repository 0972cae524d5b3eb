import time

from ipybox.kernels.timer import ExecutionTimer


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
