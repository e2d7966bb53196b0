"""Where every rank stands, and whether the gang still moves: hang detection that needs no
timeout from the user, and every rank's stack in the report.

Each rank runs a probe (`Probe`), a daemon thread started with its body. Every `interval`
seconds it writes, atomically, into its node's work dir what it sees of its own process:

- how many collectives its process groups have run: the sum of every group's sequence number,
  which torch's c10d keeps for each backend (gloo and NCCL alike), so a DDP backward's bucket
  all-reduces, a subgroup's collectives and a Lightning strategy's count too;
- its main thread's Python stack, and whether that thread is inside torch.distributed (a
  collective, a barrier, the rendezvous) or autograd (DDP's reducer runs collectives there).

The probe needs no signal and no change to user code. A rank that holds Python's lock in native
code cannot run its probe: its file ages, which is said in the report.

Each node's watch reads its ranks' files (`NodeProgress`) and times, with its own clock, how long
each rank's collective count has not moved; node agents send that to node 0 through the store.
Node 0 decides (`verdict`, pure): the gang is hung when no rank's count moved for `hang_timeout`
seconds while at least one rank waits in a collective. A rank that is slow but still reaches its
collectives moves the counts, so it is not a hang; ranks busy without collectives, with no one
waiting, are not either. The straggler named first is the rank that is not waiting (it never
reached the collective), else the one behind on collectives, else the one waiting elsewhere;
the report shows one stack for each place where ranks stand, the straggler's first.

On demand: a SIGUSR1 to the task (its pid is on every line of Metaflow's log) has every rank of
every node print all its threads' Python stacks into the log, without stopping anything. Each
rank registers Python's `faulthandler` on DUMP_SIGNAL when its body starts; faulthandler writes
from its C-level signal handler, so a rank blocked in native code (a collective) or holding
Python's lock dumps too. Node 0 signals its own ranks and asks the other nodes through the
store; each agent signals its ranks (see `dump`).

Each rank's collective history: where torch keeps a Flight Recorder for the group's backend
(gloo from torch 2.9, NCCL), a probe whose rank has issued no collective for half the hang
timeout adds the rank's last collectives to its sample (`flight_recorder`: op, group, sequence
number, sizes, completed or not), so the hang report says which collective each rank is in.
Where torch keeps none, the report says so.
"""

import contextlib
import faulthandler
import json
import os
import pickle  # noqa: S403 - torch's Flight Recorder dump of this very process
import signal
import sys
import threading
import time
import zlib
from collections import Counter
from types import FrameType
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, Sequence, Tuple, TypedDict, Union, cast)

from ..core.failures import PACKAGE_DIR

if TYPE_CHECKING:  # control imports Report from here: a cycle
    from ..runtime.control import ControlPlane

# Seconds between two samples of a probe: hang_timeout / SAMPLES_PER_TIMEOUT, within bounds.
SAMPLES_PER_TIMEOUT = 20
MIN_INTERVAL = 0.5
MAX_INTERVAL = 5.0
# Frames kept of a stack (innermost first); deeper ones are cut.
MAX_FRAMES = 40
# A rank's last collectives a sample keeps from torch's Flight Recorder (oldest first).
HISTORY_SHOWN = 3


# The signal a rank dumps all its threads' stacks on (faulthandler): a real-time signal of its
# own, so that no user's or framework's use of SIGUSR1/SIGUSR2 is disturbed (Lightning takes
# SIGUSR1 under SLURM). The user asks with SIGUSR1 to the task (preempt.SupervisorHandler).
# Its default action ends a process, so every process of the gang ignores it until its body
# registers (ignoring_dumps): a rank asked while it starts or ends lets it pass.
DUMP_SIGNAL = signal.SIGRTMIN + 1

# A frame of a stack: (file, line or None, function).
Frame = Tuple[str, Optional[int], str]
# Where a locate(rank) puts a rank: (node, local rank).
Locate = Callable[[int], Tuple[int, int]]


class Report(TypedDict):
    """Where one rank stands, as its node reads it from its probe (NodeProgress.read) and
    node 0 gets it through the store."""

    quiet_s: float  # seconds its collective count has not moved
    seq: Optional[int]  # its collective count (None: no process group yet)
    waiting: Optional[str]  # the torch.distributed or autograd call it is in
    where: Optional[str]  # its innermost frame of user code
    stack: str  # formatted, outermost first
    age_s: float  # seconds since its probe last wrote
    done: bool  # its body ended
    # its last collectives (torch's Flight Recorder), or why there are none; None: not read
    # (it issued a collective within half the hang timeout)
    history: Union[List["Collective"], str, None]
    # what the rank tells the live card (events.RankLog.live: progress, scalars), or None
    live: Optional[Dict[str, Any]]


