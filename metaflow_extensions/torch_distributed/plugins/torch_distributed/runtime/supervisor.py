"""All-or-nothing supervision of one node's share of a gang.

One thread polls every member process of this node and the control plane. Node 0 runs a
`LeaderWatch` (it also watches the other nodes, their check-ins and heartbeats, and how long
rank 0 and the others run on after one side finished); every other node runs an `AgentWatch`
(it sends heartbeats, says which of its ranks finished, and stops when node 0 aborts).

A watch moves through these phases (`Phase`), and only forward:

    WATCHING --a cause (a rank's own error, exit, signal; a node lost or missing)--> FAILED
    WATCHING --a symptom (a peer's communication error)--> HOLDING
    HOLDING  --a cause, or the wait for one ended--> FAILED
    WATCHING --every process and node finished--> FINISHED
    WATCHING or HOLDING --node 0 aborted (agents only)--> ABORTED

In HOLDING the symptoms are held for SYMPTOM_WAIT seconds so that the failure behind them, which
may come from another node, is named as the cause; when every symptom is a timeout, nodes that
have not said which of their ranks still run get up to TIMEOUT_SKEW_WAIT seconds more, and the
rank still running without an error is named as hung. Entering FAILED or ABORTED records every
failure of the outcome at once, then calls `on_failure` once; the caller stops the rest.
"""

import enum
import re
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import (Callable, Collection, Dict, Iterable, List, Mapping, Optional, Protocol,
                    Sequence, Set, Tuple, TypeVar, Union)

from ..core import failures as F
from ..core.stragglers import Finding, Window
from ..core.topology import Topology
from ..runtime import oom, stacks
from ..runtime.control import ControlPlane
from ..runtime.floodwatch import FloodWatch
from ..runtime.procs import ExitWaiter, Member
from ..runtime.stacks import NodeProgress, OnDemand, Report

POLL_INTERVAL = 0.05
# Seconds to wait for the root cause once only symptoms (communication errors) are known.
SYMPTOM_WAIT = 1.0
# Seconds more to wait, when only timeouts are known, for every node to say which ranks run.
TIMEOUT_SKEW_WAIT = 5.0
# A peer's error that says it gave up waiting (gloo, the store, NCCL's watchdog).
_TIMEOUT_HINT = re.compile(r"time[sd]? ?out|timed out|Timeout", re.I)
# Seconds between two heartbeats of a node agent.
HEARTBEAT_INTERVAL = 1.0
# Seconds between two full looks at the other side's messages in the store, whatever its news
# key says (control.NODES_NEWS, LEADER_NEWS), and (node 0) between two readings of every
# node's heartbeats. Between full looks a watch reads one news key a poll, so that what each
# poll asks of node 0's store does not grow with the number of nodes; a news token a
# forger reverted delays a message by at most this.
FULL_LOOK_INTERVAL = 1.0


def _num(seconds: float) -> str:
    return "%g" % seconds


class Phase(enum.Enum):
    WATCHING = "watching"  # nothing has failed
    HOLDING = "holding"  # only symptoms are known: waiting for their cause
    FAILED = "failed"  # settled: `failures` holds the outcome
    FINISHED = "finished"  # every watched process and node finished
    ABORTED = "aborted"  # (an agent) node 0 aborted the gang


@dataclass
class Slot:
    """A member process and where it sits in the gang. `rank` is None for a node agent."""

    member: Member
    node: int
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    error_file: Optional[str] = None


@dataclass
class Place:
    """Where an expected check-in comes from: a node (rank None) or one rank."""

    node: int
    rank: Optional[int] = None
    local_rank: Optional[int] = None


class GangAborted(Exception):
    """Node 0 aborted the gang (seen by a node agent)."""


# Errors of the watch's own code, not of the store or the network it talks to.
_INTERNAL_ERRORS = (TypeError, AttributeError, NameError, AssertionError)


class OnPreempt(Protocol):
    """What a SIGTERM to node `origin` makes the gang do (`at`: when it came, if known)."""

    def __call__(self, origin: int, at: Optional[float] = None) -> object: ...


# (rank, node, local rank) of a rank that may still run
Running = Tuple[int, int, Optional[int]]

_W = TypeVar("_W", bound="Watch")


