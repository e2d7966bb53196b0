"""Preemption reaches every rank.

A SIGTERM to the task (node 0) or to a node's agent (a scheduler stopping the job, a spot
reclaim notice, a `kill`) is a preemption of the whole gang: every rank of every node gets a
SIGTERM that its Python code can handle (Lightning's and transformers' own handlers run), and
`current.torch_distributed.preempted` (an Event a plain loop can check) is set. The gang then
gives its ranks `preempt_grace` seconds to save, stops what is left, and fails the attempt as
preempted, whatever the ranks did meanwhile, so that `@retry` starts the next attempt from
what they saved.

The gang's own stop (another rank failed) also sends SIGTERM to every member. A rank tells the
two apart by a mark its node's supervisor leaves in the node's work dir before it forwards a
preemption: the rank's handler, installed when its body starts (before the user's code, which
may replace it or chain it), sets the event when the mark is there, and otherwise ends the rank
as the default action always did. Only a handler nobody else installed is ever replaced, and
ours are removed exactly when the gang ends.

Slurm signals every process of a job at once (`scancel`, a preemption, the end of its time
limit: slurmstepd sends SIGCONT and SIGTERM to each process of each step, then SIGKILL after the
cluster's KillWait), so a rank hears the scheduler's SIGTERM before its supervisor could leave
the mark. On such a backend (`install_rank_handler(..., scheduler_signals_all=True)`) the gang's
own stop leaves a mark of its own first (`leave_stop_mark`, NodeRunner.stop), and a SIGTERM
with neither mark came from outside the gang: the rank sets PREEMPTED and passes the SIGTERM on
to its supervisor (the process that started it), which preempts the gang as for its own
SIGTERM (it usually had one already: the second counts for nothing).

On AWS Batch and Kubernetes a scheduler's SIGTERM goes to the container's main process (PID 1)
only, which is Metaflow's `bash -c "..."`: bash as PID 1 has no handler for it, so the kernel
drops it, and the step would hear of its stop only as the SIGKILL at the end of the grace. So
each node's command runs under FORWARDING (`forwarding(argv)`), a bash that traps SIGTERM and
sends it to the gang's supervisor on that node, the process that `announce`d itself.
"""

import math
import os
import signal
import socket
import threading
from types import FrameType
from typing import Callable, Iterable, List, Literal, Mapping, Optional, Tuple

from ..runtime import privdir
from ..runtime.procs import Member

# What a user sends the task to have every rank print its stacks (stacks.py: on demand).
ASK_SIGNAL = signal.SIGUSR1

# Where a container's PID 1 (FORWARDING) finds the supervisor to forward a SIGTERM to: a folder
# of its own (`mktemp -d`: mode 0700, a name nobody can guess, so nothing another user planted
# in a shared $TMPDIR is ever written or read) holding the supervisor's pid as PID_FILE
# (`announce`), and TERM_FILE once a SIGTERM came, told or not.
FORWARD_ENV = "METAFLOW_TORCH_DISTRIBUTED_FORWARD"
PID_FILE = "pid"
TERM_FILE = "term"

# A container's main process: runs its command ("$@") as a child, and forwards a SIGTERM to the
# announced supervisor (none announced yet: the supervisor sees TERM_FILE when it announces).
# Its exit status is the command's. A trapped signal interrupts `wait`, which is then called
# again; a child that ended meanwhile is still known to it (bash keeps the status of its
# background jobs), else (127) the interrupted wait's status stands. The trap is set before
# anything else runs: a SIGTERM at the container's very start is kept (`term`) and written to
# TERM_FILE once the folder exists (a SIGTERM before the trap ended the container without a
# word). Without `mktemp` (or a writable $TMPDIR) nothing is forwarded, as without FORWARDING.
FORWARDING = (
    'forward() { interrupted=1; term=1; [ -n "$d" ] || return; : > "$d/%(term)s"; '
    '[ -s "$d/%(pid)s" ] && kill -TERM "$(cat "$d/%(pid)s")" 2>/dev/null; }; '
    'trap forward TERM; '
    'd=$(mktemp -d "${TMPDIR:-/tmp}/metaflow-torch-distributed-forward.XXXXXX" 2>/dev/null) '
    '|| d=; '
    'if [ -n "$d" ]; then export %(env)s="$d"; [ -z "$term" ] || : > "$d/%(term)s"; fi; '
    '"$@" & child=$!; '
    'while :; do interrupted=; wait "$child"; code=$?; [ -n "$interrupted" ] || break; '
    'kill -0 "$child" 2>/dev/null && continue; '
    'wait "$child"; again=$?; [ "$again" = 127 ] || code=$again; break; done; '
    '[ -z "$d" ] || rm -rf "$d"; exit "$code"'
    % {"env": FORWARD_ENV, "pid": PID_FILE, "term": TERM_FILE})


