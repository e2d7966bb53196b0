"""How another thread stops rank 0's body (interrupt.py): a real-time signal nobody uses, never
SIGUSR1/SIGUSR2, installed only inside the `with` block and removed exactly."""

import signal
import threading
import time
from pathlib import Path

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.interrupt import \
    BodyInterrupt, free_signal


class Stop(Exception):
    pass


def _later(action, delay=0.2):
    timer = threading.Timer(delay, action)
    timer.start()
    return timer


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2,
                                              *range(signal.SIGRTMIN, signal.SIGRTMAX + 1))}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_the_signal_is_a_free_real_time_one(restore_signals):
    first = free_signal()
    assert signal.SIGRTMIN <= first <= signal.SIGRTMAX
    signal.signal(first, lambda *a: None)  # someone took it: the next one is chosen
    second = free_signal()
    assert second != first and signal.SIGRTMIN <= second <= signal.SIGRTMAX
    signal.pthread_sigmask(signal.SIG_BLOCK, [second])  # a blocked one is not chosen either
    try:
        assert free_signal() not in (first, second)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [second])


def test_a_sleeping_body_raises_at_once_and_the_users_sigusr1_is_left_alone(restore_signals):
    calls = []

    def users_handler(signum, frame):
        calls.append(signum)

    signal.signal(signal.SIGUSR1, users_handler)
    main = threading.get_ident()
    interruption = BodyInterrupt(lambda: Stop("stopped"), lambda: True)
    started = time.monotonic()
    with pytest.raises(Stop), interruption:
        _later(lambda: interruption.interrupt(main))
        time.sleep(30)
    assert time.monotonic() - started < 5
    assert signal.getsignal(signal.SIGUSR1) is users_handler
    assert signal.getsignal(interruption.signum) == signal.SIG_DFL  # removed after the block
    signal.raise_signal(signal.SIGUSR1)
    assert calls == [signal.SIGUSR1]  # the user's handler still works, and only it ran


def test_a_handler_the_body_installed_on_that_signal_stays(restore_signals):
    interruption = BodyInterrupt(lambda: Stop(), lambda: True)
    calls = []
    with interruption:
        signal.signal(interruption.signum, lambda *a: calls.append(1))
    signal.raise_signal(interruption.signum)
    assert calls == [1]


def test_no_raise_once_the_body_is_over(restore_signals):
    running = threading.Event()
    interruption = BodyInterrupt(lambda: Stop(), running.is_set)
    with interruption:
        assert interruption.interrupt(threading.get_ident())
        time.sleep(0.05)  # the handler ran here and raised nothing


def test_without_a_free_signal_nothing_is_installed(restore_signals, monkeypatch):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import interrupt

    monkeypatch.setattr(interrupt, "free_signal", lambda: None)
    before = signal.getsignal(signal.SIGUSR1)
    with BodyInterrupt(lambda: Stop(), lambda: True) as interruption:
        assert interruption.interrupt(threading.get_ident()) is False
    assert signal.getsignal(signal.SIGUSR1) is before


def test_the_runtimes_sigint_leaves_a_mark_and_still_interrupts(tmp_path):
    """In Metaflow's runtime process: a SIGINT leaves the mark the tasks' log pumps read, then
    raises KeyboardInterrupt as before; forget_interrupt removes the mark."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os, signal, sys
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import interrupt

        # Python's own handler, as in `python flow.py run` from a terminal (a job started in
        # the background by a non-interactive shell inherits SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert interrupt.mark_interrupts() == interrupt.mark_interrupts()  # installed once
        assert not interrupt.was_interrupted(os.getpid())
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            print("interrupted", interrupt.was_interrupted(os.getpid()))
        interrupt.forget_interrupt(os.getpid())
        print("forgotten", not interrupt.was_interrupted(os.getpid()))
    """ % str(Path(__file__).parents[2]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout == "interrupted True\nforgotten True\n", done.stderr


def test_an_interrupt_still_pending_when_the_gang_ends_never_kills_the_task():
    """The abort's signal sent while the main thread had it blocked (pending) when the `with`
    block ends: restoring the default action (terminate, for a real-time signal) must not let
    it kill the task once unblocked. In a process of its own: the bug ends that process."""
    import subprocess
    import sys

    script = (
        "import signal, sys, threading\n"
        "from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.interrupt import "
        "BodyInterrupt\n"
        "interruption = BodyInterrupt(lambda: RuntimeError('stop'), lambda: False)\n"
        "with interruption:\n"
        "    signum = interruption.signum\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, [signum])\n"
        "    interruption.interrupt(threading.main_thread().ident)\n"
        "    assert signum in signal.sigpending()\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])\n"
        "print('alive', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", (proc.returncode,
                                                                      proc.stderr[-2000:])
