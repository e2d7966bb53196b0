"""PausedTimer and WhenAll: the gang's start-up is taken out of @timeout's clock
(signal.alarm), which resumes once rank 0's body started and the gang is assembled."""

import signal
import threading
import time

from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.usertimer import (
    PausedTimer,
    WhenAll,
    disarm,
)


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


def test_when_all_acts_once_after_the_last_arrival_in_either_order():
    for order in (("body", "assembled"), ("assembled", "body")):
        calls = []
        gate = WhenAll(lambda: calls.append(1), ("body", "assembled"))
        assert gate.arrive(order[0]) is False and calls == []
        assert gate.arrive(order[0]) is False and calls == []  # the same one twice: still waits
        assert gate.arrive(order[1]) is True and calls == [1]
        assert gate.arrive(order[1]) is False and gate.arrive(order[0]) is False
        assert calls == [1]


def test_when_all_acts_once_when_threads_arrive_together():
    for _ in range(50):
        calls = []
        gate = WhenAll(lambda: calls.append(1), ("body", "assembled"))
        start = threading.Barrier(2)

        def arrive(name):
            start.wait()
            gate.arrive(name)

        threads = [threading.Thread(target=arrive, args=(n,)) for n in ("body", "assembled")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert calls == [1]


def _with_alarm(test):
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(time.monotonic()))
    try:
        test(fired)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_the_clock_resumes_only_once_body_and_assembly_both_arrived_from_another_thread():
    def test(fired):
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        timer = PausedTimer().pause()
        gate = WhenAll(timer.resume, ("body", "assembled"))
        gate.arrive("body")  # the main thread: rank 0's body starts
        time.sleep(0.4)  # the gang is not assembled yet: the clock stands still
        assert not fired and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        # the watch's thread sees the last check-in: it re-arms the process's timer
        watch = threading.Thread(target=gate.arrive, args=("assembled",))
        resumed = time.monotonic()
        watch.start()
        watch.join()
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.2 < left <= 0.3
        while not fired and time.monotonic() - resumed < 5:
            time.sleep(0.01)
        # SIGALRM still reaches the main thread's handler (Metaflow's raises TimeoutException)
        assert fired and fired[0] - resumed >= 0.25
        timer.resume()  # the decorator's own resume after the gang: a no-op now
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    _with_alarm(test)


def test_a_gang_that_never_assembles_keeps_its_clock_paused():
    def test(fired):
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        timer = PausedTimer().pause()
        gate = WhenAll(timer.resume, ("body", "assembled"))
        gate.arrive("body")
        time.sleep(0.3)
        assert not fired
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    _with_alarm(test)


def test_a_member_disarms_its_own_step_timeout_for_good():
    def test(fired):
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        disarm()
        time.sleep(0.3)
        assert not fired and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    _with_alarm(test)
