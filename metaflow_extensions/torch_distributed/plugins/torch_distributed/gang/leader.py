"""Node 0 of a gang: the leader, inside the Metaflow task process, which runs no user code.

It binds the gang's store, starts node 0's ranks (forked, or exec'd as spin-steps; rank 0
too: its body hands its results back to the task), starts the local node agents, hosts the
control plane, watches every node, settles the root cause of a failure, and either restarts
every rank in place (max_restarts) or fails the attempt.
"""

import contextlib
import dataclasses
import functools
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple

from ..core import naming, rounds, stragglers
from ..core.envcontract import foreign_launcher_vars
from ..core.errors import (
    TorchDistributedGangFailed,
    TorchDistributedRendezvousTimeout,
)
from ..core.failures import (
    Failure,
    FailureKind,
    GangOutcome,
    debug_enabled,
    gang_outcome,
    load_exception,
    root_cause,
)
from ..core.gangspec import Attempt, Blueprint, GangSpec, Role
from ..core.topology import Topology
from ..mf import checkpoints, events, nodefacts
from ..mf import current as current_mod
from ..mf import handback as rank0_results
from ..mf.usertimer import AlarmForwarder
from ..runtime import preempt, stacks
from ..runtime.control import (
    ROUND_END,
    ROUND_RESTART,
    ControlPlane,
    bind_error,
    bind_listener,
    ensure_file_limit,
    is_port_in_use,
    port_in_use_error,
)
from ..runtime.floodwatch import FloodWatch
from ..runtime.procs import Member, fork_member, spawn_member
from ..runtime.remote_logs import LogReceiver
from ..runtime.supervisor import POLL_INTERVAL, LeaderWatch, Place, Slot
from .agent import run_local_agent
from .common import NODES_STOP_WAIT, ask, quietly, say
from .rank import HandBack, rank_info
from .runner import NodeRunner, forget_round, mark_agent_stops, stop_and_release

# Seconds local node agents have to leave once node 0 said that no round follows.
AGENTS_LEAVE_WAIT = 10.0
# Seconds node 0 waits for the last output of remote nodes after the gang ended.
REMOTE_DRAIN_TIMEOUT = 3.0


@dataclasses.dataclass
class _Attempt:
    """What one run of a gang holds on node 0, from its start to its settling. Leader.run makes
    it and owns its teardown; the watch's thread reads it. Its store and its
    round's watch exist once the gang started (Leader._start): `started` says so."""
    spec: GangSpec
    runner: NodeRunner
    recorder: events.GangRecorder
    store: Optional[ControlPlane] = None
    round_watch: Optional[LeaderWatch] = None
    receiver: Optional[LogReceiver] = None
    outcome: Optional[GangOutcome] = None  # when the gang failed
    member_exception: Optional[BaseException] = None  # the root cause's own, from a member
    listener: Optional[socket.socket] = None  # the store's listening socket, closed in members
    # restarts in place: the root causes of the rounds restarted so far, and why the last
    # failed round was not restarted ("" when restarts are off)
    rounds: List[Failure] = dataclasses.field(default_factory=list)
    no_restart: Optional[str] = ""
    # the card's view of each restarted round (_round_record), and when the running one began
    round_records: List[Optional[events.RoundRecord]] = dataclasses.field(default_factory=list)
    round_started: Optional[float] = None

    @property
    def started(self) -> bool:
        return self.store is not None and self.round_watch is not None

    @property
    def control(self) -> ControlPlane:
        """The gang's store, as this round speaks to it."""
        if self.store is None:
            raise RuntimeError("the gang's store is not up yet (Leader._start)")
        return self.store

    @property
    def watch(self) -> LeaderWatch:
        """The running round's watch."""
        if self.round_watch is None:
            raise RuntimeError("the gang's watch is not started yet (Leader._start)")
        return self.round_watch


