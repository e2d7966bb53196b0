"""Starting, watching and stopping the processes of one node: forked or exec'd members, and
the pump that carries their output, line by line and rank-prefixed, into the task's own.

The rules of forking a loaded Metaflow task (design.md, "Starting members"): no thread is
started before a fork, each child writes to its own pipes, and a child leaves with os._exit so
that no atexit handler or artifact save of the parent runs in it.
"""

import atexit
import ctypes
import dataclasses
import functools
import gc
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence,
                    Tuple, Union)

from ..core.failures import communication_error, report_exception, save_exception
from ..runtime.storewarnings import StoreWarnings

_PR_SET_PDEATHSIG = 1
# A line rewritten in place with \r (a progress bar: tqdm, Lightning, Accelerate) is shown as
# its latest state once it has been rewritten for this long, then at most this often, and once
# more when it ends: never held back until its newline, never written as one line of every state.
PROGRESS_INTERVAL = 5.0


# The signals a supervising process (node 0's task, a node agent) handles for itself while its
# gang runs: a preemption (SIGTERM), @timeout's alarm, a request for stacks (SIGUSR1), Ctrl-C.
SUPERVISOR_SIGNALS = (signal.SIGTERM, signal.SIGALRM, signal.SIGUSR1, signal.SIGINT)


@dataclasses.dataclass(frozen=True)
class SignalSetup:
    """How a process handled SUPERVISOR_SIGNALS, and its wakeup fd, before it supervised a gang:
    what every member it forks starts with, in every round. A rank forked for a restart in
    place, while the supervisor's own handlers are installed, would otherwise run them (a stop's
    SIGTERM taken for a preemption, rank 0 never unwinding) and write its signals to the
    supervisor's wakeup fd, where the supervisor would take them for its own."""
    handlers: Mapping[int, Any]  # signal -> handler (signal.getsignal), None: not from Python
    wakeup_fd: Optional[int]  # None: not read (not the main thread)

    @classmethod
    def of_this_process(cls) -> "SignalSetup":
        wakeup: Optional[int] = None
        if _in_main_thread():
            wakeup = signal.set_wakeup_fd(-1)
            if wakeup != -1:
                signal.set_wakeup_fd(wakeup)
        return cls({signum: signal.getsignal(signum) for signum in SUPERVISOR_SIGNALS}, wakeup)

    def restore(self) -> None:
        """In a forked child (its one thread) whose SUPERVISOR_SIGNALS are blocked."""
        for signum, handler in self.handlers.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if self.wakeup_fd is not None:
            signal.set_wakeup_fd(self.wakeup_fd)


def _in_main_thread() -> bool:
    """Whether this is the main thread, the one thread that may set signal handlers."""
    return threading.current_thread() is threading.main_thread()


def freeze_preloaded() -> None:
    """Keep every object this process holds now (torch, Metaflow, the flow: loaded once, in the
    task, for the members it forks) out of Python's cyclic garbage collector from here on, in
    this process and in every member it forks (gc.freeze, as Python's documentation advises
    before forking workers). A forked rank's collections then never write to those objects'
    pages, so its members share them with the task instead of copying them, and the task's
    exit skips collecting them: with torch loaded that collection took 0.35 s of every gang
    step's end. What is frozen lives as long as the process in any case (modules, the flow)."""
    gc.freeze()


