"""All-or-nothing supervision of one node's share of a gang.

One thread polls every member process and the control plane. The first failure anywhere
(a rank's uncaught exception as soon as it is recorded, a rank's non-zero exit or signal, a
node's report, a node missing at the rendezvous deadline,
an abort from node 0) ends the watch and calls `on_failure` once; the caller stops the rest.
"""

import re
import threading
import time
from dataclasses import dataclass
from typing import Optional

from . import failures as F
from .procs import Member

POLL_INTERVAL = 0.05
# Seconds to wait for the root cause once only symptoms (communication errors) are known.
SYMPTOM_WAIT = 1.0
# Seconds more to wait, when only timeouts are known, for every node to say which ranks run.
TIMEOUT_SKEW_WAIT = 5.0
# A peer's error that says it gave up waiting (gloo, the store, NCCL's watchdog).
_TIMEOUT_HINT = re.compile(r"time[sd]? ?out|timed out|Timeout", re.I)
# Seconds between two heartbeats of a node agent.
HEARTBEAT_INTERVAL = 1.0


@dataclass
class Slot:
    """A member process and where it sits in the gang. `rank` is None for a node agent."""

    member: Member
    node: int
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    error_file: Optional[str] = None


class GangAborted(Exception):
    """Node 0 aborted the gang (seen by a node agent)."""


