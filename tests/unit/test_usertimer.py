"""PausedTimer and WhenAll: the gang's start-up is taken out of @timeout's clock
(signal.alarm), which resumes once rank 0's body started and the gang is assembled."""

import os
import signal
import threading
import time

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.usertimer import (
    AlarmForwarder,
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


# -- AlarmForwarder: @timeout's alarm is rank 0's body's, in its own process ---------------------

class Timeout(Exception):
    """What Metaflow's @timeout handler raises (its TimeoutException), here the test's own."""


def _raise_timeout(signum, frame):
    raise Timeout()


def _fork_rank0(ignore_alarm=False):
    """A child that inherits the timeout handler, as rank 0 does: exit 7 if the alarm raised
    in it, 0 if it slept 5 s undisturbed."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if ignore_alarm:  # a body in native code: no Python handler runs
                signal.signal(signal.SIGALRM, signal.SIG_IGN)
            time.sleep(5)
        except Timeout:
            code = 7
        finally:
            os._exit(code)
    return pid


def _wait(pid):
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def timeout_handler():
    old = signal.signal(signal.SIGALRM, _raise_timeout)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def test_the_alarm_raises_in_rank_0s_process_not_in_the_task(timeout_handler):
    pid = _fork_rank0()
    with AlarmForwarder(lambda: pid, backstop=10):
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        code = _wait(pid)  # the task is not interrupted: the alarm went to rank 0
    assert code == 7
    assert signal.getsignal(signal.SIGALRM) is _raise_timeout  # given back
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # no backstop left armed


def test_a_rank_0_that_does_not_stop_is_stopped_from_the_task_after_the_backstop(
        timeout_handler):
    pid = _fork_rank0(ignore_alarm=True)
    start = time.monotonic()
    try:
        with pytest.raises(Timeout):
            with AlarmForwarder(lambda: pid, backstop=0.3):
                signal.setitimer(signal.ITIMER_REAL, 0.1)
                time.sleep(5)
        assert 0.35 <= time.monotonic() - start < 4
    finally:
        os.kill(pid, signal.SIGKILL)
        _wait(pid)


def test_after_rank_0_ended_the_alarm_is_the_tasks_own(timeout_handler):
    with pytest.raises(Timeout):
        with AlarmForwarder(lambda: None, backstop=10):
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            time.sleep(5)


def test_without_a_timeout_handler_nothing_is_installed():
    old = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    try:
        with AlarmForwarder(lambda: 1, backstop=1):
            assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGALRM, old)
