"""What a ganged step's @timeout counts: the step body, from the moment the gang is assembled.

Metaflow's @timeout arms the process's real-time interval timer (signal.alarm) in task_pre_step,
before any decorator's task_decorate runs. The gang then imports torch and starts its members,
which takes a second or more, and processes that start afresh (exec'd ranks, node agents of
other nodes) take seconds more to import Metaflow and torch and check in with node 0's control
plane: time the user's body never had, spent waiting (rank 0 in init_process_group), and an
alarm landing in an import would interrupt torch half-way.

So rank 0 (the Metaflow task) pauses its timer while the package imports torch and starts the
gang (`PausedTimer`), and re-arms it with exactly the time that was left once both hold
(`WhenAll`): rank 0's body has started, and the gang is assembled: every process node 0
expects to check in has checked in (each exec'd rank of node 0, and each other node's agent,
which checks in once the ranks it exec'd have checked in themselves; LeaderWatch's
`on_assembled`). Rank 0's body starts as soon as the members are started, so its own
preparation overlaps their start-up, and that part is not charged to the timeout either. A
gang of forked ranks on one node is assembled at once. A gang
that fails before it is assembled keeps its timer paused: the rendezvous timeout bounds that
wait, and the gang's own error is what the step reports.

Processes the gang starts (node agents, exec'd ranks) are Metaflow spin-step processes, which
run @timeout too, with clocks started at their own task_pre_step. Rank 0's timeout governs the
gang (when it fires, rank 0 raises Metaflow's TimeoutException and the gang is stopped), so
they disarm theirs for good (`disarm`): an agent's alarm firing before rank 0's would otherwise
fail the gang with a confusing error from another node. Forked members do not inherit the
timer (POSIX).
"""

import os
import signal
import threading
from types import FrameType
from typing import Callable, Iterable, Literal, Optional, Set, Tuple

# A Python handler of a signal, as signal.signal takes it.
Handler = Callable[[int, Optional[FrameType]], object]


class PausedTimer:
    """Pause ITIMER_REAL from `pause()` until `resume()` (or the end of a `with` block).
    `resume` may be called from any thread, and more than once: the first call re-arms."""

    def __init__(self) -> None:
        # (seconds left, interval) while paused with an armed timer
        self._left: Optional[Tuple[float, float]] = None
        self._lock = threading.Lock()

    def pause(self) -> "PausedTimer":
        with self._lock:
            if self._left is None:
                left, interval = signal.setitimer(signal.ITIMER_REAL, 0)
                self._left = (left, interval) if left > 0 else (0.0, 0.0)
        return self

    def resume(self) -> None:
        # setitimer is a plain system call: any thread may re-arm the process's timer, and
        # SIGALRM's handler (Metaflow's) still runs in the main thread.
        with self._lock:
            if self._left is None:
                return
            left, interval = self._left
            self._left = None
            if left > 0:
                signal.setitimer(signal.ITIMER_REAL, left, interval)

    def __enter__(self) -> "PausedTimer":
        return self.pause()

    def __exit__(self, *exc: object) -> Literal[False]:
        self.resume()
        return False


class WhenAll:
    """Call `action` once, as soon as every one of `names` has `arrive`d (from any thread)."""

    def __init__(self, action: Callable[[], object], names: Iterable[str]) -> None:
        self._action = action
        self._waiting: Set[str] = set(names)
        self._done = False
        self._lock = threading.Lock()

    def arrive(self, name: str) -> bool:
        """Mark `name` as arrived; True if this call ran the action."""
        with self._lock:
            self._waiting.discard(name)
            if self._waiting or self._done:
                return False
            self._done = True
        self._action()
        return True


class AlarmForwarder:
    """While rank 0's body runs in a process of its own (start method fork), the task's
    @timeout is that body's: a SIGALRM to the task is sent on to rank 0's process, whose
    handler (Metaflow's, inherited through the fork) raises TimeoutException in the body, as
    @timeout does in any step (its finally blocks run; @catch keeps what it set). The gang then
    fails with rank 0's TimeoutException. A rank 0 still running `backstop` seconds later
    (stuck in native code, where Python runs no handler) is left to the task's own handler,
    which raises here and stops the gang, as it does once rank 0's body has ended.

    `rank0_pid()` is rank 0's pid while its process runs, else None. Without a handler from
    Python on SIGALRM (no @timeout), nothing is installed."""

    def __init__(self, rank0_pid: Callable[[], Optional[int]], backstop: float) -> None:
        self.rank0_pid = rank0_pid
        self.backstop = backstop
        self._theirs: Optional[Handler] = None
        self._forwarded = False

    def __enter__(self) -> "AlarmForwarder":
        theirs = signal.getsignal(signal.SIGALRM)
        if callable(theirs):
            self._theirs = theirs
            signal.signal(signal.SIGALRM, self._on_alarm)
        return self

    def _on_alarm(self, signum: int, frame: Optional[FrameType]) -> None:
        pid = None if self._forwarded else self.rank0_pid()
        if pid is None:
            theirs = self._theirs
            assert theirs is not None  # this handler is installed only over one of theirs
            signal.signal(signal.SIGALRM, theirs)
            theirs(signum, frame)
            return
        self._forwarded = True
        os.kill(pid, signal.SIGALRM)
        signal.setitimer(signal.ITIMER_REAL, self.backstop)

    def __exit__(self, *exc: object) -> Literal[False]:
        if self._theirs is not None and signal.getsignal(signal.SIGALRM) == self._on_alarm:
            signal.signal(signal.SIGALRM, self._theirs)
        if self._forwarded:  # the backstop is not wanted once rank 0 has ended
            signal.setitimer(signal.ITIMER_REAL, 0)
        return False


def disarm() -> None:
    """Stop this process's ITIMER_REAL for good (a gang member: rank 0's timeout governs)."""
    signal.setitimer(signal.ITIMER_REAL, 0)