class Supervisor:
    """Watches `slots` (this node's processes); on node 0 also `watch_nodes` (the other nodes,
    through the control plane) and `expected_joins` ({join id: Slot-like place}) until the
    join deadline, and, with `heartbeat_timeout`, that every watched node that started beating
    keeps beating; on other nodes, with `watch_abort`, node 0's abort, and with `heartbeat_node`
    this node sends heartbeats."""

    def __init__(self, slots, control, topology, watch_nodes=(), expected_joins=None,
                 join_timeout=None, watch_abort=False, on_failure=None, clock=time.monotonic,
                 heartbeat_node=None, heartbeat_timeout=None, leader_busy=None,
                 finish_timeout=None):
        self.slots = list(slots)
        self.control = control
        self.topology = topology
        self.watch_abort = watch_abort
        self.join_timeout = join_timeout
        self.join_deadline = clock() + join_timeout if join_timeout is not None else None
        self.on_failure = on_failure
        self.clock = clock
        self.failures = []
        self.aborted = False
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self._pending_joins = dict(expected_joins or {})
        self._nodes_left = set(watch_nodes)
        self._watched = set(watch_nodes)
        self.heartbeat_node = heartbeat_node
        self.heartbeat_timeout = heartbeat_timeout
        self._next_beat = clock()
        self._beats = {}  # node -> (heartbeats seen, when the count last changed)
        # On node 0: rank 0's body still running (a callable), and how long it may run on
        # once every other rank finished.
        self.leader_busy = leader_busy
        self.finish_timeout = finish_timeout
        self._others_done_at = None
        self._reported_done = set()
        self._symptoms = []  # failures seen, held back while only symptoms are known
        self._symptom_deadline = None
        self._seen_slots = set()  # ids of slots whose failure is already recorded
        self._seen_nodes = set()  # nodes whose reported failure is already recorded
        self._thread = threading.Thread(target=self._run, name="torch-distributed-supervisor",
                                        daemon=True)

    def start(self):
        self._thread.start()
        return self

    def report(self, failure):
        """Record a failure seen outside the thread (rank 0's exception in the main thread).
        A symptom joins the thread's wait for a root cause while the thread runs."""
        with self._lock:
            held = (failure.is_symptom() and not self.failures and self._thread.is_alive()
                    and not self.finished.is_set())
            if held:
                self._symptoms.append(failure)
                if self._symptom_deadline is None:
                    self._symptom_deadline = self.clock() + SYMPTOM_WAIT
        if not held:
            self._fail(failure)

    def running_ranks(self):
        """Ranks of this node's slots whose process is still running and has not failed (a
        rank that raised may still be tearing down)."""
        return [s.rank for s in self.slots if s.rank is not None and s.member.poll() is None
                and id(s) not in self._seen_slots]

    def failed(self):
        with self._lock:
            return bool(self.failures)

    def wait(self, timeout=None):
        return self.finished.wait(timeout)

    def _fail(self, *failures):
        """Record `failures` together. The first call ends the watch, then calls `on_failure`
        (which may take a while to stop members): whoever `wait`s sees every failure settled
        with the first, such as the hung rank named beside its peers' timeouts, never a part."""
        with self._lock:
            first = not self.failures
            self.failures.extend(failures)
        if first:
            self.finished.set()
            if self.on_failure:
                self.on_failure(failures[0])

    def _run(self):
        try:
            while not self.finished.is_set():
                failure = self._check()
                if failure is not None and self._settle(failure):
                    return
                if self._symptom_deadline is not None and self.clock() >= self._symptom_deadline:
                    if not self._waiting_for_timeouts():
                        self._flush()  # no root cause came: report the symptoms
                        return
                if self._all_done():
                    if not (self.leader_busy and self.leader_busy()):
                        self.finished.set()
                        return
                    failure = self._check_leader_finishes()
                    if failure is not None:
                        self._fail(failure)
                        return
                time.sleep(POLL_INTERVAL)
        except GangAborted:
            self.aborted = True
            self._fail(F.Failure(None, -1, "aborted", time.time(), message="gang aborted by node 0"))
        except Exception as ex:  # the store is gone: node 0 died or the network broke
            self._fail(F.Failure(None, -1, "control", time.time(),
                                 message="lost the gang's control plane: %s" % ex))

    def _settle(self, failure):
        """Record `failure`; True once the gang's failure is settled and reported. A rank that
        failed because a peer went away (a communication error) is a symptom: keep watching for
        SYMPTOM_WAIT seconds, so that the peer's own failure, which may come from another node
        through its agent, is there to be named as the root cause."""
        with self._lock:
            self._symptoms.append(failure)
            if failure.is_symptom() and self._symptom_deadline is None:
                self._symptom_deadline = self.clock() + SYMPTOM_WAIT
        if failure.is_symptom():
            if self.heartbeat_node is not None:  # an agent: tell node 0 at once who still runs
                self.control.report_running(self.heartbeat_node, self.running_ranks())
            return False
        self._flush()
        return True

    def _flush(self):
        with self._lock:
            seen = list(self._symptoms)
        if seen and all(f.is_symptom() for f in seen):
            hung = self._hung_rank(seen)
            if hung is not None:
                seen.append(hung)
        self._fail(*seen)

    def _waiting_for_timeouts(self):
        """Ranks that wait for a hung peer time out one by one, as they started (other nodes
        start later): while only timeouts are known, give nodes that have not said which of
        their ranks still run up to TIMEOUT_SKEW_WAIT more seconds to say it."""
        with self._lock:
            symptoms = list(self._symptoms)
        if not symptoms or not all(_TIMEOUT_HINT.search(f.message) for f in symptoms):
            return False
        if self.clock() >= self._symptom_deadline + TIMEOUT_SKEW_WAIT:
            return False
        return bool(self._silent_nodes())

    def _silent_nodes(self):
        """Unfinished nodes that neither reported a failure nor said which ranks still run."""
        nodes = {s.node for s in self.slots if s.rank is None} | self._watched
        return [n for n in sorted(nodes) if (n in self._nodes_left or n not in self._watched)
                and not self.control.running(n) and self.control.failure(n) is None]

    def _hung_rank(self, symptoms):
        """When every failure so far is a peer's timeout, the rank still running without an
        error is the one the others waited for: name it (None if there is no such rank)."""
        if not all(_TIMEOUT_HINT.search(f.message) for f in symptoms):
            return None
        failed = {f.rank for f in symptoms}
        running = [(s.rank, s.node, s.local_rank) for s in self.slots
                   if s.rank is not None and s.member.poll() is None]
        if self.leader_busy and self.leader_busy():
            running.insert(0, (0, 0, 0))
        silent = self._silent_nodes()
        for node in sorted({s.node for s in self.slots if s.rank is None} | self._watched):
            running += [(r, node, self.topology.locate(r)[1]) for r in self.control.running(node)]
        for node in silent:  # no word from these: any of their ranks may be the one
            running += [(r, node, self.topology.locate(r)[1]) for r in self.topology.ranks_of(node)]
        running = [r for r in running if r[0] not in failed]
        if not running:
            return None
        rank, node, local_rank = running[0]
        return F.Failure(
            rank, node, "hung", time.time(), local_rank=local_rank,
            message="hung: it neither failed nor finished while the other ranks timed out "
            "waiting for it (%s). Its [rank %d] lines show where it was; see the debugging "
            "guide to dump its stack next time" % (symptoms[0].where(), rank))

    def _check_leader_finishes(self):
        if self._others_done_at is None:
            self._others_done_at = self.clock()
        if self.clock() - self._others_done_at < self.finish_timeout:
            return None
        return F.Failure(
            0, 0, "unfinished", time.time(), local_rank=0,
            message="did not finish its step body within %ss after every other rank finished "
            "its own. Rank 0 is the Metaflow task: a rank 0 that hangs (e.g. in a collective the "
            "others never join, or in code only rank 0 runs) is stopped; raise "
            "finish_timeout if it legitimately runs longer" % self.finish_timeout)

    def unfinished_failure(self, waited):
        """The failure to report when rank 0 finished its body `waited` seconds ago and some
        ranks or nodes still have not finished theirs. Ranks of other nodes are named from
        what their agents reported done."""
        places = [s for s in self.slots if s.rank is not None and s.member.poll() is None]
        nodes = sorted({s.node for s in self.slots if s.rank is None and s.member.poll() is None}
                       | self._nodes_left)
        for node in nodes:
            places += [Place(node, r, self.topology.locate(r)[1])
                       for r in self.topology.ranks_of(node)
                       if not self.control.rank_is_done(r)] or [Place(node)]
        places = places or [Place(0)]
        first = places[0]
        return F.Failure(
            first.rank, first.node, "unfinished", time.time(), local_rank=first.local_rank,
            message="did not finish its step body within %ss after rank 0 finished its own "
            "(still running: %s). A rank that hangs (e.g. in a collective the others never "
            "join, or in code only some ranks run) is stopped; raise finish_timeout if "
            "ranks legitimately finish later than rank 0"
            % (waited, "; ".join(_member_name(p, self.topology) for p in places)))

    def _check(self):
        now = time.time()
        if self.heartbeat_node is not None:  # an agent: tell node 0 which ranks are done
            for slot in self.slots:
                if slot.rank not in self._reported_done and slot.member.poll() == 0:
                    self.control.rank_finished(slot.rank)
                    self._reported_done.add(slot.rank)
        if self.heartbeat_node is not None and self.clock() >= self._next_beat:
            self.control.beat(self.heartbeat_node)
            self._next_beat = self.clock() + HEARTBEAT_INTERVAL
        for slot in self.slots:
            if id(slot) in self._seen_slots:
                continue
            code = slot.member.poll()
            if code is None and slot.rank is not None:
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
                    None, slot.node, "agent", now, code,
                    message="node agent exited with code %d before reporting a cause" % code)
            return F.from_exit(slot.rank, slot.node, slot.local_rank, code, now, slot.error_file)
        for node in list(self._nodes_left):
            reported = None if node in self._seen_nodes else self.control.failure(node)
            if reported is not None:
                self._seen_nodes.add(node)
                return reported
            if self.control.finished(node):
                self._nodes_left.discard(node)
            elif self.heartbeat_timeout is not None:
                lost = self._check_heartbeat(node, now)
                if lost is not None:
                    return lost
        if self.watch_abort and self.control.aborted():
            raise GangAborted()
        return self._check_joins(now)

    def _check_joins(self, now):
        if not self._pending_joins:
            return None
        for join_id in list(self._pending_joins):
            if self.control.joined(join_id):
                del self._pending_joins[join_id]
        if not self._pending_joins or self.clock() < self.join_deadline:
            return None
        missing = sorted(self._pending_joins.values(), key=lambda s: s.node)
        first = missing[0]
        names = "; ".join(_member_name(s, self.topology) for s in missing)
        return F.Failure(
            first.rank, first.node, "missing", now, local_rank=first.local_rank,
            message="did not join the gang within the rendezvous timeout of %ss. Missing: %s. "
            "Check that every node can start (image, capacity) and reach node 0, or raise "
            "rendezvous_timeout." % (self.join_timeout, names))

    def _check_heartbeat(self, node, now):
        count = self.control.beats(node)
        seen = self._beats.get(node)
        if seen is None or count != seen[0]:
            self._beats[node] = (count, self.clock())
            return None
        if count == 0 or self.clock() - seen[1] < self.heartbeat_timeout:
            return None  # not started yet (the join deadline covers it), or still beating
        return F.Failure(
            None, node, "lost", now,
            message="stopped sending heartbeats %ss ago: %s or its container died, hangs, or "
            "cannot reach node 0 any more. Its own log (and the instance's) tells why."
            % (self.heartbeat_timeout, _member_name(Place(node), self.topology)))

    def _all_done(self):
        return (not self._nodes_left and not self._pending_joins
                and all(s.member.poll() == 0 for s in self.slots))


@dataclass
class Place:
    """Where an expected check-in comes from: a node (rank None) or one rank."""

    node: int
    rank: Optional[int] = None
    local_rank: Optional[int] = None


def _member_name(slot, topology):
    if slot.rank is None:
        ranks = list(topology.ranks_of(slot.node))
        return "node %d (ranks %d-%d)" % (slot.node, ranks[0], ranks[-1])
    return "rank %d (node %d)" % (slot.rank, slot.node)
