"""PausedTimer: the gang's start-up is taken out of @timeout's clock (signal.alarm)."""

import signal
import time

from metaflow_extensions.torch_distributed.plugins.torch_distributed.usertimer import PausedTimer


def test_a_paused_timer_resumes_with_the_time_that_was_left():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(time.monotonic()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        start = time.monotonic()
        with PausedTimer():
            time.sleep(0.4)  # longer than the timer: it must not fire while paused
            assert not fired
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.25 < left <= 0.3
        while not fired and time.monotonic() - start < 5:
            time.sleep(0.01)
        assert fired and fired[0] - start >= 0.65
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_no_timer_stays_no_timer_and_resume_is_idempotent():
    signal.setitimer(signal.ITIMER_REAL, 0)
    timer = PausedTimer().pause()
    timer.resume()
    timer.resume()
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
