"""The run's own interruption, as the tasks it kills can learn it.

Ctrl-C reaches the whole terminal's process group, tasks included; a SIGINT sent to the run's
process alone (`kill -INT`, a scheduler, a notebook) reaches only Metaflow's runtime, which
then waits 5 s for its tasks and SIGKILLs them. The task cannot tell that SIGKILL from the OOM
killer's, so the runtime leaves a mark, named by its pid, that the task's log pump reads when
it writes the note of a task that died without a word (gang.runner._orphan_note).
"""

import os
import signal
from types import FrameType
from typing import Optional


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