def die_with_parent(parent_pid: int) -> None:
    """Linux: ask the kernel to SIGKILL this process when the thread that started it exits, so
    a crashed or killed task never leaves members behind. If the parent already died between
    the fork and this call, leave at once."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


class Member:
    """A process of the gang started by this process, in a process group of its own."""

    def __init__(self, label: str, pid: int, stdout_fd: Optional[int], stderr_fd: Optional[int],
                 popen: Optional["subprocess.Popen[bytes]"] = None,
                 exit_file: Optional[str] = None) -> None:
        self.label = label
        self.pid = pid
        # its output's read ends; None when it writes to pipes of its caller's (fork_member)
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self.returncode: Optional[int] = None
        self._popen = popen
        # where a rank writes its exit status as it leaves (run_member_body): read when the
        # kernel or someone else reaped it first
        self.exit_file = exit_file

    def poll(self) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            # Reaped already: user code in this process ignores SIGCHLD (the kernel then
            # reaps every child) or reaps children itself. The status the member wrote as it
            # left tells; without one it was killed before it could write.
            self.returncode = _written_exit(self.exit_file)
        else:
            if not pid:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
        if self._popen is not None:
            self._popen.returncode = self.returncode  # Popen must not wait for it again
        return self.returncode

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


class ExitWaiter:
    """Sleeps between two looks of a watch, woken at once when a member it watches exits (a
    pidfd per member, Linux 5.3+): a rank's end is seen as it happens, not up to a poll
    interval later. Where pidfds are unavailable it sleeps the whole interval, as before."""

    def __init__(self) -> None:
        self._fds: Dict[int, int] = {}  # pid -> its pidfd
        self._usable = hasattr(os, "pidfd_open")

    def wait(self, members: Iterable[Member], timeout: float) -> None:
        """Until one of `members` that still runs exits, or `timeout` seconds passed."""
        running = {m.pid for m in members if m.poll() is None}
        for pid in [p for p in self._fds if p not in running]:
            os.close(self._fds.pop(pid))  # ended (reaped: its pidfd stays readable)
        if self._usable:
            for pid in running - set(self._fds):
                try:
                    self._fds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:  # gone between its poll and here: look again now
                    return
                except OSError:  # the kernel has no pidfds (ENOSYS), a sandbox refuses them
                    self._usable = False
                    break
        if not self._usable or not self._fds:
            time.sleep(timeout)
            return
        with selectors.DefaultSelector() as selector:
            for fd in self._fds.values():
                selector.register(fd, selectors.EVENT_READ)
            selector.select(timeout)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _reaped(pid: int) -> bool:
    """True once child `pid` has exited (reaped here, or already: SIGCHLD ignored)."""
    try:
        return bool(os.waitpid(pid, os.WNOHANG)[0])
    except ChildProcessError:
        return True


def exit_file_of(error_file: Optional[str]) -> Optional[str]:
    return None if not error_file else error_file + ".exit"


def _written_exit(path: Optional[str]) -> int:
    if path is None:
        return -signal.SIGKILL
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return -signal.SIGKILL


def fork_member(label: str, body: Callable[[], object], env: Mapping[str, str],
                remove_env: Iterable[str] = (), error_file: Optional[str] = None,
                close_fds: Iterable[int] = (), pipes: Optional[Tuple[int, int]] = None,
                signals: Optional[SignalSetup] = None) -> Member:
    """Fork this process; the child sets `env`, runs `body()` and exits with its status.
    Its output goes to new pipes, or to `pipes` (the write ends of its stdout and stderr, kept
    open by the caller for the next process of the same place: a restart in place), whose fds
    the caller lists in `close_fds` with every other fd the child must not keep. With
    `signals`, the child starts with that signal setup, not this process's current one (held
    back across the fork, so that none reaches a handler of this process's in the child)."""
    out_r: Optional[int]
    err_r: Optional[int]
    own: Tuple[int, ...]
    if pipes is None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        own = (out_r, err_r, out_w, err_w)
    else:
        (out_w, err_w), out_r, err_r, own = pipes, None, None, ()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    held = None if signals is None else \
        signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 1
        # the exit handlers the body registers run as it leaves, as in any process, but not the
        # parent's (Metaflow's, of the task)
        atexit._clear()
        try:
            if signals is not None and held is not None:  # held back since before the fork
                signals.restore()
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            os.setpgid(0, 0)
            die_with_parent(parent)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in {*own, *close_fds} - {1, 2}:
                os.close(fd)
            for key in remove_env:
                os.environ.pop(key, None)
            os.environ.update(env)
            apply_thread_count()
            code = run_member_body(body, error_file)
            atexit._run_exitfuncs()
            _flush_stdio()
        finally:
            os._exit(code)
    if held is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    if pipes is None:
        os.close(out_w)
        os.close(err_w)
    return Member(label, pid, out_r, err_r, exit_file=exit_file_of(error_file))


def apply_thread_count() -> None:
    """A forked member's torch keeps the intra-op thread count its parent's import read from
    the parent's environment (all the cores, by default); an exec'd one reads the member's
    OMP_NUM_THREADS as it imports torch. This gives the forked one the same."""
    torch = sys.modules.get("torch")
    value = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and value.isdigit() and int(value) > 0 \
            and torch.get_num_threads() != int(value):
        torch.set_num_threads(int(value))