class Watch:
    """What every node's watch does: poll this node's `slots`, settle a failure (holding
    symptoms for their cause), and end in one phase. Subclasses add what their node watches."""

    def __init__(self, slots: Iterable[Slot], control: ControlPlane, topology: Topology,
                 on_failure: Optional[Callable[[F.Failure], object]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.slots = list(slots)
        self.control = control
        self.topology = topology
        self.on_failure = on_failure
        self.clock = clock
        self.phase = Phase.WATCHING
        self.failures: List[F.Failure] = []
        self.finished = threading.Event()  # set on leaving WATCHING/HOLDING
        self._lock = threading.Lock()
        self._held: List[F.Failure] = []  # symptoms seen while HOLDING
        self._hold_until: Optional[float] = None
        self._seen_slots: Set[int] = set()  # ids of slots whose failure is already recorded
        self._seen_nodes: Set[int] = set()  # nodes whose reported failure is already recorded
        self._polling = False  # the thread polls (or a test drives poll_once)
        # a preemption (preempt.py): (node whose SIGTERM it was, when), and until when the
        # ranks may save; every failure meanwhile is held, the preemption is the outcome
        self.preempted: Optional[Tuple[int, float]] = None
        self._preempt_until: Optional[float] = None
        # when a SIGTERM reached this node's supervising process
        self._sigterm_at: Optional[float] = None
        # what a SIGTERM makes the gang do (the leader's and agent's)
        self.on_preempt: Optional[OnPreempt] = None
        self._oom = oom.OomWatch()  # this node's cgroup: was a SIGKILL the OOM killer's?
        self._thread = threading.Thread(target=self._run, name="torch-distributed-supervisor",
                                        daemon=True)

    def sigterm(self) -> None:
        """Called from this process's SIGTERM handler: the thread acts on it (on_preempt) at
        its next poll, so that the handler itself does nothing but note it. The first one
        counts (preempt.SupervisorHandler may note the same signal twice)."""
        if self._sigterm_at is None:
            self._sigterm_at = time.time()

    @property
    def sigterm_at(self) -> Optional[float]:
        """When a SIGTERM reached this node's supervising process (None: none did)."""
        return self._sigterm_at

    def _told_to_stop(self) -> bool:
        """A SIGTERM reached this process and the thread has not acted on it yet: whatever
        fails meanwhile (a framework's handler in rank 0 raising its SIGTERMException) is what
        the preemption made happen, held with the rest once the thread preempts the gang."""
        return self._sigterm_at is not None and self.on_preempt is not None

    def start(self: _W) -> _W:
        self.begin()
        self._thread.start()
        return self

    def begin(self: _W) -> _W:
        """Mark the watch as polling without its thread, for a caller that drives poll_once
        itself (tests, with an injected clock)."""
        with self._lock:
            self._polling = True
        return self

    @property
    def aborted(self) -> bool:
        return self.phase is Phase.ABORTED

    def failed(self) -> bool:
        with self._lock:
            return bool(self.failures)

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self.finished.wait(timeout)

    def join(self, timeout: Optional[float] = None) -> None:
        """Until the thread has left (after the watch ended, once `on_failure` returned)."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def preempt(self, node: int, grace: float, at: Optional[float] = None) -> None:
        """The gang was preempted (a SIGTERM to node `node`): hold every failure for `grace`
        seconds, or until every process ended, then fail with the preemption as the cause."""
        with self._lock:
            if self.preempted is None and not self.finished.is_set():
                self.preempted = (node, time.time() if at is None else at)
                self._preempt_until = self.clock() + grace
                self._preempt_grace = grace

    def preemption_failure(self) -> F.Failure:
        assert self.preempted is not None  # asked once preempted (poll_once)
        node, at = self.preempted
        return F.Failure(
            None, node, F.FailureKind.PREEMPTED, at,
            message="was preempted (SIGTERM to node %d): every rank of every node was sent "
            "SIGTERM and given %ss (preempt_grace) to save before what still ran was stopped. "
            "A checkpoint saved meanwhile is the one the next attempt (@retry) loads"
            % (node, _num(self._preempt_grace)))

    def report(self, failure: F.Failure) -> None:
        """Record a failure seen outside the thread (rank 0's exception in the main thread).
        A symptom joins the thread's wait for a root cause while the thread polls; it is never
        lost: the watch cannot end as FINISHED while it holds one (_finish), and once the watch
        has ended any report is recorded at once. While preempted, every failure is held."""
        with self._lock:
            held = ((failure.is_symptom() or self.preempted is not None or self._told_to_stop())
                    and not self.failures and self._polling and not self.finished.is_set())
            if held:
                self._hold(failure)
        if not held:
            self._fail(failure)

    def running_ranks(self) -> List[int]:
        """Ranks of this node whose process still runs and has not failed (a rank that raised
        may still be tearing down)."""
        return [s.rank for s in self._running_slots()
                if s.rank is not None and id(s) not in self._seen_slots]

    def _running_slots(self) -> List[Slot]:
        """This node's rank slots whose process still runs."""
        return [s for s in self.slots if s.rank is not None and s.member.poll() is None]

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        exits = ExitWaiter()
        try:
            while not self.poll_once():
                exits.wait([s.member for s in self.slots], POLL_INTERVAL)
        except GangAborted:
            self._fail(F.Failure(None, -1, F.FailureKind.ABORTED, time.time(),
                                 message="gang aborted by node 0"),
                       phase=Phase.ABORTED)
        except _INTERNAL_ERRORS as ex:  # a bug of ours: never reported as the network's
            self._fail(F.Failure(None, -1, F.FailureKind.CONTROL, time.time(), message=(
                "stopped watching the gang on an error of the package's own (please report it "
                "with this traceback): %s: %s\n%s" % (type(ex).__name__, ex,
                                                       traceback.format_exc().rstrip()))))
        except Exception as ex:  # the store is gone: node 0 died or the network broke
            self._fail(F.Failure(None, -1, F.FailureKind.CONTROL, time.time(),
                                 message="lost the gang's control plane: %s" % ex))
        finally:
            exits.close()
            with self._lock:
                self._polling = False

    def poll_once(self) -> bool:
        """One look at everything this watch watches; True once the watch has ended."""
        if self.finished.is_set():
            return True
        self._tick()
        failure = self._check()
        if failure is not None and self._settle(failure):
            return True
        if self.preempted is not None and self._preempt_until is not None and (
                self.clock() >= self._preempt_until or self._all_ended()):
            with self._lock:
                held = list(self._held)
            self._fail(self.preemption_failure(), *held)
            return True
        if (self.phase is Phase.HOLDING and self._hold_until is not None
                and self.clock() >= self._hold_until):
            if not self._waiting_for_timeouts():
                self._flush()  # no root cause came: report the symptoms
                return True
        return self._all_done() and self._finish()

    def _tick(self) -> None:
        """What this node does on every poll besides watching (an agent's heartbeat)."""

    def _finish(self) -> bool:
        """Every watched process and node finished: True once the watch ended. A symptom held
        while waiting for its cause is then the outcome, as nothing else can come: the watch
        fails with it rather than finish (a rank 0 whose collective failed after its peers
        left the body)."""
        if self.preempted is not None:
            return False  # a preempted gang never finishes: poll_once fails it
        with self._lock:
            held = bool(self._held)
            if not held:
                self.phase = Phase.FINISHED
                self.finished.set()
        if held:
            self._flush()
        return True

    def _all_ended(self) -> bool:
        """Every process this watch watches has ended (a preempted gang is then settled)."""
        return all(s.member.poll() is not None for s in self.slots)

    def _check(self) -> Optional[F.Failure]:
        """The next failure of this node's processes, or None."""
        now = time.time()
        for slot in self.slots:
            if id(slot) in self._seen_slots:
                continue
            code = slot.member.poll()
            if code is None and slot.rank is not None and slot.local_rank is not None:
                # A rank fails when it raises, not when its process is gone: tearing down
                # (DataLoader workers, a child that ignores SIGTERM) can take seconds.
                failure = F.raised(slot.rank, slot.node, slot.local_rank, slot.error_file)
                if failure is not None:
                    self._seen_slots.add(id(slot))
                    return failure
            if code in (None, 0):
                continue
            self._seen_slots.add(id(slot))
            if slot.rank is None:
                self._seen_nodes.add(slot.node)
                reported = self.control.failure(slot.node)
                return reported or F.Failure(
                    None, slot.node, F.FailureKind.AGENT, now, code,
                    message="node agent exited with code %d before reporting a cause" % code)
            failure = F.from_exit(slot.rank, slot.node, slot.local_rank, code, now,
                                  slot.error_file)
            if failure.kind is F.FailureKind.SIGNAL and code == -signal.SIGKILL:
                failure.message = self._oom.evidence() or ""
            return failure
        return None

    def _all_done(self) -> bool:
        return all(s.member.poll() == 0 for s in self.slots)

    # -- settling a failure --------------------------------------------------------------------

    def _settle(self, failure: F.Failure) -> bool:
        """Record `failure`; True once the gang's failure is settled and reported. A rank that
        failed because a peer went away (a communication error) is a symptom: hold it for
        SYMPTOM_WAIT seconds, so that the peer's own failure, which may come from another node
        through its agent, is there to be named as the root cause."""
        with self._lock:
            self._hold(failure)
        if self.preempted is not None:
            return False  # held with the rest until the preemption is settled (poll_once)
        if failure.is_symptom():
            self._holding(failure)
            return False
        self._flush()
        return True

    def _hold(self, failure: F.Failure) -> None:
        """(Under the lock.) Keep `failure` for the settled outcome; a symptom starts HOLDING."""
        self._held.append(failure)
        if failure.is_symptom() and self.phase is Phase.WATCHING:
            self.phase = Phase.HOLDING
            self._hold_until = self.clock() + SYMPTOM_WAIT

    def _holding(self, symptom: F.Failure) -> None:
        """Called when a symptom of this node is held (an agent tells node 0 who still runs)."""

    def _flush(self) -> None:
        with self._lock:
            seen = list(self._held)
        if seen and all(f.is_symptom() for f in seen):
            hung = self._hung_rank(seen)
            if hung is not None:
                seen.append(hung)
        self._fail(*seen)

    def _fail(self, *failures: F.Failure, phase: Phase = Phase.FAILED) -> None:
        """Record `failures` together. The first call ends the watch in `phase`, then calls
        `on_failure` (which may take a while to stop members): whoever `wait`s sees every
        failure settled with the first, such as the hung rank named beside its peers'
        timeouts, never a part."""
        with self._lock:
            first = not self.failures
            self.failures.extend(failures)
            if first:
                self.phase = phase
        if first:
            self.finished.set()
            if self.on_failure:
                self.on_failure(failures[0])

    def _waiting_for_timeouts(self) -> bool:
        """Ranks that wait for a hung peer time out one by one, as they started (other nodes
        start later): while only timeouts are known, give nodes that have not said which of
        their ranks still run up to TIMEOUT_SKEW_WAIT more seconds to say it."""
        with self._lock:
            symptoms = list(self._held)
        if not symptoms or not all(_TIMEOUT_HINT.search(f.message) for f in symptoms):
            return False
        if self._hold_until is None or self.clock() >= self._hold_until + TIMEOUT_SKEW_WAIT:
            return False
        return bool(self._silent_nodes())

    def _silent_nodes(self) -> List[int]:
        """Unfinished nodes that neither reported a failure nor said which ranks still run."""
        return []

    def _remote_running(self) -> List[Running]:
        """[(rank, node, local rank)] of other nodes' ranks that may still run."""
        return []

    def _hung_rank(self, symptoms: Sequence[F.Failure]) -> Optional[F.Failure]:
        """When every failure so far is a symptom and some are peers' timeouts (the others:
        connections that closed as those peers gave up and left), the rank still running
        without an error is the one the others waited for: name it (None if there is none)."""
        if not any(_TIMEOUT_HINT.search(f.message) for f in symptoms):
            return None
        failed = {f.rank for f in symptoms}
        running: List[Running] = [(s.rank, s.node, s.local_rank) for s in self._running_slots()
                                  if s.rank is not None]
        running = running + self._remote_running()
        running = [r for r in running if r[0] not in failed]
        if not running:
            return None
        rank, node, local_rank = running[0]
        hung = F.Failure(
            rank, node, F.FailureKind.HUNG, time.time(), local_rank=local_rank,
            message="hung: it neither failed nor finished while the other ranks timed out "
            "waiting for it (%s). Its [rank %d] lines show where it was; see the debugging "
            "guide to dump its stack next time" % (symptoms[0].where(), rank))
        seen = self._probe_reports().get(rank)
        if seen and seen["stack"]:
            hung.message = hung.message.split("; see the debugging guide")[0] + (
                ". Its stack as its probe last saw it (most recent call last):\n%s"
                % seen["stack"])
        return hung

    def _probe_reports(self) -> Dict[int, Report]:
        """What the probes of this node's ranks say now ({} without probes). The watch that
        names a hung rank is the one that saw its peers time out first: node 0's, or the
        agent's of the node where they ran, which reads its own ranks' probes."""
        progress = getattr(self, "progress", None)
        if progress is None:
            return {}
        try:
            return progress.read()
        except Exception:  # noqa: BLE001 - the work dir may be going: no stack then
            return {}


class LeaderWatch(Watch):
    """Node 0's watch: its own members (and, locally, the other nodes' agents) in `slots`; the
    other nodes `watch_nodes` through the control plane; the check-ins `expected_joins`
    ({join id: Place}) until `join_timeout` s; with `heartbeat_timeout`, that every node that
    started beating keeps beating; with `leader_slot` (rank 0's process, one of `slots`), that
    rank 0 and the others do not run on more than `finish_timeout` s after the other side
    finished.
    `on_assembled` is called once, when the last expected check-in arrived (from the watch's
    thread), or by `start` when none is expected; never after the watch ended."""

    def __init__(self, slots: Iterable[Slot], control: ControlPlane, topology: Topology,
                 watch_nodes: Collection[int] = (),
                 expected_joins: Optional[Mapping[str, Place]] = None,
                 join_timeout: Optional[float] = None, heartbeat_timeout: Optional[float] = None,
                 finish_timeout: Optional[float] = None,
                 on_failure: Optional[Callable[[F.Failure], object]] = None,
                 on_assembled: Optional[Callable[[], object]] = None,
                 clock: Callable[[], float] = time.monotonic,
                 progress: Optional[NodeProgress] = None, hang_timeout: Optional[float] = None,
                 on_preempt: Optional[OnPreempt] = None, leader_slot: Optional[Slot] = None,
                 agents_stay: bool = False, flood: Optional[FloodWatch] = None,
                 stragglers: Optional[Window] = None,
                 on_straggler: Optional[Callable[[Finding], object]] = None) -> None:
        super().__init__(slots, control, topology, on_failure, clock)
        # straggler detection (core/stragglers.py): a look of the whole gang per hang check;
        # `on_straggler` is called with a Finding whose straggler changed
        self.stragglers = stragglers
        self.on_straggler = on_straggler
        # the store's keys and node 0's memory, once a full look (floodwatch.py)
        self.flood = flood
        self._next_flood_check = clock()
        # with restarts in place a local node's agent outlives its node's round (it waits
        # for node 0's word): a node that finished is done, its agent still running
        self.agents_stay = agents_stay
        self.leader_slot = leader_slot
        self.leader_ended = threading.Event()  # rank 0's process (leader_slot) has ended
        self.on_preempt = on_preempt
        self.on_assembled = on_assembled
        # hang detection (stacks.py): this node's ranks' probes, the other nodes' through the
        # store; a verdict at most once per probe interval
        self.progress = progress
        self.hang_timeout = hang_timeout
        self._next_hang_check = clock()
        self._last_reports: Dict[int, Report] = {}  # {rank: stacks report} as last read
        # (when, by the watch's clock, {rank: report}) of the last read: the live card's
        self.live_reports: Tuple[float, Dict[int, Report]] = (clock(), {})
        self.assembled = threading.Event()
        self.join_timeout = join_timeout
        self.join_deadline = clock() + join_timeout if join_timeout is not None else None
        self.heartbeat_timeout = heartbeat_timeout
        self.finish_timeout = finish_timeout
        self._pending_joins = dict(expected_joins or {})
        self._nodes_left = set(watch_nodes)
        self._watched = set(watch_nodes)
        # node -> (heartbeats seen, when the count last changed)
        self._beats: Dict[int, Tuple[int, float]] = {}
        # node -> its heartbeats when a restarted round was first looked at
        self._beats_before: Dict[int, int] = {}
        self._others_done_at: Optional[float] = None
        self._news = _News(lambda: self.control.nodes_news(), clock)
        self._next_beats = clock()  # when every node's heartbeats are read next
        self._overdue = Overdue()  # a node's progress behind what its heartbeats say

    def start(self) -> "LeaderWatch":
        if not self._pending_joins:
            self._assemble()
        return super().start()

    def _leader_busy(self) -> bool:
        """Whether rank 0's process (leader_slot) still runs."""
        return self.leader_slot is not None and self.leader_slot.member.poll() is None

    def wait_for_leader(self) -> None:
        """Until rank 0's process (leader_slot) ended or the watch did."""
        while not (self.leader_ended.wait(POLL_INTERVAL) or self.finished.is_set()):
            pass

    def _tick(self) -> None:
        if self.leader_slot is not None and not self._leader_busy():
            self.leader_ended.set()

    def _assemble(self) -> None:
        if self.assembled.is_set():
            return
        self.assembled.set()
        if self.on_assembled is not None:
            self.on_assembled()

    def unfinished_failure(self, waited: float) -> F.Failure:
        """The failure to report when rank 0 finished its body `waited` seconds ago and some
        ranks or nodes still have not finished theirs. Ranks of other nodes are named from
        what their agents reported done."""
        places: List[Union[Slot, Place]] = list(self._running_slots())
        nodes = sorted({s.node for s in self.slots if s.rank is None and s.member.poll() is None}
                       | self._nodes_left)
        for node in nodes:
            places += [Place(node, r, self.topology.locate(r)[1])
                       for r in self.topology.ranks_of(node)
                       if not self.control.rank_is_done(r)] or [Place(node)]
        places = places or [Place(0)]
        first = places[0]
        return F.Failure(
            first.rank, first.node, F.FailureKind.UNFINISHED, time.time(),
            local_rank=first.local_rank,
            message="did not finish its step body within %ss after rank 0 finished its own "
            "(still running: %s). A rank that hangs (e.g. in a collective the others never "
            "join, or in code only some ranks run) is stopped; raise finish_timeout if "
            "ranks legitimately finish later than rank 0"
            % (waited, "; ".join(_member_name(p, self.topology) for p in places)))

    def _finish(self) -> bool:
        if not self._leader_busy():
            return super()._finish()
        failure = self._check_leader_finishes()
        if failure is None:
            return False
        self._fail(failure)
        return True

    def _check(self) -> Optional[F.Failure]:
        if self.preempted is None and self.on_preempt is not None and self._told_to_stop():
            # the task itself got it: preempted before this poll's failures are settled, which
            # are then held for the grace (a rank that ended meanwhile is the SIGTERM's doing)
            self.on_preempt(0, self._sigterm_at)
        failure = super()._check()
        if failure is not None:
            return failure
        now = time.time()
        flooded = self._check_flood(now)
        if flooded is not None:
            return flooded
        look = bool(self._watched or self._pending_joins) and self._news.look()
        beats = self.heartbeat_timeout is not None and self.clock() >= self._next_beats
        if beats and self.heartbeat_timeout is not None:
            # nodes beat once a second: read as often, or twice a timeout if that is shorter
            self._next_beats = self.clock() + min(HEARTBEAT_INTERVAL, self.heartbeat_timeout / 2)
        for node in list(self._nodes_left):
            if look:
                reported = None if node in self._seen_nodes else self.control.failure(node)
                if reported is not None:
                    self._seen_nodes.add(node)
                    return reported
                if self.control.finished(node):
                    self._nodes_left.discard(node)
                    continue
            if beats:
                lost = self._check_heartbeat(node, now)
                if lost is not None:
                    return lost
        # the rendezvous timeout is not put off by a quiet store: at its deadline, look
        past_deadline = self.join_deadline is not None and self.clock() >= self.join_deadline
        joins = self._check_joins(now) if look or past_deadline else None
        if joins is not None:
            return joins
        if look and self.preempted is None and self.on_preempt is not None:
            for node in self._other_nodes():
                if self.control.node_preempted(node):
                    self.on_preempt(node)  # the whole gang: Leader._preempt_gang
                    break
        if self.preempted is not None:
            return None  # no hang verdict while the ranks save
        return self._check_hang(now)

    def _check_hang(self, now: float) -> Optional[F.Failure]:
        if self.progress is None or not self.hang_timeout or self.clock() < self._next_hang_check:
            return None
        self._next_hang_check = self.clock() + stacks.interval_for(self.hang_timeout)
        if self._pending_joins:
            return None  # not every member is there yet: the join deadline's business
        reports = self.progress.read()
        for node in self._other_nodes():
            reports.update(self.control.progress(node))
            tampered = self._check_progress_arrives(node, now)
            if tampered is not None:
                return tampered
        self._last_reports = reports
        self.live_reports = (self.clock(), dict(reports))
        self._look_for_straggler(reports)
        found = stacks.verdict(reports, self.topology.world_size, self.hang_timeout,
                               self.topology.locate)
        if found is None:
            return None
        rank, text = found
        node, local_rank = self.topology.locate(rank)
        return F.Failure(rank, node, F.FailureKind.HUNG, now, local_rank=local_rank,
                         message=text)

    def _look_for_straggler(self, reports: Mapping[int, Report]) -> None:
        """Add one look of the gang (every rank reported, in a process group, none done) to
        the straggler window, and tell `on_straggler` when the straggler changed."""
        if self.stragglers is None or len(reports) < self.topology.world_size:
            return
        if any(r["done"] or r["seq"] is None for r in reports.values()):
            return
        changed = self.stragglers.add(self.clock(),
                                      {rank: bool(r["waiting"]) for rank, r in reports.items()})
        if changed is not None and self.on_straggler is not None:
            self.on_straggler(changed)

    def _check_flood(self, now: float) -> Optional[F.Failure]:
        if self.flood is None or self.clock() < self._next_flood_check:
            return None
        self._next_flood_check = self.clock() + FULL_LOOK_INTERVAL
        what = self.flood.check()
        if what is None:
            return None
        return F.Failure(None, 0, F.FailureKind.TAMPERED, now, message=FloodWatch.message(what))

    def _check_progress_arrives(self, node: int, now: float) -> Optional[F.Failure]:
        """(Just after node `node`'s progress was read.) A failure when its progress has been
        behind what its heartbeats say it sent for half the hang timeout (and so the hang
        verdict would run on stale reports): someone deletes it, or puts an older one back
        (ControlPlane's counts). The wait lets a one-off deletion pass (the node's next
        progress replaces it within a probe interval); a deletion in a loop fails the gang
        within about hang_timeout / 2 + a heartbeat interval + a probe interval."""
        assert self.hang_timeout  # _check_hang looks only then
        seen, claimed = self.control.progress_number(node), self.control.progress_claimed(node)
        behind = self._overdue.behind(("progress", node), seen, claimed, self.clock())
        if behind is None or behind < self.hang_timeout / 2:
            return None
        return self._tampered(node, "progress", now, seen, claimed, behind)

    def _tampered(self, node: int, message: str, now: float, seen: int, claimed: int,
                  behind: float) -> F.Failure:
        """The failure of node `node` whose `message` ("heartbeat" or "progress") stopped
        reaching node 0 while its agent kept sending it."""
        key = self.control.key_of(message, node)
        other = "progress" if message == "heartbeat" else "heartbeat"
        how = ("was deleted (node 0 read #%d at most)" % seen if key in self.control.deleted
               else "held #%d at most" % seen)
        return F.Failure(
            None, node, F.FailureKind.TAMPERED, now,
            message="keeps sending its %s, but it stopped reaching node 0 %ss ago: the gang's "
            "store is being tampered with. Its %s says it sent %s #%d; key %s %s. A process "
            "outside the gang deletes or rewrites the gang's keys in the store at "
            "MASTER_ADDR:MASTER_PORT: find what else reaches that port (docs/security.md)"
            % (message, _num(round(behind)), other, message, claimed, key, how))

    def _all_done(self) -> bool:
        """Every process and node finished, but rank 0's process (leader_slot), which may still
        run: _finish times it against finish_timeout."""
        return not self._nodes_left and not self._pending_joins and all(
            s.member.poll() == 0 for s in self.slots if s is not self.leader_slot
            and not (self.agents_stay and s.rank is None and s.member.poll() is None)
        ) and (self.leader_slot is None or self.leader_slot.member.poll() in (None, 0))

    def _all_ended(self) -> bool:
        nodes_left = [n for n in self._nodes_left if self.control.failure(n) is None]
        return not nodes_left and super()._all_ended()

    def _check_leader_finishes(self) -> Optional[F.Failure]:
        assert self.finish_timeout is not None  # given with a leader_slot
        if self._others_done_at is None:
            self._others_done_at = self.clock()
        if self.clock() - self._others_done_at < self.finish_timeout:
            return None
        return F.Failure(
            0, 0, F.FailureKind.UNFINISHED, time.time(), local_rank=0,
            message="did not finish its step body within %ss after every other rank finished "
            "its own. A rank 0 that hangs (e.g. in a collective the others never join, or in "
            "code only rank 0 runs) is stopped; raise finish_timeout if it legitimately runs "
            "longer" % self.finish_timeout)

    def _check_joins(self, now: float) -> Optional[F.Failure]:
        if not self._pending_joins:
            return None
        for join_id in list(self._pending_joins):
            if self.control.joined(join_id):
                del self._pending_joins[join_id]
        if not self._pending_joins:
            if not self.finished.is_set():  # a gang that already failed is not assembled
                self._assemble()
            return None
        assert self.join_deadline is not None  # expected joins come with their join_timeout
        if self.clock() < self.join_deadline:
            return None
        missing = sorted(self._pending_joins.values(), key=lambda s: s.node)
        first = missing[0]
        names = "; ".join(_member_name(s, self.topology) for s in missing)
        return F.Failure(
            first.rank, first.node, F.FailureKind.MISSING, now, local_rank=first.local_rank,
            message="did not join the gang within the rendezvous timeout of %ss. Missing: %s. "
            "Check that every node can start (image, capacity) and reach node 0, or raise "
            "rendezvous_timeout." % (self.join_timeout, names))

    def _check_heartbeat(self, node: int, now: float) -> Optional[F.Failure]:
        assert self.heartbeat_timeout is not None  # _check looks only then
        count = self.control.beats(node)
        # the count a restarted round (restarts in place) began with: a node's agent does not
        # beat between rounds, while it loads the round's checkpoint and starts its ranks
        before = self._beats_before.setdefault(node, count) if getattr(
            self.control, "round", 0) else 0
        if count == before and self._joining(node):
            self._beats.pop(node, None)
            return None  # not started (this round) yet: the join deadline covers it
        seen = self._beats.get(node)
        if seen is None or count != seen[0]:
            # the clock of a node that joined but never beat starts when its join was seen
            self._beats[node] = (count, self.clock())
            return None
        if self.clock() - seen[1] < self.heartbeat_timeout:
            return None  # still beating
        claimed = self.control.beats_claimed(node)
        if count < claimed or self.control.key_of("heartbeat", node) in self.control.deleted:
            # its progress says it kept beating, or its heartbeat was there and is gone: a
            # dead node's heartbeat stays as it last wrote it
            return self._tampered(node, "heartbeat", now, count, max(claimed, count),
                                  self.clock() - seen[1])
        return F.Failure(
            None, node, F.FailureKind.LOST, now,
            message="stopped sending heartbeats %ss ago: %s or its container died, hangs, or "
            "cannot reach node 0 any more. Its own log (and the instance's) tells why."
            % (self.heartbeat_timeout, _member_name(Place(node), self.topology)))

    def _joining(self, node: int) -> bool:
        """True while node 0 still waits for `node` to join (a join it does not expect, as in
        a watch of nodes alone, counts as joined)."""
        return any(p.node == node and p.rank is None for p in self._pending_joins.values())

    def _probe_reports(self) -> Dict[int, Report]:
        """Every node's probes: this node's and what the others last published, read now, not
        at the last hang check (the last reading stands where the store is going)."""
        if self.progress is not None and self.hang_timeout:
            try:
                fresh = self.progress.read()
                for node in self._other_nodes():
                    fresh.update(self.control.progress(node))
                self._last_reports.update(fresh)
            except Exception:  # noqa: BLE001 - the store may be going: the last reading stands
                pass
        return self._last_reports

    def _other_nodes(self) -> List[int]:
        """Every other node: the ones watched through the store, and local agents."""
        return sorted({s.node for s in self.slots if s.rank is None} | self._watched)

    def _silent_nodes(self) -> List[int]:
        return [n for n in self._other_nodes()
                if (n in self._nodes_left or n not in self._watched)
                and not self.control.running(n) and self.control.failure(n) is None]

    def _remote_running(self) -> List[Running]:
        running: List[Running] = []
        for node in self._other_nodes():
            running += [(r, node, self.topology.locate(r)[1]) for r in self.control.running(node)]
        for node in self._silent_nodes():  # no word from these: any of their ranks may be it
            running += [(r, node, self.topology.locate(r)[1])
                        for r in self.topology.ranks_of(node)]
        return running


class AgentWatch(Watch):
    """The watch of node `node` (not node 0): it beats, tells node 0 which of its ranks
    finished and, on a symptom, which still run, and ends when node 0 aborts the gang."""

    def __init__(self, slots: Iterable[Slot], control: ControlPlane, topology: Topology,
                 node: int, on_failure: Optional[Callable[[F.Failure], object]] = None,
                 clock: Callable[[], float] = time.monotonic,
                 progress: Optional[NodeProgress] = None,
                 progress_interval: Optional[float] = None,
                 on_preempt: Optional[OnPreempt] = None,
                 stacks: Optional[OnDemand] = None) -> None:
        super().__init__(slots, control, topology, on_failure, clock)
        self.node = node
        self.on_preempt = on_preempt
        self.stacks = stacks  # stacks.OnDemand: node 0's requests for every rank's stacks
        self._next_beat = clock()
        self._reported_done: Set[int] = set()
        # where this node's ranks stand (stacks.NodeProgress), sent to node 0 this often
        self.progress = progress
        self.progress_interval = progress_interval
        self._next_progress = clock()
        self._news = _News(lambda: self.control.leader_news(), clock)

    def _tick(self) -> None:
        for slot in self.slots:
            if (slot.rank is not None and slot.rank not in self._reported_done
                    and slot.member.poll() == 0):
                self.control.rank_finished(slot.rank)
                self._reported_done.add(slot.rank)
        if self.clock() >= self._next_beat:
            self.control.beat(self.node)
            self._next_beat = self.clock() + HEARTBEAT_INTERVAL
            if self.stacks is not None:  # as often as it beats: one read a second
                self.stacks.follow(self.control.stacks_requested())
        if self.progress is not None and self.clock() >= self._next_progress:
            assert self.progress_interval is not None  # given with progress
            self._next_progress = self.clock() + self.progress_interval
            reports = self.progress.read()
            if reports:
                self.control.send_progress(self.node, reports)

    def _check(self) -> Optional[F.Failure]:
        failure = super()._check()
        look = self._news.look()
        if failure is None and look and self.control.aborted():
            raise GangAborted()
        if self.preempted is None and self.on_preempt is not None and (
                self._sigterm_at or look):
            if self.control.gang_preempted():
                self.on_preempt(0)  # node 0 preempted the gang: this node's ranks hear it
            elif self._sigterm_at and self.control.aborted():
                raise GangAborted()  # node 0 stops the gang (a local agent's SIGTERM)
            elif self._sigterm_at:
                self.on_preempt(self.node, self._sigterm_at)  # this node's own SIGTERM
        return failure

    def _holding(self, symptom: F.Failure) -> None:
        self.control.report_running(self.node, self.running_ranks())


class Overdue:
    """Since when node 0 has seen less of a node's message than the node says it sent
    (ControlPlane: a heartbeat carries the count of progress sent, progress the count of
    heartbeats). `behind` is given what was seen and what is claimed, each time the message
    was read: the seconds node 0 has been behind a claim it has not caught up with since, or
    None when it is not behind. Catching up with the claim it fell behind first resets it, so
    a sender that keeps sending never looks behind for long, and a message that never arrives
    does however often it is sent."""

    def __init__(self) -> None:
        self._since: Dict[Tuple[str, int], Tuple[int, float]] = {}

    def behind(self, what: Tuple[str, int], seen: int, claimed: int,
               now: float) -> Optional[float]:
        held = self._since.get(what)
        if held is not None and seen >= held[0]:
            del self._since[what]
            held = None
        if held is None:
            if claimed <= seen:
                return None
            held = self._since[what] = (claimed, now)
        return now - held[1]


class _News:
    """When a watch looks at the other side's messages: when the news token (`read()`, the
    control plane's nodes_news or leader_news) changed since the last look, or the last full
    look is FULL_LOOK_INTERVAL s old. The token is read before the messages: one sent after
    the reading changes the token again, and the next poll looks."""

    def __init__(self, read: Callable[[], bytes], clock: Callable[[], float]) -> None:
        self.read = read
        self.clock = clock
        self.seen: Optional[bytes] = None
        self.next_full = clock()

    def look(self) -> bool:
        token = self.read()
        if token == self.seen and self.clock() < self.next_full:
            return False
        self.seen = token
        self.next_full = self.clock() + FULL_LOOK_INTERVAL
        return True


def _member_name(slot: Union[Slot, Place], topology: Topology) -> str:
    if slot.rank is None:
        ranks = list(topology.ranks_of(slot.node))
        return "node %d (ranks %d-%d)" % (slot.node, ranks[0], ranks[-1])
    return "rank %d (node %d)" % (slot.rank, slot.node)