# Seconds a scheduler that lets us set its stop grace (Kubernetes' terminationGracePeriodSeconds)
# gives past `preempt_grace`: what still runs is stopped, node 0 records the attempt's failure
# and Metaflow saves the task's logs before the SIGKILL.
STOP_MARGIN_S = 15


def scheduler_grace(preempt_grace_s: float) -> int:
    """The stop grace (whole seconds) to ask a scheduler for, for a gang's `preempt_grace`."""
    return int(math.ceil(preempt_grace_s)) + STOP_MARGIN_S


def forwarding(argv: Iterable[str]) -> List[str]:
    """A container's command `argv`, run under FORWARDING as its main process."""
    return ["bash", "-c", FORWARDING, "metaflow-torch-distributed", *argv]


def announce(environ: Mapping[str, str] = os.environ) -> bool:
    """Make this process (a node's supervisor) the one this container's PID 1 forwards a
    SIGTERM to. True when a SIGTERM came before: the caller acts on it as on its own. A folder
    that is not this user's alone (privdir.private) is left as it is: nothing is forwarded."""
    path = environ.get(FORWARD_ENV)
    if not path:
        return False
    with privdir.private(path) as folder:
        if folder is None:
            return False
        staged = "%s.%d" % (PID_FILE, os.getpid())
        privdir.remove(folder, staged)  # left by an earlier process of this pid
        if not privdir.create(folder, staged, str(os.getpid()).encode()):
            return False
        try:  # the trap reads a whole pid or no file
            os.replace(staged, PID_FILE, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError:
            privdir.remove(folder, staged)
            return False
        return privdir.is_ours(folder, TERM_FILE)


def withdraw(environ: Mapping[str, str] = os.environ) -> None:
    """The supervisor is done: a later SIGTERM goes nowhere (as without FORWARDING), so that the
    task's end (its artifacts, its logs) runs on to the scheduler's SIGKILL."""
    path = environ.get(FORWARD_ENV)
    if not path:
        return
    with privdir.private(path) as folder:
        if folder is not None and privdir.read(folder, PID_FILE) == str(os.getpid()).encode():
            privdir.remove(folder, PID_FILE)


# Set in every process of the gang once it is preempted (current.torch_distributed.preempted).
PREEMPTED = threading.Event()


def mark_file(work_dir: str) -> str:
    return os.path.join(work_dir, "preempted")


def stop_mark_file(work_dir: str) -> str:
    return os.path.join(work_dir, "stopping")


def leave_stop_mark(work_dir: str) -> None:
    """Before the gang's own stop sends its SIGTERMs: the ranks that hear one take it for the
    stop, not for a scheduler's preemption (`install_rank_handler`)."""
    try:
        with open(stop_mark_file(work_dir), "w"):
            pass
    except OSError:  # the work dir is gone: the gang is tearing down
        pass


def clear_stop_mark(work_dir: str) -> None:
    """A new round in place starts: its ranks were not stopped."""
    try:
        os.unlink(stop_mark_file(work_dir))
    except OSError:
        pass


def leave_mark(work_dir: str) -> None:
    try:
        with open(mark_file(work_dir), "w"):
            pass
    except OSError:  # the work dir is gone: the gang is tearing down
        pass


def install_rank_handler(work_dir: str, on_stop: Optional[Callable[[], object]] = None,
                         scheduler_signals_all: bool = False
                         ) -> Optional[Callable[[int, Optional[FrameType]], None]]:
    """In a rank's process, from its main thread: a SIGTERM with the mark sets PREEMPTED; one
    without is the gang's stop, which ends the rank, or calls `on_stop()` (rank 0's: it raises
    in the body, whose results are handed back). With `scheduler_signals_all` (Slurm), a
    SIGTERM without the stop's mark either is the scheduler's: PREEMPTED, and the supervisor
    is told. None if SIGTERM already has a handler of someone else's (it stays)."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def on_sigterm(signum: int, frame: Optional[FrameType]) -> None:
        if os.path.exists(mark_file(work_dir)):
            PREEMPTED.set()
            return
        if scheduler_signals_all and not os.path.exists(stop_mark_file(work_dir)):
            PREEMPTED.set()
            supervisor = os.getppid()
            if supervisor != 1:  # (1: the supervisor is gone, and PDEATHSIG ends this rank)
                try:
                    os.kill(supervisor, signal.SIGTERM)
                except OSError:
                    pass
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if on_stop is not None:
            on_stop()
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    return on_sigterm


class SupervisorHandler:
    """While the `with` block runs in a supervising process's main thread (node 0's task, or a
    node agent), a SIGTERM calls `on_preempt()` instead of ending the process. Installed only
    where SIGTERM has no handler yet; a handler installed meanwhile (by rank 0's body) stays.

    A Python signal handler runs in the main thread, between two bytecodes of whatever it runs:
    in node 0's task that is rank 0's body, which may sit in a collective, or in a handler of
    its own that waits on one (Lightning 2.6's SIGTERM handler broadcasts before it calls the
    handler it replaced), so the gang would hear of its preemption only when that returns. So
    the signal's number also goes to a wakeup fd (signal.set_wakeup_fd: Python's C-level
    handler writes it as the signal arrives), which a thread of ours reads and acts on at once.
    Only a wakeup fd nobody else set is taken, and it is given back as found."""

    def __init__(self, on_preempt: Callable[[], object],
                 on_stacks: Optional[Callable[[], object]] = None) -> None:
        self.on_preempt = on_preempt
        # called on ASK_SIGNAL (SIGUSR1): every rank prints its stacks (stacks.OnDemand)
        self.on_stacks = on_stacks
        self.installed = False
        self.asking = False  # ours is ASK_SIGNAL's handler
        # (read end, write end, reader thread) while ours is the wakeup fd
        self._wakeup: Optional[Tuple[socket.socket, socket.socket, threading.Thread]] = None

    def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
        PREEMPTED.set()  # rank 0's body may look at once; the watch's thread does the rest
        self.on_preempt()

    def _ask_handler(self, signum: int, frame: Optional[FrameType]) -> None:
        # (with the wakeup fd ours, the reader thread acted on it as it came)
        if not self._wakeup_is_ours() and self.on_stacks is not None:
            self.on_stacks()

    def _wakeup_is_ours(self) -> bool:
        """(Main thread.) Whether the wakeup fd is still ours: rank 0's code may have set its
        own meanwhile (asyncio), and then only the Python handler hears the signal."""
        if self._wakeup is None:
            return False
        ours = self._wakeup[1].fileno()
        current = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
        if current != ours:
            signal.set_wakeup_fd(current)
        return current == ours

    def __enter__(self) -> "SupervisorHandler":
        if threading.current_thread() is not threading.main_thread():
            return self
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._handler)
            self.installed = True
        if self.on_stacks is not None and signal.getsignal(ASK_SIGNAL) is signal.SIG_DFL:
            signal.signal(ASK_SIGNAL, self._ask_handler)
            self.asking = True
        if self.installed or self.asking:
            self._take_wakeup_fd()
        if self.installed and announce():  # its container was told to stop already
            os.kill(os.getpid(), signal.SIGTERM)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if self.installed:
            withdraw()
        self._give_back_wakeup_fd()
        if self.installed and signal.getsignal(signal.SIGTERM) == self._handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.asking and signal.getsignal(ASK_SIGNAL) == self._ask_handler:
            signal.signal(ASK_SIGNAL, signal.SIG_DFL)
        return False

    def _take_wakeup_fd(self) -> None:
        read_end, write_end = socket.socketpair()
        write_end.setblocking(False)
        try:
            previous = signal.set_wakeup_fd(write_end.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            previous = None
        if previous != -1:  # someone else's (or none could be set): leave it as it was
            if previous is not None:
                signal.set_wakeup_fd(previous)
            read_end.close()
            write_end.close()
            return
        reader = threading.Thread(target=self._read_wakeups, args=(read_end,),
                                  name="torch-distributed-sigterm", daemon=True)
        self._wakeup = (read_end, write_end, reader)
        reader.start()

    def _read_wakeups(self, read_end: socket.socket) -> None:
        while True:
            try:
                signums = read_end.recv(64)
            except OSError:
                return
            if not signums or 0 in signums:  # closed, or told to stop (_give_back_wakeup_fd)
                return
            if signal.SIGTERM in signums and self.installed:
                PREEMPTED.set()
                self.on_preempt()
            if ASK_SIGNAL in signums and self.asking and self.on_stacks is not None:
                self.on_stacks()

    def _give_back_wakeup_fd(self) -> None:
        if self._wakeup is None:
            return
        read_end, write_end, reader = self._wakeup
        self._wakeup = None
        current = signal.set_wakeup_fd(-1)
        if current != write_end.fileno():  # replaced meanwhile (asyncio, ...): theirs stays
            signal.set_wakeup_fd(current)
        try:
            write_end.send(b"\0")
        except OSError:
            pass
        reader.join(timeout=1.0)
        read_end.close()
        write_end.close()


def forward(members: Iterable[Member]) -> None:
    """SIGTERM to each running member's process (not its group: a rank's own children, e.g.
    DataLoader workers, are its business)."""
    for member in members:
        if member.poll() is None:
            try:
                os.kill(member.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