def run_member_body(body: Callable[[], object], error_file: Optional[str]) -> int:
    """Run a member's step body; the exit status for it, with any exception in `error_file`."""
    code = 0
    try:
        body()
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
        if ex.code is not None and not isinstance(ex.code, int):
            print(ex.code, file=sys.stderr)
    except BaseException as ex:  # every failure of user code becomes the member's error
        raised_at = time.time()
        # The gang stops every rank the moment the first one fails: a rank that raised its own
        # error writes it down whole before that SIGTERM takes it (it is delivered right after;
        # SIGKILL, after the stop's grace, still ends a member that cannot write).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            report_exception(ex, communication_error(ex))
            record_error(ex, error_file)
            if error_file:  # last: from now on the gang counts this rank as failed
                save_exception(ex, raised_at, error_file)
            _flush_stdio()
            # The body is over: the stop's SIGTERM, held back until now, ends this process as
            # its default action does. The handler installed for the body would do otherwise:
            # rank 0's raises TorchDistributedAborted ("another rank of the gang failed"), a
            # second traceback after this rank's own error, from nowhere in the user's code.
            if _in_main_thread():
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        code = 1
    finally:
        _flush_stdio()
    _write_exit(exit_file_of(error_file), code)
    return code


def _write_exit(path: Optional[str], code: int) -> None:
    """The exit status, for a supervisor whose process had it reaped first (Member.poll)."""
    if not path:
        return
    try:
        with open(path, "w") as f:
            f.write(str(code))
    except OSError:
        pass


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def record_error(ex: BaseException, error_file: Optional[str]) -> None:
    """Write `ex` in torchelastic's error-file format (the one @record writes)."""
    if not error_file or os.path.exists(error_file):
        return  # @record in user code wrote it first: that one has the original traceback
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    previous = os.environ.get("TORCHELASTIC_ERROR_FILE")
    os.environ["TORCHELASTIC_ERROR_FILE"] = error_file
    try:
        ErrorHandler().record_exception(ex)
    finally:
        if previous is None:
            os.environ.pop("TORCHELASTIC_ERROR_FILE", None)
        else:
            os.environ["TORCHELASTIC_ERROR_FILE"] = previous


def spawn_member(label: str, argv: Sequence[str], env: Mapping[str, str],
                 cwd: Optional[str] = None, error_file: Optional[str] = None,
                 pipes: Optional[Tuple[int, int]] = None) -> Member:
    """Start `argv` as a member in a new process group, its output on new pipes, or on `pipes`
    (the write ends of its stdout and stderr, kept open by the caller for the next process of
    the same place: a restart in place). The child keeps no other fd of this process."""
    popen = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if pipes is None else pipes[0],
        stderr=subprocess.PIPE if pipes is None else pipes[1],
        start_new_session=True,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
    )
    if pipes is not None:
        return Member(label, popen.pid, None, None, popen, exit_file=exit_file_of(error_file))
    # The pump takes the pipes over: give it its own fds and let the Popen's file objects go,
    # so nothing closes the same fd number twice.
    assert popen.stdout is not None and popen.stderr is not None  # stdout=stderr=PIPE
    out_fd, err_fd = os.dup(popen.stdout.fileno()), os.dup(popen.stderr.fileno())
    popen.stdout.close()
    popen.stderr.close()
    popen.stdout = popen.stderr = None
    return Member(label, popen.pid, out_fd, err_fd, popen, exit_file=exit_file_of(error_file))


def stop_members(members: Sequence[Member],
                 grace: Union[float, Callable[[Member], float]]) -> List[str]:
    """SIGTERM every member's process group, then SIGKILL each that is left after its grace:
    `grace` seconds, or `grace(member)`. Returns the labels of the members that were still
    running."""
    running = [m for m in members if m.poll() is None]
    for m in running:
        m.signal_group(signal.SIGTERM)
    start = time.monotonic()
    deadlines = {id(m): start + (grace(m) if callable(grace) else grace) for m in members}
    pending = list(running)
    while pending:
        now = time.monotonic()
        for m in pending:
            if now >= deadlines[id(m)]:
                m.signal_group(signal.SIGKILL)  # its grace is over, whatever the others' are
        pending = [m for m in pending if m.poll() is None and now < deadlines[id(m)]]
        if pending:
            time.sleep(0.02)
    for m in members:
        # SIGKILL the group even if its leader is gone: its children (data loader workers,
        # a node's ranks) may still be alive.
        m.signal_group(signal.SIGKILL)
    for m in running:
        while m.poll() is None:
            time.sleep(0.01)
    return [m.label for m in running]


class Sink(Protocol):
    """Where a pump's writes also go (OutputPump's `tee`): called with the target fd and the
    bytes written to it, closed when the pump ends."""

    def __call__(self, target: int, data: bytes, /) -> None: ...

    def close(self) -> None: ...


# A Sink may also write on a clock of its own: `due()` says when next (time.monotonic(), or None
# for nothing to do), and the pump then calls `tick(now)` (events.TailKeeper).


