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
"""

import os
import signal
import socket
import threading

# What a user sends the task to have every rank print its stacks (stacks.py: on demand).
ASK_SIGNAL = signal.SIGUSR1

# Set in every process of the gang once it is preempted (current.torch_distributed.preempted).
PREEMPTED = threading.Event()


def mark_file(work_dir):
    return os.path.join(work_dir, "preempted")


def leave_mark(work_dir):
    try:
        with open(mark_file(work_dir), "w"):
            pass
    except OSError:  # the work dir is gone: the gang is tearing down
        pass


def install_rank_handler(work_dir):
    """In a rank other than node 0's rank 0, from its main thread: a SIGTERM with the mark
    sets PREEMPTED; one without ends the rank (the gang's stop). None if SIGTERM already has
    a handler of someone else's (it stays)."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def on_sigterm(signum, frame):
        if os.path.exists(mark_file(work_dir)):
            PREEMPTED.set()
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
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

    def __init__(self, on_preempt, on_stacks=None):
        self.on_preempt = on_preempt
        # called on ASK_SIGNAL (SIGUSR1): every rank prints its stacks (stacks.OnDemand)
        self.on_stacks = on_stacks
        self.installed = False
        self.asking = False  # ours is ASK_SIGNAL's handler
        self._wakeup = None  # (read end, write end, reader thread) while ours is the wakeup fd

    def _handler(self, signum, frame):
        PREEMPTED.set()  # rank 0's body may look at once; the watch's thread does the rest
        self.on_preempt()

    def _ask_handler(self, signum, frame):
        if not self._wakeup_is_ours():  # else the reader thread acted on it as it came
            self.on_stacks()

    def _wakeup_is_ours(self):
        """(Main thread.) Whether the wakeup fd is still ours: rank 0's code may have set its
        own meanwhile (asyncio), and then only the Python handler hears the signal."""
        if self._wakeup is None:
            return False
        ours = self._wakeup[1].fileno()
        current = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
        if current != ours:
            signal.set_wakeup_fd(current)
        return current == ours

    def __enter__(self):
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
        return self

    def __exit__(self, *exc):
        self._give_back_wakeup_fd()
        if self.installed and signal.getsignal(signal.SIGTERM) == self._handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.asking and signal.getsignal(ASK_SIGNAL) == self._ask_handler:
            signal.signal(ASK_SIGNAL, signal.SIG_DFL)
        return False

    def _take_wakeup_fd(self):
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

    def _read_wakeups(self, read_end):
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
            if ASK_SIGNAL in signums and self.asking:
                self.on_stacks()

    def _give_back_wakeup_fd(self):
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


def forward(members):
    """SIGTERM to each running member's process (not its group: a rank's own children, e.g.
    DataLoader workers, are its business)."""
    for member in members:
        if member.poll() is None:
            try:
                os.kill(member.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
