"""Stopping rank 0's step body from another thread, without taking a signal from the user.

Rank 0 runs in the task's main thread. When another rank fails, the supervisor's thread must
make that body raise at once. Python runs signal handlers in the main thread only, between two
bytecodes, and a signal also ends a sleep or a blocking read there (PEP 475 retries the call only
if the handler returns), so the supervisor sends the main thread a signal whose handler raises.

Which signal: not SIGUSR1 or SIGUSR2, which belong to the user (a step may install its own
handler, before or inside its body, and rely on it). We take a real-time signal (Linux has about
30) that nobody uses: at its default action, with no handler installed from Python or C, and not
blocked; the highest such one, as libraries that use one count up from SIGRTMIN. Our handler is
installed only while the gang runs and removed exactly: if the user's code installed another
handler on that signal meanwhile, theirs stays. Where no such signal exists (no real-time
signals, e.g. macOS), nothing is installed and the gang's watchdog ends the task after the abort
grace, as for a body stuck in native code (docs/reliability.md, "Where the interruption lands").
"""

import os
import signal
from types import FrameType
from typing import Callable, Literal, Optional


def free_signal() -> Optional[int]:
    """A real-time signal no one in this process uses, or None."""
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is None or high is None:
        return None
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    for signum in range(high, low - 1, -1):
        # SIG_DFL also says that no C library installed a handler: getsignal gives None then
        if signal.getsignal(signum) == signal.SIG_DFL and signum not in blocked:
            return signum
    return None


class BodyInterrupt:
    """While the `with` block runs, `interrupt(thread_id)` makes that thread (the main one)
    raise `make_error()` at its next Python bytecode, as long as `active()` is true then."""

    def __init__(self, make_error: Callable[[], BaseException],
                 active: Callable[[], bool]) -> None:
        self.make_error = make_error
        self.active = active
        self.signum: Optional[int] = None

    def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.active():
            raise self.make_error()

    def __enter__(self) -> "BodyInterrupt":
        self.signum = free_signal()
        if self.signum is not None:
            signal.signal(self.signum, self._handler)
        return self

    def interrupt(self, thread_id: int) -> bool:
        """Send the signal; False where there is none (the caller's watchdog is the fallback)."""
        if self.signum is None:
            return False
        signal.pthread_kill(thread_id, self.signum)
        return True

    def __exit__(self, *exc: object) -> Literal[False]:
        # Restore only our own: a handler the body installed on this signal stays. Through
        # SIG_IGN first: it discards an abort still pending (sent while the signal was
        # blocked), which SIG_DFL, a real-time signal's "terminate", would let kill the task.
        if self.signum is not None and signal.getsignal(self.signum) == self._handler:
            signal.signal(self.signum, signal.SIG_IGN)
            signal.signal(self.signum, signal.SIG_DFL)
        return False


# -- the run's own interruption, as the tasks it kills can learn it ------------------------------
#
# Ctrl-C reaches the whole terminal's process group, tasks included; a SIGINT sent to the run's
# process alone (`kill -INT`, a scheduler, a notebook) reaches only Metaflow's runtime, which
# then waits 5 s for its tasks and SIGKILLs them. The task cannot tell that SIGKILL from the OOM
# killer's, so the runtime leaves a mark, named by its pid, that the task's log pump reads when
# it writes the note of a task that died without a word (gang._orphan_note).


def interrupted_mark(runtime_pid: int) -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), "torch-distributed-interrupted-%d" % runtime_pid)


def mark_interrupts() -> Optional[str]:
    """In Metaflow's runtime process: on SIGINT, leave the mark, then do what was done before
    (Python's default raises KeyboardInterrupt). Installed once; returns the mark's path, or
    None where SIGINT is ignored or handled outside Python (left as it is)."""
    mark = interrupted_mark(os.getpid())
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "torch_distributed_mark", None) == mark:
        return mark
    if previous in (signal.SIG_IGN, None):  # ignored (a background job), or C's own handler
        return None

    def on_interrupt(signum: int, frame: Optional[FrameType]) -> object:
        with open(mark, "w"):
            pass
        if callable(previous):
            return previous(signum, frame)
        signal.signal(signum, signal.SIG_DFL)  # SIG_DFL: end as the process would have
        os.kill(os.getpid(), signum)
        return None

    # an attribute of the function (mypy knows none): the check above reads it
    on_interrupt.torch_distributed_mark = mark  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, on_interrupt)
    return mark


def was_interrupted(runtime_pid: int) -> bool:
    """True when the runtime of pid `runtime_pid` was interrupted (mark_interrupts)."""
    return os.path.exists(interrupted_mark(runtime_pid))


def forget_interrupt(runtime_pid: int) -> None:
    try:
        os.unlink(interrupted_mark(runtime_pid))
    except FileNotFoundError:
        pass