class Collective(TypedDict):
    """One collective of a rank's Flight Recorder."""

    op: str  # "all_reduce"
    group: str  # "default_pg", or the group's name
    seq: int  # its number in its group
    sizes: str  # "Float[4, 3]": the input tensors' dtypes and shapes
    done: bool  # completed


def interval_for(hang_timeout: float) -> float:
    return min(max(hang_timeout / SAMPLES_PER_TIMEOUT, MIN_INTERVAL), MAX_INTERVAL)


def history_after(hang_timeout: float) -> int:
    """After how many samples in a row with the same collective count a probe reads its rank's
    Flight Recorder (half the hang timeout's samples; again each time as many more pass): a read
    of a full buffer (torch keeps 2000 entries) costs about 45 ms, so a rank that trains never
    pays it."""
    return max(1, int(hang_timeout / interval_for(hang_timeout) / 2))


def probe_file(work_dir: str, rank: int) -> str:
    return os.path.join(work_dir, "probe-rank-%d.json" % rank)


# -- in a rank ------------------------------------------------------------------------------------

@contextlib.contextmanager
def ignoring_dumps() -> Iterator[None]:
    """While a supervising process (node 0's task, an agent) runs its gang, from its main
    thread: DUMP_SIGNAL is ignored there, and so in the members it starts (an ignored signal
    stays ignored through fork and exec), until a rank's body registers it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(DUMP_SIGNAL, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(DUMP_SIGNAL, previous if previous is not None else signal.SIG_DFL)


def register_dump() -> bool:
    """In a rank, as its body starts: DUMP_SIGNAL prints every thread's stack to its stderr
    (the rank's own lines of the log). Left alone where the signal has a handler already;
    True if registered (undo with unregister_dump: the signal is ignored again)."""
    if signal.getsignal(DUMP_SIGNAL) not in (signal.SIG_DFL, signal.SIG_IGN, None):
        return False
    try:
        # sys.__stderr__ may be None, which faulthandler takes (it writes to sys.stderr then,
        # or raises RuntimeError, caught below); typeshed's stub does not say so
        faulthandler.register(DUMP_SIGNAL, file=sys.__stderr__,  # type: ignore[arg-type]
                              all_threads=True, chain=False)
    except (ValueError, OSError, RuntimeError, AttributeError):  # no usable stderr
        return False
    return True


def unregister_dump() -> None:
    faulthandler.unregister(DUMP_SIGNAL)


def dump(pids: Iterable[int]) -> None:
    """Have the ranks of `pids` print their stacks (DUMP_SIGNAL); a rank gone is skipped."""
    for pid in pids:
        try:
            os.kill(pid, DUMP_SIGNAL)
        except (ProcessLookupError, PermissionError):
            pass


class OnDemand:
    """A node's side of stacks on demand: `ask` (node 0, on SIGUSR1 to its task) or `follow`
    (an agent, on a new count in the store) dumps its own ranks, at most once a second."""

    MIN_GAP_S = 1.0

    def __init__(self, say: Callable[[str], object], pids: Callable[[], Iterable[int]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.say = say  # prints one line to the log
        self.pids = pids  # the pids of this node's running ranks, when called
        self.clock = clock
        self._last: Optional[float] = None
        self._seen = 0
        self._lock = threading.Lock()

    def _dump(self, line: str) -> bool:
        with self._lock:
            now = self.clock()
            if self._last is not None and now - self._last < self.MIN_GAP_S:
                return False
            self._last = now
        self.say(line)
        dump(self.pids())
        return True

    def ask(self, control: Optional["ControlPlane"], step_name: str) -> None:
        """Node 0: dump its ranks and ask the other nodes (through `control`) for theirs."""
        if self._dump("@torch_distributed on step *%s*: every rank prints its threads' stacks "
                      "(asked with SIGUSR1); the gang goes on" % step_name) and control:
            self._seen += 1
            try:
                control.request_stacks(self._seen)
            except Exception:  # noqa: BLE001 - the store is going away: this node's are shown
                pass

    def follow(self, requested: int) -> None:
        """An agent: node 0's count of requests is `requested`; dump when it grew."""
        if requested > self._seen:
            self._seen = requested
            self._dump("node 0 asked for every rank's stacks: this node's ranks print theirs")




class Probe:
    """The thread that writes, every `interval` seconds, rank `rank`'s collective count and
    main-thread stack to `path` (what `NodeProgress` reads), and its last collectives once the
    count stood still for `history_after` samples."""

    def __init__(self, path: str, interval: float, rank: int, history_after: int,
                 live: Optional[Callable[[], Optional[Dict[str, Any]]]] = None) -> None:
        self.path = path
        self.interval = interval
        self.rank = rank
        self.history_after = history_after
        self.live = live  # what the rank tells the live card (events.live_of_rank)
        self._main = cast(int, threading.main_thread().ident)  # started, so never None
        self._fd: Optional[int] = None
        # the collective count of the last sample, and how many samples in a row had it
        self._seq: Optional[int] = None
        self._same = 0
        self._history: Union[List[Collective], str, None] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torch-distributed-probe",
                                        daemon=True)

    def start(self) -> "Probe":
        self._write(done=False)
        self._thread.start()
        return self

    def stop(self) -> None:
        """The body ended: say so last (a finished rank is never a straggler)."""
        self._stop.set()
        self._thread.join(timeout=self.interval + 1)
        self._write(done=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._write(done=False)

    def _write(self, done: bool) -> None:
        frame = sys._current_frames().get(self._main)
        seq = collective_count()
        sample: Dict[str, Any] = {"rank": self.rank, "at": time.time(), "seq": seq,
                                  "stack": stack_of(frame), "done": done}
        history = self._history_at(seq) if not done else None
        if history is not None:
            sample["history"] = history
        told = self._told()
        if told:
            sample["live"] = told
        with self._lock:  # the thread and stop() may both write
            try:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
                # in place, framed: one pwrite, no new file per sample (a rename costs ~10
                # times the sample); a reader that catches it half-written skips it
                os.pwrite(self._fd, frame_record(json.dumps(sample).encode()), 0)
                if done:
                    os.close(self._fd)
                    self._fd = None
            except OSError:  # the work dir is gone: the gang is tearing down
                pass


    def _told(self) -> Optional[Dict[str, Any]]:
        """What the rank tells the live card now; None if nothing (or it cannot be read: the
        card is a view, the probe's sample is the hang watch's)."""
        if self.live is None:
            return None
        try:
            return self.live()
        except Exception:  # noqa: BLE001 - see above
            return None

    def _history_at(self, seq: Optional[int]) -> Union[List[Collective], str, None]:
        """The rank's last collectives once its count `seq` stood still for `history_after`
        samples (read again each time as many more pass), else None."""
        if seq is None or seq != self._seq:
            self._seq, self._same, self._history = seq, 0, None
            return None
        self._same += 1
        if self._same % self.history_after == 0:
            self._history = flight_recorder(seq)
        return self._history


def flight_recorder(seq: int, last: int = HISTORY_SHOWN) -> Union[List[Collective], str]:
    """This process's `last` collectives from torch's Flight Recorder, oldest first ([] when
    it has run none: `seq`, its collective count, is 0), or why torch keeps none. Read from the
    probe's thread: torch's dump is made for that (its own watchdog reads it while a
    collective waits)."""
    torch = sys.modules.get("torch")
    dist = sys.modules.get("torch.distributed")
    try:
        backend = str(dist.get_backend()) if dist is not None else "?"
        c10d = sys.modules["torch._C._distributed_c10d"]
    except Exception:  # noqa: BLE001 - a probe never disturbs the rank
        return "no process group"
    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is None and "nccl" in backend:
        dump = getattr(c10d, "_dump_nccl_trace", None)
    version = getattr(torch, "__version__", "?")
    if dump is None:
        return "torch %s keeps no Flight Recorder for %s (torch 2.9 and later do)" % (
            version, backend)
    try:
        # torch's own record of this process, pickled by torch itself (never outside data);
        # without stack traces: the probe has the Python stack
        entries = pickle.loads(dump(True, False, False)).get("entries") or []
    except Exception as e:  # noqa: BLE001
        return "torch's Flight Recorder could not be read: %s" % e
    if not entries and seq:
        return ("torch's Flight Recorder is off (TORCH_FR_BUFFER_SIZE=%s)"
                % os.environ.get("TORCH_FR_BUFFER_SIZE", "0"))
    return [collective_of(e) for e in entries[-last:]]


def collective_of(entry: Mapping[str, Any]) -> Collective:
    """One Flight Recorder entry, as the report shows it."""
    op = str(entry.get("profiling_name") or "?").split(":", 1)[-1]
    name, desc = (list(entry.get("process_group") or ["?", "?"]) + ["?", "?"])[:2]
    group = desc if desc not in ("undefined", "", None) else "group %s" % name
    tensors = ["%s%s" % (dtype, list(size)) for dtype, size in
               zip(entry.get("input_dtypes") or [], entry.get("input_sizes") or [])]
    sizes = ", ".join(tensors) if len(tensors) <= 2 else "%s and %d more" % (
        ", ".join(tensors[:2]), len(tensors) - 2)
    done = bool(entry.get("retired")) or entry.get("state") == "completed"
    seq = entry.get("p2p_seq_id") if entry.get("is_p2p") else entry.get("collective_seq_id")
    return {"op": op, "group": str(group), "seq": int(seq or 0), "sizes": sizes[:80],
            "done": done}


def frame_record(payload: bytes) -> bytes:
    """`payload` with a header of its length and CRC-32, so a torn read is detected."""
    return b"%08x %08x\n" % (len(payload), zlib.crc32(payload)) + payload


def read_record(data: bytes) -> Optional[bytes]:
    """The payload of a record (frame_record) at the start of `data`, or None if torn."""
    header, _, rest = data.partition(b"\n")
    try:
        length, crc = (int(x, 16) for x in header.split(b" "))
    except ValueError:
        return None
    payload = rest[:length]
    return payload if len(payload) == length and zlib.crc32(payload) == crc else None


def collective_count() -> Optional[int]:
    """The sum of the sequence numbers of this process's process groups (collectives run), or
    None before the default group exists. Read from another thread than the one that runs
    them: a group being created or destroyed meanwhile reads as None this once."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        c10d = dist.distributed_c10d
        groups = list(getattr(getattr(c10d, "_world", None), "pg_map", None) or
                      [c10d._get_default_group()])
        return sum(int(g._get_sequence_number_for_group()) for g in groups)
    except Exception:  # noqa: BLE001 - a probe never disturbs the rank
        return None


def stack_of(frame: Optional[FrameType]) -> List[List[Union[str, int, None]]]:
    """[[file, line, function], ...] of `frame` and its callers, innermost first."""
    frames: List[List[Union[str, int, None]]] = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        frames.append([code.co_filename, frame.f_lineno, code.co_name])
        frame = frame.f_back
    return frames


# -- on each node: reading the probes -------------------------------------------------------------


class NodeProgress:
    """A node's view of its ranks' probes in `work_dir`: per rank, how long its collective count
    has not moved, by this node's `clock`."""

    def __init__(self, work_dir: str, ranks: Iterable[int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.work_dir = work_dir
        self.ranks = list(ranks)
        self.clock = clock
        # rank -> (collective count, when it was first seen at that count)
        self._seen: Dict[int, Tuple[Optional[int], float]] = {}

    def read(self) -> Dict[int, Report]:
        """{rank: report} of every rank whose probe wrote: `quiet_s` (seconds its collective
        count has not moved), `seq`, `waiting` (the torch.distributed or autograd call its main
        thread is in, or None), `where` (its innermost frame of user code), `stack` (formatted,
        outermost first), `age_s` (since its probe last wrote), `done`."""
        now = self.clock()
        reports: Dict[int, Report] = {}
        for rank in self.ranks:
            try:
                with open(probe_file(self.work_dir, rank), "rb") as f:
                    payload = read_record(f.read())
                sample = json.loads(payload) if payload is not None else None
            except (OSError, ValueError):
                sample = None
            if sample is None:
                continue  # not written yet, or caught half-written: the next read has it
            seq = sample.get("seq")
            seen = self._seen.get(rank)
            if seen is None or (seq is not None and seq != seen[0]):
                seen = self._seen[rank] = (seq, now)
            reports[rank] = report_of(sample, now - seen[1])
        return reports


def report_of(sample: Mapping[str, Any], quiet_s: float) -> Report:
    frames: List[Frame] = [tuple(f) for f in sample.get("stack") or []]
    return {"quiet_s": round(quiet_s, 3), "seq": sample.get("seq"),
            "waiting": waiting_call(frames), "where": user_frame(frames),
            "stack": format_stack(frames), "age_s": round(max(0.0, time.time() - sample["at"]), 3),
            "done": bool(sample.get("done")), "history": sample.get("history"),
            "live": sample.get("live")}


def _in_torch(filename: str, part: Optional[str] = None) -> bool:
    """True when `filename` is torch's code (under `part`, e.g. "distributed", if given)."""
    inside = os.sep + "torch" + os.sep + (part + os.sep if part else "")
    return inside in filename


def waiting_call(frames: Iterable[Frame]) -> Optional[str]:
    """The torch.distributed (or autograd) function the user's code called that this stack is
    inside, e.g. "all_reduce" or "backward"; None when it is in neither. Frames are innermost
    first; the call named is the outermost such frame (the API the user called), skipping
    torch's logging wrappers."""
    call: Optional[str] = None
    for filename, _, name in frames:
        if _in_torch(filename, "distributed") or _in_torch(filename, "autograd"):
            if name not in ("wrapper", "_wrapper", "inner") and not name.startswith("<"):
                call = name
        elif call is not None and not _in_torch(filename):
            break  # back in the user's code: the call stands
    return call


def user_frame(frames: Iterable[Frame]) -> Optional[str]:
    """'file.py:42 in train' of the innermost frame outside torch and this package, or None."""
    package = os.path.join(PACKAGE_DIR, "")
    for filename, line, name in frames:
        if _in_torch(filename) or filename.startswith(package) or filename.startswith("<"):
            continue
        if os.sep + "threading.py" in filename:
            continue
        return "%s:%s in %s" % (os.path.basename(filename), _line(line), name)
    return None


def _line(line: Optional[int]) -> str:
    """A frame's line number as text: a frame between two lines (Python 3.11+ sets f_lineno to
    None on instructions that belong to no line) has none, shown as `?`."""
    return "?" if line is None else "%d" % line


def format_stack(frames: Sequence[Frame]) -> str:
    """The stack as a traceback shows it (most recent call last), from the step's code on:
    the frames of Metaflow and of this package that lead to the step's body are left out."""
    outermost_first = list(reversed(frames))
    runner_dirs = [os.path.join(PACKAGE_DIR, "")]
    metaflow_file = getattr(sys.modules.get("metaflow"), "__file__", None)
    if metaflow_file:
        runner_dirs.append(os.path.join(os.path.dirname(os.path.abspath(metaflow_file)), ""))
    start, in_runner = 0, False
    for i, (filename, _, _) in enumerate(outermost_first):
        runner = any(filename.startswith(d) for d in runner_dirs)
        if in_runner and not runner:
            start = i  # the first frame of the step's own code
            break
        in_runner = in_runner or runner
    shown = outermost_first[start:]
    return "\n".join('  File "%s", line %s, in %s' % (f, _line(line), name)
                     for f, line, name in shown)


# -- on node 0: the verdict ------------------------------------------------------------------------


def verdict(reports: Mapping[int, Report], world_size: int, hang_timeout: float,
            locate: Locate) -> Optional[Tuple[int, str]]:
    """(straggler rank, report text) when the gang is hung, else None. `reports` {rank: report}
    for the ranks of every node (NodeProgress.read, merged); `locate(rank)` gives (node, local
    rank). Pure. No verdict while a rank has not reported or any rank finished its body (the
    finish timeout covers the rest), nor while a rank's collective count is unknown: before
    its process group exists (torch's own init timeout covers the rendezvous), or on a
    backend that keeps no sequence numbers (a gang that trains would then look still)."""
    if len(reports) < world_size or any(r["done"] for r in reports.values()):
        return None
    if any(r["seq"] is None for r in reports.values()):
        return None
    quiet = min(r["quiet_s"] for r in reports.values())
    waiting = sorted(rank for rank, r in reports.items() if r["waiting"])
    if quiet < hang_timeout or not waiting:
        return None
    stragglers = _stragglers(reports)
    groups = _groups(reports, stragglers)
    first = stragglers[0] if stragglers else waiting[0]
    lines: List[str] = []
    for ranks, where in groups:
        lines.append("  %s: %s" % (_ranks_text(ranks, locate), where))
    text = ("made no progress: for %ds no collective completed on any rank while %s %s "
            "(hang_timeout=%ss). Where each rank stands, %s:\n%s"
            % (quiet, _ranks_text(waiting, None), "waits" if len(waiting) == 1 else "wait",
               _num(hang_timeout),
               "the odd one out first" if stragglers else "every rank in the same call",
               "\n".join(lines)))
    stale = sorted(r for r, rep in reports.items() if rep["age_s"] > max(10.0, hang_timeout / 2))
    if stale:
        text += ("\n(%s: no sample for %ds; it holds Python's lock in native code, or is "
                 "stopped: the stack shown is its last)" % (
                     _ranks_text(stale, None), max(reports[r]["age_s"] for r in stale)))
    for ranks, _ in groups:  # one stack per place, the straggler's first
        shown = first if first in ranks else ranks[0]
        stack = reports[shown]["stack"]
        if not stack:
            continue
        if len(ranks) == 1:
            text += "\nRank %d's stack (most recent call last):\n%s" % (shown, stack)
        else:
            text += "\n%s's stack (rank %d's, most recent call last):\n%s" % (
                _ranks_text(ranks, None).capitalize(), shown, stack)
    text += history_text(reports, locate)
    text += ("\nA rank that legitimately works alone this long (saving, evaluating, "
             "downloading while the others wait in a collective): raise hang_timeout, or set "
             "it to 0 to turn hang detection off.")
    return first, text


def history_text(reports: Mapping[int, Report], locate: Optional[Locate]) -> str:
    """The report's part on each rank's last collectives (torch's Flight Recorder), ranks with
    the same history on one line; "" when no rank's was read."""
    by_history: Dict[str, List[int]] = {}
    for rank in sorted(reports):
        history = reports[rank].get("history")
        if history is None:
            continue
        if isinstance(history, str):
            line = "none: %s" % history
        elif not history:
            line = "none yet"
        else:
            line = "; ".join(_collective_text(c) for c in history)
        by_history.setdefault(line, []).append(rank)
    if not by_history:
        return ""
    lines = ["  %s: %s" % (_ranks_text(ranks, locate), line)
             for line, ranks in sorted(by_history.items(), key=lambda item: item[1][0])]
    return ("\nEach rank's last collectives (torch's Flight Recorder, oldest first; #n is the "
            "collective's number in its group):\n" + "\n".join(lines))


def _collective_text(c: Collective) -> str:
    return "%s #%d on %s (%s) %s" % (c["op"], c["seq"], c["group"], c["sizes"] or "no tensor",
                                      "completed" if c["done"] else "NOT COMPLETED")


def _stragglers(reports: Mapping[int, Report]) -> List[int]:
    """The ranks the others wait for: those not in a collective; else the ones behind on
    collectives; else the ones in another call than most."""
    not_waiting = sorted(r for r, rep in reports.items() if not rep["waiting"])
    if not_waiting:
        return not_waiting
    counts = {r: rep["seq"] for r, rep in reports.items() if rep["seq"] is not None}
    if counts and len(set(counts.values())) > 1:
        lowest = min(counts.values())
        return sorted(r for r, c in counts.items() if c == lowest)
    calls = Counter(rep["waiting"] for rep in reports.values())
    if len(calls) > 1:
        common = calls.most_common(1)[0][0]
        return sorted(r for r, rep in reports.items() if rep["waiting"] != common)
    return []


def _groups(reports: Mapping[int, Report],
            stragglers: Sequence[int]) -> List[Tuple[List[int], str]]:
    """[(ranks, where they stand)], the stragglers first, then the others by place."""
    def place(rep: Report) -> str:
        at = rep["where"] or "no frame of the step's code"
        if rep["waiting"]:
            return "%s, called from %s" % (rep["waiting"], at)
        return "at %s, not in a collective" % at

    by_place: Dict[str, List[int]] = {}
    for rank in sorted(reports):
        by_place.setdefault(place(reports[rank]), []).append(rank)
    groups = sorted(by_place.items(), key=lambda item: (
        not any(r in stragglers for r in item[1]), item[1][0]))
    return [(ranks, where) for where, ranks in groups]


def _ranks_text(ranks: Iterable[int], locate: Optional[Locate]) -> str:
    ranks = list(ranks)
    word = "rank" if len(ranks) == 1 else "ranks"
    text = "%s %s" % (word, ", ".join(map(str, ranks)))
    if locate is not None:
        nodes = sorted({locate(r)[0] for r in ranks})
        text += " (node%s %s)" % ("" if len(nodes) == 1 else "s", ", ".join(map(str, nodes)))
    return text


def _num(seconds: float) -> str:
    return ("%g" % seconds)