class OutputPump:
    """Copies many pipes into target fds, prefixing each line, from a forked process of its own.

    Being a separate process, it keeps copying when any rank dies, rank 0's task included, so
    the last lines of a crashing rank are never lost: it leaves when every pipe reached end of
    file (all its writers exited). Complete lines are written with one os.write each, so lines
    of different ranks never mix; a last line without a newline is still written. A line that a
    progress bar rewrites with \r is written as its latest state every `progress_interval`
    seconds while it runs, and as its last state when it ends.

    `tee`, if given, is called in the pump process and returns a sink (a callable taking the
    target fd and the bytes written to it, with a `close()`), which also gets every write: a
    remote node ships its output to node 0 this way.
    """

    def __init__(self, tee: Optional[Callable[[], Sink]] = None,
                 progress_interval: Optional[float] = None) -> None:
        self._streams: List[Tuple[int, bytes, int]] = []  # (read fd, prefix bytes, target fd)
        self._tee = tee
        self._interval = PROGRESS_INTERVAL if progress_interval is None else progress_interval
        self._alive_w: Optional[int] = None
        self.pid: Optional[int] = None

    def add(self, fd: int, prefix: str, target_fd: int) -> None:
        self._streams.append((fd, prefix.encode() + b" " if prefix else b"", target_fd))

    def start(self, close_in_child: Iterable[int] = (),
              orphan_note: Union[str, Callable[[], str], None] = None) -> None:
        """Fork the pump; close `close_in_child` (e.g. write ends of pumped pipes) in it. If the
        process that started it dies before the pump is done (SIGKILL, the OOM killer), the
        pump writes `orphan_note` to stderr last, since that process can say nothing."""
        # The parent says "done" on this pipe before it lets go of the pump; end of file
        # without it means the parent died.
        alive_r, self._alive_w = os.pipe()
        # A stop of its parent's process group (node 0 stopping a local node's agent, a
        # scheduler's SIGTERM, a Ctrl-C) must not take the last lines with it: the pump ignores
        # both signals (held back across the fork, so that none lands before it does) and leaves
        # once every writer is gone, or when its parent's drain kills it.
        stops = {signal.SIGTERM, signal.SIGINT}
        held = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        try:
            self.pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            raise
        if self.pid == 0:
            code = 1
            try:
                for signum in stops:
                    signal.signal(signum, signal.SIG_IGN)
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                for fd in [*close_in_child, self._alive_w]:
                    os.close(fd)
                sink: Optional[Sink] = self._tee() if self._tee else None
                if orphan_note:
                    sink = _NoteOnOrphan(sink, alive_r, orphan_note)
                _pump(self._streams, sink, self._interval)
                code = 0
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(alive_r)
        for fd, _, _ in self._streams:
            os.close(fd)

    def parent_done(self) -> None:
        """Tell the pump that its parent ends normally (call before closing pumped pipes)."""
        if self._alive_w is not None:
            try:
                os.write(self._alive_w, b"1")
            except BrokenPipeError:
                pass  # the pump already left: there is no one to tell
            os.close(self._alive_w)
            self._alive_w = None

    def drain(self, timeout: float) -> bool:
        """Wait for the pump to copy what is left, at most `timeout` seconds."""
        self.parent_done()
        if self.pid is None:
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _reaped(self.pid):
                self.pid = None
                return True
            time.sleep(0.01)
        os.kill(self.pid, signal.SIGKILL)
        while not _reaped(self.pid):
            time.sleep(0.01)
        self.pid = None
        return False


class _NoteOnOrphan:
    """A pump sink that, at the end, says so if the pump's parent died instead of saying done."""

    def __init__(self, inner: Optional[Sink], alive_fd: int,
                 note: Union[str, Callable[[], str]]) -> None:
        self.inner = inner
        self.alive_fd = alive_fd
        self.note = note

    def __call__(self, target: int, data: bytes) -> None:
        if self.inner is not None:
            self.inner(target, data)

    def due(self) -> Optional[float]:
        inner_due = getattr(self.inner, "due", None)
        return inner_due() if inner_due is not None else None

    def tick(self, now: float) -> None:
        if hasattr(self.inner, "tick"):
            self.inner.tick(now)  # type: ignore[union-attr]  # checked just above

    def close(self) -> None:
        os.set_blocking(self.alive_fd, False)
        try:
            died = os.read(self.alive_fd, 1) == b""  # closed without a word
        except BlockingIOError:
            died = False  # the parent is still there
        if died:
            note = self.note() if callable(self.note) else self.note  # what is known now
            line = note.rstrip("\n").encode() + b"\n"
            _write_all(2, line)
            self(2, line)
        if self.inner is not None:
            self.inner.close()


