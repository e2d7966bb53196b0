"""The run's own interruption, as the tasks it kills can learn it.

Ctrl-C reaches the whole terminal's process group, tasks included; a SIGINT sent to the run's
process alone (`kill -INT`, a scheduler, a notebook) reaches only Metaflow's runtime, which
then waits 5 s for its tasks and SIGKILLs them. The task cannot tell that SIGKILL from the OOM
killer's, so the runtime leaves a mark, named by its pid, that the task's log pump reads when
it writes the note of a task that died without a word (gang.runner._orphan_note).

The runtime and its tasks agree on the mark's place without being told: this user's own folder
(privdir.user_dir), created 0700 and checked on every use, never a shared one such as /tmp,
where another user could plant the name first. Where that folder is not this user's alone
(another user took its name first), nothing is marked, and a task killed by an interruption is
described as one that died without a word: the note loses its precision, the run nothing.
"""

import os
import signal
from types import FrameType
from typing import Optional

from . import privdir


def mark_name(runtime_pid: int) -> str:
    return "interrupted-%d" % runtime_pid


def interrupted_mark(runtime_pid: int) -> str:
    """Where the mark of the runtime of pid `runtime_pid` lies."""
    return os.path.join(privdir.user_dir(), mark_name(runtime_pid))


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
    forget_interrupt(os.getpid())  # left by an earlier runtime of this pid, killed meanwhile

    def on_interrupt(signum: int, frame: Optional[FrameType]) -> object:
        with privdir.private(privdir.user_dir(), create=True) as folder:
            if folder is not None:
                privdir.create(folder, mark_name(os.getpid()))
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
    """True when the runtime of pid `runtime_pid` was interrupted (mark_interrupts): its mark
    is a file of this user's in this user's own folder."""
    with privdir.private(privdir.user_dir()) as folder:
        return folder is not None and privdir.is_ours(folder, mark_name(runtime_pid))


def forget_interrupt(runtime_pid: int) -> None:
    """Remove the mark, if there is one; never fails."""
    with privdir.private(privdir.user_dir()) as folder:
        if folder is not None:
            privdir.remove(folder, mark_name(runtime_pid))