class Leader:
    """Node 0 of a gang, running inside the Metaflow task process, which runs no user code:
    rank 0 is a process this one starts, as every other rank (forked under the start method
    fork, Linux's default; a spin-step of the task under exec), and hands its results back
    (`handback`)."""

    def __init__(self, blueprint: Blueprint, topology: Topology, attempt: Attempt,
                 accelerator: str, start_method: str, abort_grace: float, decorator_name: str,
                 node_gpu_blocks: Optional[Dict[int, Optional[str]]] = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.blueprint = blueprint
        self.step_name = blueprint.step_name
        self.topology = topology
        # The attempt as node 0's backend placed it. Its port is where the store listens: 0
        # locally (any free one), fixed in advance where the other nodes are other machines.
        self.placed = attempt
        self.accelerator = accelerator
        self.start_method = start_method  # resolved: fork or exec
        self.remote = not attempt.local
        self.abort_grace = abort_grace
        self.clock, self.sleep = clock, sleep  # the waits between rounds (tests drive them)
        self.decorator_name = decorator_name
        # CUDA_VISIBLE_DEVICES per node when emulated nodes share this host's GPUs
        self.node_gpu_blocks = node_gpu_blocks or {}
        self._attempt: Optional[_Attempt] = None  # the running gang's
        # the last run's record for the gang's card (events.py)
        self.record: Optional[events.GangRecord] = None
        # the user's own exception raised as the step's error
        self.users_error: Optional[BaseException] = None
        # the load policy of the step's @checkpoint, which a restart in place follows again
        self.checkpoint_policy: Optional[str] = None
        # called with (restart number, the failed round's root cause)
        self.on_restart: Optional[Callable[[int, Failure], None]] = None

    @property
    def attempt(self) -> "_Attempt":
        """The running gang's attempt (the watch's thread reads it once the gang started)."""
        if self._attempt is None:
            raise RuntimeError("no gang attempt runs yet (Leader.run)")
        return self._attempt

    def raised_users_own(self, ex: BaseException) -> bool:
        """True when `ex` is the user's own exception this gang raised as the step's error, whose
        traceback its rank already printed (so its frames need not be shown again)."""
        return ex is self.users_error and not debug_enabled()

    def run(self, step_func: Callable[..., object], args: Sequence[Any], handback: HandBack,
            on_body_start: Optional[Callable[[], object]] = None,
            on_assembled: Optional[Callable[[], object]] = None) -> None:
        """Start the gang, with rank 0's body in a process of its own that hands its results
        back through `handback`; call `on_body_start` as the ranks start; supervise, and raise
        the gang's error if any rank failed. `on_assembled`
        is called once every process node 0 expects to check in has checked in (at once when
        none does), from this thread or the watch's.

        Every resource is torn down in one place, in the reverse of the order it was made:
        `running` stops what runs (the watch's abort, the log receiver, the members and the
        node's output), then `held` settles the outcome and the card's record while the work
        dir (members' error files) and the store are still there, and removes those last."""
        with contextlib.ExitStack() as held:
            listener = held.enter_context(contextlib.closing(self._bind()))
            work_dir = tempfile.mkdtemp(prefix="torch-distributed-")
            held.callback(shutil.rmtree, work_dir, ignore_errors=True)
            spec = GangSpec(Role.LEADER, self.blueprint,
                            dataclasses.replace(self.placed,
                                                master_port=listener.getsockname()[1]),
                            node=0, work_dir=work_dir, accelerator=self.accelerator,
                            start_method=self.start_method,
                            cuda_visible_devices=self.node_gpu_blocks.get(0))
            handback = dataclasses.replace(handback, path=rank0_results.path_in(work_dir))
            attempt = self._attempt = _Attempt(
                spec, NodeRunner(spec, self.topology, step_func, args, self.decorator_name,
                                 handback),
                events.GangRecorder(spec, self.topology))
            held.callback(self._settle, attempt)
            held.enter_context(stacks.ignoring_dumps())
            with contextlib.ExitStack() as running:
                self._start(attempt, listener, running, on_assembled)
                preempt.PREEMPTED.clear()
                # a preemption while the other ranks still run after rank 0's body is one too
                on_demand = stacks.OnDemand(
                    say, lambda: [s.member.pid for s in attempt.runner.slots
                                  if s.rank is not None])
                with preempt.SupervisorHandler(
                        lambda: attempt.watch.sigterm(),
                        on_stacks=lambda: on_demand.ask(attempt.control, self.step_name)):
                    # for the task's own hooks after the step, as in rank 0's process
                    current_mod.install(rank_info(spec, self.topology, 0))
                    if on_body_start is not None:
                        on_body_start()
                    # @timeout is the attempt's: it counts across rounds
                    with AlarmForwarder(lambda: _running_pid(attempt.runner.slot_of(0)),
                                        self.abort_grace):
                        while True:
                            attempt.watch.wait_for_leader()
                            self._wait_for_the_rest(attempt)
                            if not self._restart(attempt, handback):
                                break
            self._take_handback(attempt, handback)
        if attempt.outcome is not None:
            self._raise_failure(attempt, attempt.outcome)

    def _wait_for_the_rest(self, attempt: _Attempt) -> None:
        """(Rank 0's body ended.) Until the round's watch ended, failing the ranks that do not
        finish within the finish timeout."""
        timeout = attempt.spec.blueprint.finish_timeout_s
        if not attempt.watch.wait(timeout):
            attempt.watch.report(attempt.watch.unfinished_failure(timeout))

    def _restart(self, attempt: _Attempt, handback: HandBack) -> bool:
        """(The round's watch ended.) True when its failure starts the next round in place:
        every rank of the round is stopped, and a fresh process of each is forked from this
        task, which runs no user code, with the next restart_count, a rendezvous of its own
        (the store's keys and torch's under the new round) and, with @checkpoint, the latest
        checkpoint loaded (a save of the failed round included)."""
        spec, runner = attempt.spec, attempt.runner
        if not spec.blueprint.max_restarts or not attempt.watch.failed():
            return False
        runner.stop(ranks_only=True)
        outcome, _ = self._outcome(attempt)
        root = outcome.root_cause
        attempt.no_restart = rounds.why_not_restart(root, attempt.rounds,
                                                    spec.blueprint.max_restarts)
        if attempt.no_restart is None and attempt.watch.sigterm_at is not None:
            # told to stop while the round stopped (a scheduler's stop, a spot reclaim): the
            # machine may be going away, and the SIGTERM is not lost on a round that ended
            attempt.no_restart = rounds.TERMINATED
        if attempt.no_restart is None:
            attempt.no_restart = self._wait_for_nodes_to_stop(attempt)
        if attempt.no_restart is not None:
            return False
        attempt.rounds.append(root)
        attempt.round_records.append(self._round_record(attempt))
        restart = spec.restart_count + 1
        print(rounds.restart_line(self.step_name, restart, spec.blueprint.max_restarts, root),
              file=sys.stderr, flush=True)
        attempt.recorder.phase("restart")
        if self.on_restart is not None:
            self.on_restart(restart, root)
        attempt.watch.join()
        forget_round(spec.work_dir, runner, handback)
        loaded = checkpoints.reload_latest(self.checkpoint_policy)
        spec = dataclasses.replace(spec, restart_count=restart)
        if spec.attempt.checkpoint is not None:
            from metaflow import current

            # what every rank loads this round, and where its saves' numbering goes on (after
            # the attempt's stored saves): the forked ranks inherit both, exec'd ranks and
            # other nodes are told
            spec = spec.with_attempt(checkpoint=checkpoints.gang_fields(
                current, os.environ, restore=False,
                next_version=checkpoints.continue_numbering(current)))
        attempt.spec = spec
        runner.new_round(spec)
        ended_control, attempt.store = attempt.control, attempt.control.for_round(restart)
        attempt.control.forget_rendezvous()  # every rank of every node has stopped
        if self.topology.nodes > 1:
            if spec.attempt.checkpoint is not None:
                attempt.control.publish_checkpoint(spec.attempt.checkpoint)
            ended_control.say_word(ROUND_RESTART)
        attempt.round_started = time.time()
        if loaded is not None:
            print("@torch_distributed on step *%s*: round %d starts from checkpoint %s"
                  % (self.step_name, restart, loaded), file=sys.stderr, flush=True)
        runner.start_ranks(range(self.topology.nproc_per_node),
                           close_fds=[attempt.listener.fileno()] if attempt.listener else [])
        ended, attempt.round_watch = attempt.watch, self._watch(attempt)
        if ended.sigterm_at is not None:  # it came while the ranks were being started
            attempt.watch.sigterm()
        return True

    def _wait_for_nodes_to_stop(self, attempt: Any) -> Optional[str]:
        """(A failed round that restarts.) None once every other node said that its ranks of
        the round stopped: the next round's rendezvous then starts clean. Else why the gang is
        not restarted: a node's agent ended, said nothing within NODES_STOP_WAIT s (it is lost:
        the attempt is @retry's), or was told to stop meanwhile."""
        control, pending = attempt.control, set(range(1, self.topology.nodes))
        deadline = self.clock() + NODES_STOP_WAIT
        while True:
            for node in sorted(pending):
                if ask(control.node_preempted, node):
                    return rounds.node_terminated(node)
                if ask(control.node_stopped, node):
                    pending.discard(node)
            if not pending:
                return None
            gone = sorted(s.node for s in attempt.runner.slots if s.rank is None
                          and s.node in pending and s.member.poll() is not None)
            if gone or self.clock() >= deadline:
                return rounds.nodes_not_stopped(gone or sorted(pending), NODES_STOP_WAIT,
                                                gone=bool(gone))
            self.sleep(POLL_INTERVAL)

    def _round_record(self, attempt: _Attempt) -> Optional[events.RoundRecord]:
        """What the card shows of a round that is restarted (every process of it stopped): its
        ranks' records, read before the next round's ranks write theirs; None if it cannot be
        put together."""
        record = self._collect(attempt)
        if record is None:
            return None
        began = attempt.round_started or record.started
        # the round's abort, when the gang stopped its ranks
        stopped = [t for name, t in attempt.recorder.phases if name == "abort" and t >= began]
        return record.as_round(attempt.spec.restart_count, began,
                               stopped[-1] if stopped else time.time())

    def _take_handback(self, attempt: _Attempt, handback: HandBack) -> None:
        """(Every process of the gang has stopped.) Rank 0's results into the task: those of a
        gang that finished, and those @catch keeps of one that failed."""
        if attempt.watch.failed() and not handback.keep_failed:
            return
        if not handback.receive() and not attempt.watch.failed():
            print("@torch_distributed on step *%s*: rank 0's process ended with exit status 0 "
                  "but handed back nothing of its body (it left through os._exit): the step "
                  "keeps none of its artifacts, nor its self.next()" % self.step_name,
                  file=sys.stderr, flush=True)

    def _start(self, attempt: _Attempt, listener: socket.socket, running: contextlib.ExitStack,
               on_assembled: Optional[Callable[[], object]] = None) -> None:
        """Start node 0's members, the local agents, the store, the log receiver and the
        watch, registering on `running` how each is stopped."""
        spec, runner = attempt.spec, attempt.runner
        # what every other node checks its own against before it starts a rank (Agent)
        facts = nodefacts.gather(self.step_name, 0, os.environ, spec.cuda_visible_devices) \
            if self.topology.nodes > 1 else None
        runner.start_ranks(range(self.topology.nproc_per_node), close_fds=[listener.fileno()])
        running.callback(stop_and_release, runner)
        # Remote nodes start on their own machines; local ones are agents started here.
        local_nodes = [] if self.remote else range(1, self.topology.nodes)
        for node in local_nodes:
            runner.slots.append(Slot(self._start_local_agent(runner, node, listener), node))
        runner.capture("", close_in_pump=[listener.fileno()])
        attempt.store = ControlPlane.host(listener, spec.attempt.gang_id, spec.attempt.secret,
                                            spec.blueprint.rendezvous_timeout_s)
        if facts is not None:
            attempt.control.report_facts(0, facts.to_dict())
        if self.remote:  # agents on other machines ask for what node 0's @checkpoint loaded
            attempt.control.publish_checkpoint(spec.attempt.checkpoint)
        if self.remote and self.topology.nodes > 1:
            attempt.receiver = LogReceiver(
                ControlPlane.of_attempt(spec.attempt, spec.blueprint.rendezvous_timeout_s),
                range(1, self.topology.nodes),
                dict(zip((1, 2), runner.saved_fds or ())),
                tee=attempt.recorder.remote_tails).start()
            running.callback(attempt.receiver.stop, REMOTE_DRAIN_TIMEOUT)
        attempt.listener = listener
        attempt.round_watch = self._watch(attempt, on_assembled)
        if spec.blueprint.max_restarts and self.topology.nodes > 1:
            # the other nodes wait for node 0's word after each round (Agent._next_round)
            running.callback(self._say_end, attempt)
        running.callback(_abort_if_failed, attempt)

    def _start_local_agent(self, runner: NodeRunner, node: int,
                           listener: socket.socket) -> Member:
        """The agent of node `node` on this host. Under the start method fork it is forked
        from this task, as a rank is (no interpreter, Metaflow, flow or torch to load again:
        emulated nodes assemble in a fork's time); under exec a spin-step of the task."""
        cuda = self.node_gpu_blocks.get(node)
        if runner.spec.start_method != "fork":
            argv, env = runner.command(
                Role.AGENT, naming.hidden_task_id(runner.spec.attempt.task.task_id, node),
                node=node, cuda_visible_devices=cuda)
            return spawn_member(naming.agent_label(node), argv, env)
        spec = dataclasses.replace(runner.spec, role=Role.AGENT, node=node,
                                   cuda_visible_devices=cuda)
        return fork_member(naming.agent_label(node),
                           functools.partial(run_local_agent, spec, self.topology,
                                             runner.step_func, runner.args,
                                             self.decorator_name), {},
                           close_fds=[listener.fileno(), *runner.member_fds()])

    def _watch(self, attempt: _Attempt,
               on_assembled: Optional[Callable[[], object]] = None) -> LeaderWatch:
        """The watch of the gang's round that starts (started)."""
        spec, runner = attempt.spec, attempt.runner
        return LeaderWatch(
            runner.slots, attempt.control, self.topology,
            watch_nodes=range(1, self.topology.nodes),
            expected_joins=self._expected_joins(attempt),
            join_timeout=spec.blueprint.rendezvous_timeout_s,
            heartbeat_timeout=spec.blueprint.heartbeat_timeout_s,
            leader_slot=runner.slot_of(0),
            finish_timeout=spec.blueprint.finish_timeout_s,
            on_failure=self._on_failure,
            on_assembled=on_assembled,
            progress=stacks.NodeProgress(spec.work_dir, self.topology.ranks_of(0)),
            hang_timeout=spec.blueprint.hang_timeout_s,
            on_preempt=self._preempt_gang,
            agents_stay=bool(spec.blueprint.max_restarts),
            flood=FloodWatch(attempt.control.num_keys, self.topology.world_size),
            stragglers=stragglers.Window(spec.blueprint.straggler_window_s)
            if spec.blueprint.straggler_window_s else None,
            on_straggler=self._name_straggler).start()

    def _name_straggler(self, found: stragglers.Finding) -> None:
        """(From the watch's thread.) The straggler changed: one line in the run's output."""
        nodes = {rank: self.topology.locate(rank)[0] for rank in found.shares}
        say("@torch_distributed on step *%s*: %s" % (self.step_name,
                                                     stragglers.line(found, nodes)))

    def _settle(self, attempt: _Attempt) -> None:
        """Once every process of the gang has stopped: what happened, and the card's record."""
        if attempt.round_watch is not None and attempt.watch.failed():
            attempt.outcome, attempt.member_exception = self._outcome(attempt)
        self.record = self._collect(attempt)
        ignored: Dict[str, int] = self.record.ignored_messages if self.record else {}
        if ignored:
            from ..mf.card import ignored_note

            print("@torch_distributed on step *%s*: %s" % (self.step_name, ignored_note(ignored)),
                  file=sys.stderr, flush=True)

    def _collect(self, attempt: _Attempt) -> Optional[events.GangRecord]:
        """The record of this gang attempt for its card, or None if it cannot be put together
        (which never changes the step's result)."""
        control = attempt.store
        try:
            remote: Dict[int, Optional[Dict[str, Any]]] = {}
            if self.remote and control is not None:
                for node in range(1, self.topology.nodes):
                    remote[node] = control.node_events(node)
            return self._record_now(attempt, remote)
        except Exception as ex:  # noqa: BLE001 - the card is a view; the step's result stands
            print("@torch_distributed on step *%s*: could not record the gang for its card: %s"
                  % (self.step_name, ex), file=sys.stderr, flush=True)
            return None

    def live_view(self) -> Optional[events.LiveView]:
        """(From the live card's thread, card.LiveCard.) The running gang as its card shows it
        now: its record so far (the ranks' own files, the last lines node 0 has, what the watch
        saw) and where each rank stands (the hang probes' last reports); None before the gang
        started. The other nodes' shares of the record come only at the end."""
        attempt = self._attempt
        if attempt is None or not attempt.started:
            return None
        at, reports = attempt.watch.live_reports
        return events.LiveView(self._record_now(attempt, {}), at, reports)

    def _record_now(self, attempt: _Attempt,
                    remote: Mapping[int, Optional[Dict[str, Any]]]) -> events.GangRecord:
        """The record of this gang attempt as it stands, with the remote nodes' shares
        `remote` ({node: JSON form})."""
        runner = attempt.runner
        watch = attempt.round_watch
        failures = list(watch.failures) if watch is not None else []
        # restarts in place: the root causes and records of the rounds before the last
        record = attempt.recorder.collect(
            attempt.spec.work_dir, list(runner.slots), dict(runner.spawned), remote, failures,
            root_cause(failures), list(runner.stopped), restarted=list(attempt.rounds),
            rounds=[r for r in attempt.round_records if r is not None])
        window = watch.stragglers if watch is not None else None
        found = window.last if window is not None else None
        if found is None:
            return record
        return dataclasses.replace(record, waiting=dict(found.shares),
                                   waiting_span_s=found.span_s, straggler=found.straggler)

    def _bind(self) -> socket.socket:
        """The store's listening socket, on the one address the gang's peers reach (locally
        the loopback address; remotely node 0's own, MASTER_ADDR), never every interface."""
        address, port = self.placed.master_addr, self.placed.master_port
        ensure_file_limit(self.step_name, self.topology)  # every rank and agent connects
        try:
            return bind_listener(address, port)
        except OSError as ex:
            if port and is_port_in_use(ex):
                raise port_in_use_error(self.step_name, port)
            raise bind_error(self.step_name, address, ex) from ex

    def _expected_joins(self, attempt: _Attempt) -> Dict[str, Place]:
        joins = {naming.node_join_id(n): Place(n) for n in range(1, self.topology.nodes)}
        if attempt.spec.start_method == "exec":
            for slot in attempt.runner.slots:
                if slot.rank is not None:
                    joins[naming.rank_join_id(slot.rank)] = Place(0, slot.rank, slot.local_rank)
        return joins

    def _on_failure(self, failure: Failure) -> None:
        """The first failure of the gang (called by the watch, which already holds it): stop
        every process of the round."""
        attempt = self.attempt
        attempt.recorder.phase("abort")
        quietly(attempt.control.abort)
        # the local agents' pumps say why node 0 stops them, not that they died without a word
        quietly(mark_agent_stops, attempt.runner, failure,
                lambda node: attempt.control.joined(naming.node_join_id(node)))
        # with restarts in place the local nodes' agents stay, for the next round
        attempt.runner.stop(ranks_only=bool(attempt.spec.blueprint.max_restarts))

    def _preempt_gang(self, origin: int, at: Optional[float] = None) -> None:
        """(The watch's thread.) A SIGTERM reached node `origin`: every rank of every node
        gets one, and the watch holds every failure for the preemption's grace."""
        attempt = self.attempt
        preempt.PREEMPTED.set()
        preempt.leave_mark(attempt.spec.work_dir)
        attempt.watch.preempt(origin, attempt.spec.blueprint.preempt_grace_s, at)
        quietly(attempt.control.preempt_gang)
        preempt.forward([s.member for s in attempt.runner.slots])  # ranks, local agents
        print("@torch_distributed on step *%s*: preempted (SIGTERM to node %d): every rank "
              "gets SIGTERM and %ss to save" % (self.step_name, origin,
                                                 attempt.spec.blueprint.preempt_grace_s),
              file=sys.stderr, flush=True)

    def _outcome(self, attempt: _Attempt) -> Tuple[GangOutcome, Optional[BaseException]]:
        """(GangOutcome, the exception object of a member whose failure is the root cause)."""
        runner, control = attempt.runner, attempt.control
        # this node's ranks, and those of the other nodes as their agents found them once
        # stopped (a node that node 0 aborted reports none of them as its own failure)
        exited = runner.own_failures()
        for node in range(1, self.topology.nodes):
            exited += ask(control.own_failures, node) or []
        finished = [s.rank for s in runner.slots
                     if s.rank is not None and s.member.poll() == 0]
        # the ranks of other nodes: their node agents said which had finished
        finished += [r for r in range(self.topology.nproc_per_node, self.topology.world_size)
                     if ask(control.rank_is_done, r)]
        outcome = gang_outcome(attempt.watch.failures, range(self.topology.world_size), exited,
                               finished)
        root = outcome.root_cause
        member_exception = None
        if root.kind is FailureKind.EXCEPTION and root.rank is not None and (
                root.node == 0 or not self.remote):  # its error file is on this machine
            member_exception = load_exception(runner.error_file(root.rank))
        return outcome, member_exception

    def _say_end(self, attempt: _Attempt) -> None:
        """Tell the other nodes, waiting after their round, that no round follows: they leave
        (local agents are given AGENTS_LEAVE_WAIT s to, before the members are stopped)."""
        quietly(attempt.control.say_word, ROUND_END)
        agents = [s.member for s in attempt.runner.slots if s.rank is None]
        deadline = self.clock() + AGENTS_LEAVE_WAIT
        while any(a.poll() is None for a in agents) and self.clock() < deadline:
            self.sleep(0.02)

    def _raise_failure(self, attempt: _Attempt, outcome: GangOutcome) -> NoReturn:
        failure = outcome.root_cause
        own = attempt.member_exception
        rounds_said = " ".join(t for t in (attempt.no_restart,
                                           rounds.rounds_note(attempt.rounds)) if t)
        if failure.kind is FailureKind.EXCEPTION and not failure.is_symptom() and own is not None:
            # Raise the user's own exception, so @catch and the task's error show its type. A
            # communication error (a peer went away or hung) is not the user's: the gang's
            # report, which names the ranks, says more.
            users_error = self.users_error = users_own(
                own, "@torch_distributed on step *%s*: %s raised this error; its "
                            "traceback is in its %s lines above. %s%s"
                            % (self.step_name, failure.where(),
                               naming.rank_label(failure.rank or 0), outcome.others_note(),
                               " " + rounds_said if rounds_said else ""))
            raise users_error
        cls = TorchDistributedRendezvousTimeout if failure.kind is FailureKind.MISSING \
            else TorchDistributedGangFailed
        raise cls(self.step_name, outcome, rounds_said)


def users_own(ex: BaseException, summary: str) -> BaseException:
    """The user's exception `ex`, made the step's error with the gang's `summary`: its
    traceback, already printed in its rank's lines, is not printed again (Metaflow prints the
    traceback of the task's own frames, then the exception, then the summary, its note).
    Before Python 3.11 (no notes), and for a SystemExit (which Metaflow does not report), the
    summary is printed here.
    METAFLOW_TORCH_DISTRIBUTED_DEBUG keeps the exception's whole traceback."""
    if not debug_enabled():
        ex = ex.with_traceback(None)
    # Metaflow reports an Exception with its notes; a SystemExit ends the task without a word
    if not isinstance(ex, Exception) or not hasattr(ex, "add_note"):
        print(summary, file=sys.stderr, flush=True)
    elif summary not in getattr(ex, "__notes__", ()):
        ex.add_note(summary)
    return ex


def _running_pid(slot: Slot) -> Optional[int]:
    """The pid of `slot`'s process while it runs, else None."""
    return slot.member.pid if slot.member.returncode is None else None


def _abort_if_failed(attempt: _Attempt) -> None:
    """Tell the other nodes to stop, when the gang failed (its first step of teardown)."""
    if attempt.watch.failed():
        quietly(attempt.control.abort)