class _Stream:
    """One pumped pipe: where its lines go, the line it has not finished, and, when that line
    is rewritten with \r, what of it was shown and since when it is waiting to be shown."""

    def __init__(self, prefix: bytes, target: int) -> None:
        self.prefix = prefix
        self.target = target
        self.pending = b""
        self.shown: Optional[bytes] = None  # the state of the current \r-line last written out
        # when the current \r-line began or was last written out
        self.since: Optional[float] = None
        # torch's store warnings, once per kind a minute (node 0's task hosts the store)
        self.warnings = StoreWarnings()

    def feed(self, chunk: bytes, now: float) -> bytes:
        """The bytes to write for `chunk`: its complete lines, a \r-line as its last state."""
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        lines, notes = self.warnings.lines(lines, now)
        out = [self.prefix + note + b"\n" for note in notes]
        for line in lines:
            if b"\r" in line:
                out.append(self._state_line(_last_state(line)))
                self.shown = self.since = None
            else:
                out.append(self.prefix + line + b"\n")
        if b"\r" in self.pending:
            self.pending = _latest(self.pending)
            if self.since is None:
                self.since = now
        return b"".join(out)

    def due(self, interval: float) -> Optional[float]:
        """When the \r-line in progress is next to be shown, or a note of torch's warnings
        dropped is due; None if neither."""
        dues = [d for d in (None if self.since is None else self.since + interval,
                            self.warnings.due()) if d is not None]
        return min(dues) if dues else None

    def snapshot(self, now: float, interval: float) -> bytes:
        """The \r-line in progress as its latest state, once it is due (after the notes of
        torch's warnings dropped, once due)."""
        notes = b"".join(self.prefix + n + b"\n" for n in self.warnings.notes(now))
        if self.since is None or now < self.since + interval:
            return notes
        self.since = now
        state = _last_state(self.pending)
        line = self._state_line(state)
        self.shown = state
        return notes + line

    def finish(self) -> bytes:
        """What is left when the pipe closed: a last line without its newline, and the notes
        of torch's warnings dropped."""
        notes = b"".join(self.prefix + n + b"\n"
                         for n in self.warnings.notes(0.0, final=True))
        if b"\r" in self.pending:
            return notes + self._state_line(_last_state(self.pending))
        return notes + (self.prefix + self.pending + b"\n" if self.pending else b"")

    def _state_line(self, state: bytes) -> bytes:
        if state == self.shown or not state.strip():
            return b""  # shown already, or a bar that cleared its line
        return self.prefix + state + b"\n"


def _last_state(line: bytes) -> bytes:
    """What a terminal would show last of a line rewritten with \r: its last non-empty part."""
    return next((part for part in reversed(line.split(b"\r")) if part), b"")


def _latest(pending: bytes) -> bytes:
    """An unfinished \r-line cut to its latest state (and any \r after it), so that what is
    kept stays small however long the bar runs."""
    end = len(pending.rstrip(b"\r"))
    start = pending.rfind(b"\r", 0, end)
    return pending[start:] if start > 0 else pending


def _pump(streams: Iterable[Tuple[int, bytes, int]], sink: Optional[Sink] = None,
          interval: float = PROGRESS_INTERVAL) -> None:
    def write(stream: _Stream, data: bytes) -> None:
        if data:
            _write_all(stream.target, data)
            if sink is not None:
                sink(stream.target, data)

    selector = selectors.DefaultSelector()
    open_streams: Dict[int, _Stream] = {}
    for fd, prefix, target in streams:
        stream = _Stream(prefix, target)
        selector.register(fd, selectors.EVENT_READ, stream)
        open_streams[fd] = stream
    # a sink that writes on a clock of its own (events.TailKeeper) says when, and is ticked
    sink_due = getattr(sink, "due", None)
    while open_streams:
        dues = [d for d in (s.due(interval) for s in open_streams.values()) if d is not None]
        if sink_due is not None and sink_due() is not None:
            dues.append(sink_due())
        timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
        for key, _ in selector.select(timeout):
            stream = key.data
            try:
                chunk = os.read(key.fd, 65536)
            except OSError:
                chunk = b""
            if chunk:
                write(stream, stream.feed(chunk, time.monotonic()))
                continue
            write(stream, stream.finish())
            selector.unregister(key.fd)
            del open_streams[key.fd]
        now = time.monotonic()
        for stream in open_streams.values():
            write(stream, stream.snapshot(now, interval))
        if sink_due is not None:
            sink.tick(now)  # type: ignore[union-attr]  # a sink with `due` has `tick`
    if sink is not None:
        sink.close()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            n = os.write(fd, data)
        except BrokenPipeError:
            return
        data = data[n:]
