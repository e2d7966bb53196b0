"""Running a gang: node 0's leader (inside the Metaflow task), node agents, exec'd ranks.

Node 0's task hosts the control plane and runs rank 0 in its main thread, so rank 0's artifacts
are saved the normal way. Every other process of node 0 is a member started by the task; every
other node is run by a node agent that starts that node's ranks the same way. Locally a node
agent is a spin-step process on this host; remotely it is the node's container command.
"""

import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

from .mf import current as current_mod
from .mf import events, groupcheck
from .mf import handback as rank0_results
from .mf.usertimer import AlarmForwarder
from .runtime import interrupt, preempt, stacks
from .core import naming, rounds
from .mf import checkpoints
from .runtime.control import (
    ROUND_END,
    ROUND_RESTART,
    ControlPlane,
    GangMismatch,
    bind_error,
    bind_listener,
    is_port_in_use,
    loopback_interface,
    port_in_use_error,
)
from .core.envcontract import Rendezvous, foreign_launcher_vars, rank_env
from .core.errors import (
    TorchDistributedAborted,
    TorchDistributedGangFailed,
    TorchDistributedRendezvousTimeout,
)
from .core.failures import (
    Failure,
    communication_error,
    debug_enabled,
    from_exit,
    gang_outcome,
    load_exception,
    report_exception,
    root_cause,
    shown_traceback,
)
from .runtime.interrupt import BodyInterrupt
from .core.gangspec import GangSpec
from .mf.spinstep import member_command
from .runtime.procs import (
    OutputPump,
    exit_file_of,
    fork_member,
    run_member_body,
    spawn_member,
    stop_members,
)
from .runtime.remote_logs import LogReceiver, LogShipper
from .runtime.supervisor import POLL_INTERVAL, AgentWatch, LeaderWatch, Place, Slot

# Seconds a stopped member gets between SIGTERM and SIGKILL.
STOP_GRACE = 1.0
# Seconds node 0 waits, once a round failed, for every other node to say that its ranks
# stopped before it restarts the gang in place; a node silent for longer is lost.
NODES_STOP_WAIT = 30.0
# Seconds local node agents have to leave once node 0 said that no round follows.
AGENTS_LEAVE_WAIT = 10.0
# Seconds to copy the last output of exited members into the task's log.
DRAIN_TIMEOUT = 5.0
# Seconds node 0 waits for the last output of remote nodes after the gang ended.
REMOTE_DRAIN_TIMEOUT = 3.0
# Seconds the watchdog leaves the task's log capture to take its last lines before it ends the
# task (Leader._watchdog).
LOG_SETTLE_S = 1.0


class NodeRunner:
    """Starts the ranks of one node (all, or all but local rank 0 on node 0) and carries their
    output. Forks happen here, before any thread of this process is started."""

    def __init__(self, spec, topology, step_func, args, decorator_name, handback=None):
        self.spec = spec
        # node 0's rank 0, forked: what its process hands back to the task (mf/handback.py)
        self.handback = handback
        self.topology = topology
        self.step_func = step_func
        self.args = args
        self.decorator_name = decorator_name
        self.base_env = dict(os.environ)  # what exec'd members start from
        self.slots = []
        # A remote node also ships its output to node 0, whose task log Metaflow keeps. The
        # shipper's store client needs torch: import it before the pump is forked.
        remote = spec.backend != "local" and spec.node != 0
        if remote:
            import torch.distributed  # noqa: F401
        # Node 0's pump keeps each rank's last lines for the gang's card.
        tee = (lambda: LogShipper(spec)) if remote else \
            (lambda: events.TailKeeper(events.tails_file(spec.work_dir))) if spec.node == 0 else None
        self.pump = OutputPump(tee=tee)
        self.saved_fds = None
        # With restarts in place, each local rank's stdout and stderr are pipes of this node,
        # not of one process: {local rank: [out read, out write, err read, err write]}, the
        # read ends the pump's (None here once it has them), the write ends held here for
        # every round's process of that rank, closed as this node releases its output.
        self.pipes = None
        self.spawned = {}  # rank -> when its process was started
        self.stop_started = None
        self.stopped = []
        # The watch's thread, a watchdog and the main thread may each stop and release: the
        # first does it, the others wait for it (stop) or find it done (release).
        self._stop_lock = threading.Lock()
        self._release_lock = threading.Lock()

    def rendezvous(self):
        return Rendezvous(self.spec.master_addr, self.spec.master_port, self.spec.gang_id,
                          self.spec.restart_count, self.spec.max_restarts)

    def error_file(self, rank):
        return os.path.join(self.spec.work_dir, "error-rank-%d.json" % rank)

    def env_of(self, local_rank):
        rank = self.topology.rank(self.spec.node, local_rank)
        return rank_env(self.topology, self.spec.node, local_rank, self.rendezvous(),
                        accelerator=self.spec.accelerator, error_file=self.error_file(rank),
                        cuda_visible_devices=self.spec.cuda_visible_devices,
                        base_env=os.environ, cpu_count=os.cpu_count() or 1,
                        loopback_interface=loopback_interface()
                        if self.spec.backend == "local" else None)

    def start_ranks(self, local_ranks, close_fds=()):
        local_ranks = list(local_ranks)
        if self.spec.max_restarts and self.spec.start_method == "fork" and self.pipes is None:
            self.pipes = {lr: [*os.pipe(), *os.pipe()] for lr in local_ranks}
        for local_rank in local_ranks:
            rank = self.topology.rank(self.spec.node, local_rank)
            label = naming.rank_label(rank)
            env = self.env_of(local_rank)
            if self.spec.start_method == "fork":
                pipes = self.pipes[local_rank] if self.pipes else None
                member = fork_member(label, self._body(local_rank), env,
                                     remove_env=foreign_launcher_vars(os.environ),
                                     error_file=self.error_file(rank),
                                     close_fds=[*close_fds, *self._open_pipe_fds()],
                                     pipes=None if pipes is None else (pipes[1], pipes[3]))
                if pipes is not None:
                    member.stdout_fd, member.stderr_fd = pipes[0], pipes[2]
            else:
                argv, spawn_env = self.command(
                    "rank", naming.hidden_task_id(self.spec.task["task_id"], self.spec.node,
                                                  local_rank), local_rank=local_rank)
                spawn_env.update(env)
                for key in foreign_launcher_vars(spawn_env):
                    del spawn_env[key]
                member = spawn_member(label, argv, spawn_env, error_file=self.error_file(rank))
            self.spawned[rank] = time.time()
            self.slots.append(Slot(member, self.spec.node, rank, local_rank, self.error_file(rank)))
        return self.slots

    def slot_of(self, rank):
        """The slot of this node's rank `rank` in the running round (local node agents' slots
        come first from the second round on)."""
        return next(s for s in self.slots if s.rank == rank)

    def _open_pipe_fds(self):
        return [fd for ends in (self.pipes or {}).values() for fd in ends if fd is not None]

    def new_round(self, spec):
        """Forget the ranks of the round that ended (every one stopped): the next round's are
        started with `spec`, its restart_count one more."""
        self.spec = spec
        self.slots = [s for s in self.slots if s.rank is None]
        self.stop_started = None
        self.stopped = []

    def command(self, role, hidden_task_id, **fields):
        spec = dataclasses.replace(self.spec, role=role, **fields)
        return member_command(spec, hidden_task_id, self.decorator_name, self.base_env)

    def _body(self, local_rank):
        def body():
            current_mod.install(rank_info(self.spec, self.topology, local_rank))
            run_rank_body(self.spec, self.topology, local_rank, self.step_func, self.args)
        if self.handback is None or (self.spec.node, local_rank) != (0, 0):
            return body
        return functools.partial(_run_handing_back, body, self.handback)

    def capture(self, own_label, close_in_pump=()):
        """Send every member's output, and this process's own (as `own_label`), through the
        pump into this process's original stdout and stderr. Forks the pump: call it before
        this process starts any thread."""
        sys.stdout.flush()
        sys.stderr.flush()
        for slot in self.slots:
            # A node agent prefixes its ranks' lines itself.
            prefix = slot.member.label if slot.rank is not None else ""
            self.pump.add(slot.member.stdout_fd, prefix, 1)
            self.pump.add(slot.member.stderr_fd, prefix, 2)
        own = [os.pipe(), os.pipe()]
        for (r, _), target in zip(own, (1, 2)):
            self.pump.add(r, own_label, target)
        self.pump.start(close_in_child=[w for _, w in own] + list(close_in_pump) + [
                            ends[i] for ends in (self.pipes or {}).values() for i in (1, 3)],
                        orphan_note=_orphan_note(own_label, self.spec, os.getpid()))
        for ends in (self.pipes or {}).values():
            ends[0] = ends[2] = None  # closed by the pump's start: the pump's now
        self.saved_fds = (os.dup(1), os.dup(2))
        for (_, w), fd in zip(own, (1, 2)):
            os.dup2(w, fd)
            os.close(w)

    def release(self):
        """Give this process its own stdout and stderr back and let the pump copy what is left."""
        with self._release_lock:
            saved, self.saved_fds = self.saved_fds, None
        if saved is None:
            return
        self.pump.parent_done()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + tuple(self._open_pipe_fds()):
            os.close(fd)
        self.pipes = None
        self.pump.drain(DRAIN_TIMEOUT)

    def stop(self, ranks_only=False):
        """Stop the members still running (with `ranks_only`, the ranks, not local node agents:
        a restart in place keeps the nodes). Returns (when the first stop began, the labels of
        every member stopped so far): the watch may have stopped some before the main thread."""
        with self._stop_lock:
            if self.stop_started is None:
                self.stop_started = time.time()
            self.stopped += stop_members([s.member for s in self.slots
                                          if s.rank is not None or not ranks_only], STOP_GRACE)
        return self.stop_started, list(self.stopped)

    def node_record(self, joined_at, work_dir=None):
        """This node's share of the gang's record (events.py)."""
        info = events.node_info(self.spec.node, self.spec.master_addr, os.environ)
        return events.node_record(info, self.slots, self.spawned, joined_at, work_dir)


def run_rank_body(spec, topology, local_rank, step_func, args, in_task=False):
    """A rank's step body, its events recorded for the gang's card, its probe (stacks.py)
    telling its node's watch where it stands while hang detection is on. `in_task`: rank 0's
    body runs in the Metaflow task itself (start method exec), whose handlers are Leader.run's."""
    rank = topology.rank(spec.node, local_rank)
    if not in_task:
        # node 0's rank 0 unwinds on the gang's stop (its finally blocks run, what @catch
        # keeps is handed back); every other rank ends at once
        preempt.install_rank_handler(spec.work_dir, on_stop=_raise_aborted
                                     if (spec.node, local_rank) == (0, 0) else None)
    probe = None
    if spec.hang_timeout_s:
        probe = stacks.Probe(stacks.probe_file(spec.work_dir, rank),
                             stacks.interval_for(spec.hang_timeout_s), rank).start()
    dumps = stacks.register_dump()  # stacks on demand (undone below: the task's, in_task)
    try:
        events.run_recorded(rank, events.rank_file(spec.work_dir, rank),
                            lambda: groupcheck.run_body(
                                step_func, args, spec.step_name, topology,
                                default_mode=spec.group_check_default,
                                on_join=events.note_join))
    finally:
        if dumps:
            stacks.unregister_dump()
        if probe is not None:
            probe.stop()


def _run_handing_back(body, handback):
    """Rank 0's body in its own process, then its results handed back to the task: after a
    body that returned or left with sys.exit(0), and after a failed one whose exception @catch
    takes (its artifacts are kept, as on any step)."""
    sender = handback.sender()
    try:
        body()
    except TorchDistributedAborted:  # the gang's stop (_raise_aborted): no error of rank 0's
        if handback.keep_failed:
            _send_quietly(sender)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # ended by the stop, as every other rank
        raise
    except SystemExit as ex:
        if ex.code in (None, 0):
            sender.send()
        raise
    except BaseException:
        if handback.keep_failed:
            _send_quietly(sender)
        raise
    sender.send()


def _send_quietly(sender):
    """Hand back a failed body's artifacts for @catch; the body's own failure is the step's."""
    try:
        sender.send()
    except Exception as ex:  # noqa: BLE001 - the step fails with the body's error anyway
        print("could not hand back the artifacts of the failed body: %s: %s"
              % (type(ex).__name__, ex), file=sys.stderr, flush=True)


def _raise_aborted():
    raise _aborted()


@dataclasses.dataclass
class HandBack:
    """Where rank 0's process sends what its body produced (mf/handback.py): the task's flow
    and its output datastore; `keep_failed` when @catch keeps a failed body's artifacts."""
    flow: object
    task_datastore: object
    keep_failed: bool = False
    path: str = None  # in the gang's work directory, set by Leader.run

    def sender(self):
        return rank0_results.Sender(self.flow, self.task_datastore, self.path)

    def receive(self):
        return rank0_results.receive(self.flow, self.task_datastore, self.path)


def rank_info(spec, topology, local_rank):
    return current_mod.TorchDistributedInfo(topology, spec.node, local_rank, spec.master_addr,
                                            spec.master_port, spec.accelerator, spec.gang_id,
                                            spec.secret, spec.restart_count)


@dataclasses.dataclass
class _Attempt:
    """What one run of a gang holds on node 0, from its start to its settling. Leader.run makes
    it and owns its teardown; the watch's thread and the watchdog read it."""
    spec: GangSpec
    runner: NodeRunner
    recorder: events.GangRecorder
    control: ControlPlane = None
    receiver: LogReceiver = None
    watch: LeaderWatch = None
    body_finished: bool = False
    rank0_exception: BaseException = None  # rank 0's, when its body ran in the task (exec)
    outcome: object = None  # failures.GangOutcome when the gang failed
    member_exception: BaseException = None  # the root cause's own exception, from a member
    listener: object = None  # the store's listening socket, closed in every member
    # restarts in place: the root causes of the rounds restarted so far, and why the last
    # failed round was not restarted ("" when restarts are off)
    rounds: list = dataclasses.field(default_factory=list)
    no_restart: str = ""
    # the card's view of each restarted round (_round_record), and when the running one began
    round_records: list = dataclasses.field(default_factory=list)
    round_started: float = None


class Leader:
    """Node 0 of a gang, running inside the Metaflow task process. Under the start method fork
    (Linux's default) rank 0 is a process this one forks, as every other rank, and hands its
    results back (`handback`); under exec its body runs here, in the task's main thread."""

    def __init__(self, step_name, topology, spec_fields, abort_grace, decorator_name,
                 node_gpu_blocks=None, port=0):
        self.step_name = step_name
        self.topology = topology
        self.spec_fields = spec_fields  # GangSpec fields common to every member, minus port
        # Locally the store takes any free port; remote nodes need one fixed in advance.
        self.port = port
        self.remote = spec_fields["backend"] != "local"
        self.abort_grace = abort_grace
        self.decorator_name = decorator_name
        # CUDA_VISIBLE_DEVICES per node when emulated nodes share this host's GPUs
        self.node_gpu_blocks = node_gpu_blocks or {}
        self._body_running = threading.Event()
        self._main_thread = threading.main_thread().ident
        # how another thread makes rank 0's body raise (a signal the user has no use for)
        self.interruption = BodyInterrupt(_aborted, self._body_running.is_set)
        self.attempt = None  # the running gang's _Attempt
        self.record = None  # the last run's record for the gang's card (events.py)
        self.users_error = None  # the user's own exception raised as the step's error
        # the load policy of the step's @checkpoint, which a restart in place follows again
        self.checkpoint_policy = None
        self.on_restart = None  # called with (restart number, the failed round's root cause)

    def raised_users_own(self, ex):
        """True when `ex` is the user's own exception this gang raised as the step's error, whose
        traceback its rank already printed (so its frames need not be shown again)."""
        return ex is self.users_error and not debug_enabled()

    def run(self, step_func, args, on_body_start=None, on_assembled=None, handback=None):
        """Start the gang, with rank 0's body in a process of its own that hands its results
        back through `handback` (a HandBack), or here without one; call `on_body_start` as the
        body starts; supervise, and raise the gang's error if any rank failed. `on_assembled`
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
            spec = GangSpec(**self.spec_fields, role="leader", node=0, work_dir=work_dir,
                            master_port=listener.getsockname()[1],
                            cuda_visible_devices=self.node_gpu_blocks.get(0))
            in_task = handback is None
            if not in_task:
                handback = dataclasses.replace(handback, path=rank0_results.path_in(work_dir))
            attempt = self.attempt = _Attempt(
                spec, NodeRunner(spec, self.topology, step_func, args, self.decorator_name,
                                 handback),
                events.GangRecorder(spec, self.topology))
            held.callback(self._settle, attempt)
            if in_task:
                held.callback(_restore_environ, dict(os.environ))  # rank 0's body changes it
            held.enter_context(stacks.ignoring_dumps())
            with contextlib.ExitStack() as running:
                self._start(attempt, listener, running, on_assembled)
                preempt.PREEMPTED.clear()
                # a preemption while the other ranks still run after rank 0's body is one too
                on_demand = stacks.OnDemand(
                    _say, lambda: [os.getpid()] * in_task + [
                        s.member.pid for s in attempt.runner.slots if s.rank is not None])
                with preempt.SupervisorHandler(
                        lambda: attempt.watch.sigterm(),
                        on_stacks=lambda: on_demand.ask(attempt.control, self.step_name)):
                    if in_task:
                        with self.interruption:
                            self._run_rank0(attempt, step_func, args, on_body_start)
                        self._wait_for_the_rest(attempt)
                    else:
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
            if not in_task:
                self._take_handback(attempt, handback)
        if attempt.outcome is not None:
            self._raise_failure(attempt)

    def _wait_for_the_rest(self, attempt):
        """(Rank 0's body ended.) Until the round's watch ended, failing the ranks that do not
        finish within the finish timeout."""
        timeout = attempt.spec.finish_timeout_s
        if not attempt.watch.wait(timeout):
            attempt.watch.report(attempt.watch.unfinished_failure(timeout))

    def _restart(self, attempt, handback):
        """(The round's watch ended.) True when its failure starts the next round in place:
        every rank of the round is stopped, and a fresh process of each is forked from this
        task, which runs no user code, with the next restart_count, a rendezvous of its own
        (the store's keys and torch's under the new round) and, with @checkpoint, the latest
        checkpoint loaded (a save of the failed round included)."""
        spec, runner = attempt.spec, attempt.runner
        if not spec.max_restarts or not attempt.watch.failed():
            return False
        runner.stop(ranks_only=True)
        outcome, _ = self._outcome(attempt)
        root = outcome.root_cause
        attempt.no_restart = rounds.why_not_restart(root, attempt.rounds, spec.max_restarts)
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
        print(rounds.restart_line(self.step_name, restart, spec.max_restarts, root),
              file=sys.stderr, flush=True)
        attempt.recorder.phase("restart")
        if self.on_restart is not None:
            self.on_restart(restart, root)
        attempt.watch.join()
        _forget_round(spec.work_dir, runner, handback)
        loaded = checkpoints.reload_latest(self.checkpoint_policy)
        spec = attempt.spec = dataclasses.replace(spec, restart_count=restart)
        runner.new_round(spec)
        ended_control, attempt.control = attempt.control, attempt.control.for_round(restart)
        attempt.control.forget_rendezvous()  # every rank of every node has stopped
        if self.topology.nodes > 1:
            if spec.checkpoint is not None:  # what the other nodes' ranks load this round
                from metaflow import current

                attempt.control.publish_checkpoint(
                    checkpoints.gang_fields(current, os.environ, restore=False))
            ended_control.say_word(ROUND_RESTART)
        attempt.body_finished = False
        attempt.round_started = time.time()
        if loaded is not None:
            print("@torch_distributed on step *%s*: round %d starts from checkpoint %s"
                  % (self.step_name, restart, loaded), file=sys.stderr, flush=True)
        runner.start_ranks(range(self.topology.nproc_per_node),
                           close_fds=[attempt.listener.fileno()])
        ended, attempt.watch = attempt.watch, self._watch(attempt)
        if ended.sigterm_at is not None:  # it came while the ranks were being started
            attempt.watch.sigterm()
        return True

    def _wait_for_nodes_to_stop(self, attempt):
        """(A failed round that restarts.) None once every other node said that its ranks of
        the round stopped: the next round's rendezvous then starts clean. Else why the gang is
        not restarted: a node's agent ended, said nothing within NODES_STOP_WAIT s (it is lost:
        the attempt is @retry's), or was told to stop meanwhile."""
        control, pending = attempt.control, set(range(1, self.topology.nodes))
        deadline = time.monotonic() + NODES_STOP_WAIT
        while True:
            for node in sorted(pending):
                if _ask(control.node_preempted, node):
                    return rounds.node_terminated(node)
                if _ask(control.node_stopped, node):
                    pending.discard(node)
            if not pending:
                return None
            gone = sorted(s.node for s in attempt.runner.slots if s.rank is None
                          and s.node in pending and s.member.poll() is not None)
            if gone or time.monotonic() >= deadline:
                return rounds.nodes_not_stopped(gone or sorted(pending), NODES_STOP_WAIT,
                                                gone=bool(gone))
            time.sleep(POLL_INTERVAL)

    def _round_record(self, attempt):
        """What the card shows of a round that is restarted (every process of it stopped): its
        ranks' records, read before the next round's ranks write theirs; None if it cannot be
        put together."""
        record = self._collect(attempt)
        if record is None:
            return None
        began = attempt.round_started or record["started"]
        # the round's abort, when the gang stopped its ranks
        stopped = [t for name, t in attempt.recorder.phases if name == "abort" and t >= began]
        return dict(round=attempt.spec.restart_count, started=began,
                    ended=stopped[-1] if stopped else time.time(), ranks=record["ranks"],
                    node_info=record["node_info"], failures=record["failures"])

    def _take_handback(self, attempt, handback):
        """(Every process of the gang has stopped.) Rank 0's results into the task: those of a
        gang that finished, and those @catch keeps of one that failed."""
        if attempt.watch.failed() and not handback.keep_failed:
            return
        if not handback.receive() and not attempt.watch.failed():
            print("@torch_distributed on step *%s*: rank 0's process ended with exit status 0 "
                  "but handed back nothing of its body (it left through os._exit): the step "
                  "keeps none of its artifacts, nor its self.next()" % self.step_name,
                  file=sys.stderr, flush=True)

    def _start(self, attempt, listener, running, on_assembled=None):
        """Start node 0's members, the local agents, the store, the log receiver and the
        watch, registering on `running` how each is stopped."""
        spec, runner = attempt.spec, attempt.runner
        in_task = runner.handback is None
        runner.start_ranks(range(1 if in_task else 0, self.topology.nproc_per_node),
                           close_fds=[listener.fileno()])
        running.callback(_stop_and_release, runner)
        # Remote nodes start on their own machines; local ones are agents started here.
        local_nodes = [] if self.remote else range(1, self.topology.nodes)
        for node in local_nodes:
            argv, env = runner.command(
                "agent", naming.hidden_task_id(spec.task["task_id"], node), node=node,
                cuda_visible_devices=self.node_gpu_blocks.get(node))
            runner.slots.append(Slot(spawn_member(naming.agent_label(node), argv, env), node))
        runner.capture(naming.rank_label(0) if in_task else "",
                       close_in_pump=[listener.fileno()])
        attempt.control = ControlPlane.host(listener, spec.gang_id, spec.secret,
                                            spec.rendezvous_timeout_s)
        if self.remote:  # agents on other machines ask for what node 0's @checkpoint loaded
            attempt.control.publish_checkpoint(spec.checkpoint)
        if self.remote and self.topology.nodes > 1:
            attempt.receiver = LogReceiver(
                ControlPlane.connect(spec.master_addr, spec.master_port, spec.gang_id,
                                     spec.secret, spec.rendezvous_timeout_s),
                range(1, self.topology.nodes),
                {1: runner.saved_fds[0], 2: runner.saved_fds[1]},
                tee=attempt.recorder.remote_tails).start()
            running.callback(attempt.receiver.stop, REMOTE_DRAIN_TIMEOUT)
        attempt.listener = listener
        attempt.watch = self._watch(attempt, on_assembled)
        if spec.max_restarts and self.topology.nodes > 1:
            # the other nodes wait for node 0's word after each round (Agent._next_round)
            running.callback(_say_end, attempt)
        running.callback(_abort_if_failed, attempt)

    def _watch(self, attempt, on_assembled=None):
        """The watch of the gang's round that starts (started)."""
        spec, runner = attempt.spec, attempt.runner
        in_task = runner.handback is None
        return LeaderWatch(
            runner.slots, attempt.control, self.topology,
            watch_nodes=range(1, self.topology.nodes),
            expected_joins=self._expected_joins(attempt),
            join_timeout=spec.rendezvous_timeout_s,
            heartbeat_timeout=spec.heartbeat_timeout_s,
            leader_busy=self._body_running.is_set if in_task else None,
            leader_slot=None if in_task else runner.slot_of(0),
            finish_timeout=spec.finish_timeout_s,
            on_failure=self._on_failure,
            on_assembled=on_assembled,
            progress=stacks.NodeProgress(spec.work_dir, self.topology.ranks_of(0)),
            hang_timeout=spec.hang_timeout_s,
            on_preempt=self._preempt_gang,
            agents_stay=bool(spec.max_restarts)).start()

    def _settle(self, attempt):
        """Once every process of the gang has stopped: what happened, and the card's record."""
        if attempt.watch is not None and attempt.watch.failed():
            attempt.outcome, attempt.member_exception = self._outcome(attempt)
        self.record = self._collect(attempt)
        ignored = (self.record or {}).get("ignored_messages")
        if ignored:
            from .mf.card import ignored_note

            print("@torch_distributed on step *%s*: %s" % (self.step_name, ignored_note(ignored)),
                  file=sys.stderr, flush=True)

    def _collect(self, attempt):
        """The record of this gang attempt for its card, or None if it cannot be put together
        (which never changes the step's result)."""
        runner, control = attempt.runner, attempt.control
        failures = attempt.watch.failures if attempt.watch is not None else []
        try:
            remote = {}
            if self.remote and control is not None:
                for node in range(1, self.topology.nodes):
                    remote[node] = control.node_events(node)
            record = attempt.recorder.collect(attempt.spec.work_dir, runner.slots,
                                              runner.spawned, remote, failures,
                                              root_cause(failures), list(runner.stopped))
            if attempt.rounds:  # restarts in place: the rounds before the last
                record["restarts"] = [{"round": n, "at": f.detected_at, "sentence": f.sentence()}
                                      for n, f in enumerate(attempt.rounds)]
                record["rounds"] = [r for r in attempt.round_records if r is not None]
            return record
        except Exception as ex:  # noqa: BLE001 - the card is a view; the step's result stands
            print("@torch_distributed on step *%s*: could not record the gang for its card: %s"
                  % (self.step_name, ex), file=sys.stderr, flush=True)
            return None

    def _bind(self):
        """The store's listening socket, on the one address the gang's peers reach (locally
        the loopback address; remotely node 0's own, MASTER_ADDR), never every interface."""
        address = self.spec_fields["master_addr"]
        try:
            return bind_listener(address, self.port)
        except OSError as ex:
            if self.port and is_port_in_use(ex):
                raise port_in_use_error(self.step_name, self.port)
            raise bind_error(self.step_name, address, ex) from ex

    def _expected_joins(self, attempt):
        joins = {naming.node_join_id(n): Place(n) for n in range(1, self.topology.nodes)}
        if attempt.spec.start_method == "exec":
            for slot in attempt.runner.slots:
                if slot.rank is not None:
                    joins[naming.rank_join_id(slot.rank)] = Place(0, slot.rank, slot.local_rank)
        return joins

    def _run_rank0(self, attempt, step_func, args, on_body_start):
        for key in foreign_launcher_vars(os.environ):
            del os.environ[key]
        os.environ.update(attempt.runner.env_of(0))
        current_mod.install(rank_info(attempt.spec, self.topology, 0))
        if on_body_start is not None:
            on_body_start()
        self._body_running.set()
        try:
            # The watch may have failed the gang before the body began, when _on_failure
            # found no body to interrupt: then the body does not begin (the watch records
            # its failure before it looks at _body_running, set above before this look).
            if attempt.watch.failed():
                raise _aborted()
            run_rank_body(attempt.spec, self.topology, 0, step_func, args, in_task=True)
            attempt.body_finished = True
        except BaseException as ex:
            self._body_running.clear()
            self._rank0_failed(attempt, ex)
        finally:
            self._body_running.clear()

    def _rank0_failed(self, attempt, ex):
        attempt.rank0_exception = ex
        symptom = communication_error(ex)
        if not isinstance(ex, TorchDistributedAborted):  # the gang's stop is no rank's error
            # into rank 0's own lines, as every other rank's (procs.run_member_body)
            report_exception(ex, symptom)
        failure = Failure(0, 0, "exception", time.time(), local_rank=0,
                          message="%s: %s" % (type(ex).__name__, ex),
                          traceback=shown_traceback(_format_traceback(ex)), symptom=symptom)
        # Let go of the body's locals now: a DataLoader's persistent workers live as long as
        # its frames, and they hold this task's output pipe open, which the gang drains last.
        traceback.clear_frames(ex.__traceback__)
        # A symptom (a peer probably failed first) is held by the watch while it waits for the
        # root cause.
        attempt.watch.report(failure)

    def _on_failure(self, failure):
        """The first failure of the gang (called by the watch, which already holds it): stop
        every process, then make rank 0 stop."""
        attempt = self.attempt
        attempt.recorder.phase("abort")
        _quietly(attempt.control.abort)
        if threading.get_ident() == self._main_thread:
            return  # rank 0 itself failed: run() stops the members on its way out
        # with restarts in place the local nodes' agents stay, for the next round
        attempt.runner.stop(ranks_only=bool(attempt.spec.max_restarts))
        if not self._body_running.is_set():
            return
        # without a free signal the watchdog alone ends the task after the abort grace
        self.interruption.interrupt(self._main_thread)
        threading.Thread(target=self._watchdog, args=(attempt,),
                         name="torch-distributed-watchdog", daemon=True).start()

    def _preempt_gang(self, origin, at=None):
        """(The watch's thread.) A SIGTERM reached node `origin`: every rank of every node
        gets one, and the watch holds every failure for the preemption's grace."""
        attempt = self.attempt
        preempt.PREEMPTED.set()
        preempt.leave_mark(attempt.spec.work_dir)
        attempt.watch.preempt(origin, attempt.spec.preempt_grace_s, at)
        _quietly(attempt.control.preempt_gang)
        preempt.forward([s.member for s in attempt.runner.slots])  # ranks, local agents
        print("@torch_distributed on step *%s*: preempted (SIGTERM to node %d): every rank "
              "gets SIGTERM and %ss to save" % (self.step_name, origin,
                                                 attempt.spec.preempt_grace_s),
              file=sys.stderr, flush=True)
        if origin != 0 and self._body_running.is_set() and \
                signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            # rank 0's own handlers (the user's, a framework's) hear it too
            signal.pthread_kill(self._main_thread, signal.SIGTERM)

    def _watchdog(self, attempt):
        deadline = time.monotonic() + self.abort_grace
        while time.monotonic() < deadline:
            if not self._body_running.is_set():
                return
            time.sleep(0.05)
        # Rank 0 is stuck in native code (a collective or the rendezvous) and cannot be
        # interrupted: end the task. The runtime sees a failed attempt (retry/catch apply).
        failure = root_cause(attempt.watch.failures)
        if attempt.receiver is not None:
            attempt.receiver.stop(REMOTE_DRAIN_TIMEOUT)
        attempt.runner.release()
        print("@torch_distributed on step *%s*: gang failed.\n%s\nRank 0 did not stop within "
              "%ss (blocked in native code); ending the task."
              % (self.step_name, failure.describe(), self.abort_grace),
              file=sys.stderr, flush=True)
        # On remote backends the task's output reaches its stored log through Metaflow's tee
        # processes, which the pod's shell does not wait for before it saves the log: give them
        # the last lines (the root cause) before this process is gone (seen on the Kubernetes
        # emulation under load: a node that never started left a log without its cause).
        time.sleep(LOG_SETTLE_S)
        os._exit(1)

    def _outcome(self, attempt):
        """(GangOutcome, the exception object of a member whose failure is the root cause)."""
        runner = attempt.runner
        exited = []
        finished = [0] if attempt.body_finished else []
        # the ranks of other nodes: their node agents said which had finished
        finished += [r for r in range(self.topology.nproc_per_node, self.topology.world_size)
                     if _ask(attempt.control.rank_is_done, r)]
        for slot in runner.slots:
            if slot.rank is None:
                continue
            code = slot.member.poll()
            if code == 0:
                finished.append(slot.rank)
            elif code is not None:
                # It failed on its own if it ended, or recorded its exception, before the gang
                # stopped it (the watch may have stopped watching by then), or if what it
                # recorded is an error of its own: a stop ends a rank by a signal, never by an
                # exception, so only a symptom (a peer went away) can be the stop's doing. Ranks
                # that raise the same error a few ms apart (a framework's check) all raised it.
                failure = from_exit(slot.rank, slot.node, slot.local_rank, code, time.time(),
                                    slot.error_file)
                if (slot.member.label not in runner.stopped
                        or (failure.kind == "exception"
                            and (failure.detected_at < runner.stop_started
                                 or not failure.is_symptom()))):
                    exited.append(failure)
        outcome = gang_outcome(attempt.watch.failures, range(self.topology.world_size), exited,
                               finished)
        root = outcome.root_cause
        member_exception = None
        if root.kind == "exception" and root.rank is not None and (
                root.rank != 0 or runner.handback is not None) and (
                root.node == 0 or not self.remote):  # its error file is on this machine
            member_exception = load_exception(runner.error_file(root.rank))
        return outcome, member_exception

    def _raise_failure(self, attempt):
        outcome = attempt.outcome
        failure = outcome.root_cause
        own = attempt.rank0_exception if failure.rank == 0 and attempt.runner.handback is None \
            else attempt.member_exception
        rounds_said = " ".join(t for t in (attempt.no_restart,
                                           rounds.rounds_note(attempt.rounds)) if t)
        if failure.kind == "exception" and not failure.is_symptom() and own is not None:
            # Raise the user's own exception, so @catch and the task's error show its type. A
            # communication error (a peer went away or hung) is not the user's: the gang's
            # report, which names the ranks, says more.
            self.users_error = users_own(
                own, "@torch_distributed on step *%s*: %s raised this error; its "
                            "traceback is in its %s lines above. %s%s"
                            % (self.step_name, failure.where(), naming.rank_label(failure.rank),
                               outcome.others_note(), " " + rounds_said if rounds_said else ""))
            raise self.users_error
        cls = TorchDistributedRendezvousTimeout if failure.kind == "missing" \
            else TorchDistributedGangFailed
        raise cls(self.step_name, outcome, rounds_said)


class Agent:
    """A node other than node 0: starts the node's ranks, checks in, watches, reports."""

    def __init__(self, spec, topology):
        self.spec = spec
        self.topology = topology

    def run(self, step_func, args, decorator_name):
        """Run the node; the process exit status to leave with."""
        with stacks.ignoring_dumps():  # until each rank's body registers it
            return self._run(step_func, args, decorator_name)

    def _run(self, step_func, args, decorator_name):
        runner = NodeRunner(self.spec, self.topology, step_func, args, decorator_name)
        runner.start_ranks(range(self.topology.nproc_per_node))
        runner.capture(naming.agent_label(self.spec.node))
        old_handler = signal.signal(signal.SIGTERM,
                                    functools.partial(_kill_ranks_and_leave, runner))
        # node 0's requests for every rank's stacks, followed across rounds
        on_demand = stacks.OnDemand(_say, lambda: [s.member.pid for s in runner.slots])
        try:
            try:
                control = ControlPlane.connect(self.spec.master_addr, self.spec.master_port,
                                               self.spec.gang_id, self.spec.secret,
                                               self.spec.rendezvous_timeout_s)
            except (GangMismatch, RuntimeError) as ex:
                print("cannot reach node 0 at %s:%d: %s"
                      % (self.spec.master_addr, self.spec.master_port, ex), file=sys.stderr)
                return 2
            while True:
                supervisor = self._watch_round(runner, control, on_demand)
                code = self._end_round(runner, control, supervisor)
                # with restarts in place every node waits for node 0's word after a round
                if not (self.spec.max_restarts and supervisor.preempted is None
                        and self._next_round(runner, control, supervisor)):
                    return code
                control = control.for_round(self.spec.restart_count)
        finally:
            preempt.withdraw()
            runner.stop()
            runner.release()
            signal.signal(signal.SIGTERM, old_handler)

    def _watch_round(self, runner, control, on_demand):
        """Check this node's ranks of the round in with node 0 and watch them until the round
        ended for this node (the watch, ended)."""
        self._wait_for_exec_ranks(runner, control)
        # beat before joining: node 0 never sees this node joined and silent, unless
        # it went silent (AgentWatch beats on from here)
        control.beat(self.spec.node)
        control.join(naming.node_join_id(self.spec.node))
        joined_at = time.time()
        if self.spec.backend != "local":
            print("joined the gang of node 0 at %s:%d%s" % (
                self.spec.master_addr, self.spec.master_port,
                " (round %d)" % control.round if control.round else ""), flush=True)
        hang_timeout = self.spec.hang_timeout_s
        supervisor = AgentWatch(
            runner.slots, control, self.topology, self.spec.node,
            progress=stacks.NodeProgress(self.spec.work_dir,
                                         self.topology.ranks_of(self.spec.node))
            if hang_timeout else None,
            # twice per probe sample: what node 0 holds is at most a sample and a half old
            progress_interval=stacks.interval_for(hang_timeout) / 2 if hang_timeout else None,
            on_preempt=functools.partial(self._preempt_node, runner, control),
            stacks=on_demand,
        )
        self.watch = supervisor
        # from now on a SIGTERM is a preemption unless node 0 already stops the gang
        signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, supervisor))
        supervisor.start()
        if preempt.announce():  # its container was told to stop already
            supervisor.sigterm()
        supervisor.wait()
        self._send_record(runner, control, joined_at)
        return supervisor

    def _end_round(self, runner, control, supervisor):
        """Tell node 0 how this node's round ended; the exit status to leave with if no round
        follows."""
        if supervisor.aborted:
            print("node 0 aborted the gang; stopping this node's ranks", file=sys.stderr)
            if supervisor.preempted is not None:
                runner.stop()
                self._outlast_node_0(control)
            return self._exit_code(3, told_node_0=True)
        if supervisor.failed():
            # which ranks were still running: a hung one among them may be the cause
            _quietly(control.report_running, self.spec.node, supervisor.running_ranks())
            told = _ask(control.report_failure, self.spec.node,
                        root_cause(supervisor.failures)) is not False
            if supervisor.preempted is not None:
                self._outlast_node_0(control)
            return self._exit_code(1, told)
        control.finish(self.spec.node)
        return 0

    def _next_round(self, runner, control, supervisor):
        """(Restarts in place, the round over for this node.) Stop its ranks, tell node 0, and
        wait for node 0's word: True once the next round's ranks of this node started, with
        their restart_count and the checkpoint node 0 loaded for the round; False when node 0
        ends the attempt (its word, or its store gone) or a SIGTERM reached this node."""
        runner.stop()
        _forget_round(self.spec.work_dir, runner, None)
        if supervisor.sigterm_at is not None:  # told to stop as its ranks stopped
            _quietly(control.report_preempted, self.spec.node)
            return False
        if _ask(control.report_stopped, self.spec.node) is False:
            return False
        deadline = time.monotonic() + self.spec.rendezvous_timeout_s + NODES_STOP_WAIT
        word = None
        while word is None and time.monotonic() < deadline:
            if supervisor.sigterm_at is not None:  # told to stop: node 0 must not restart
                _quietly(control.report_preempted, self.spec.node)
                return False
            try:
                word = control.word()
            except Exception:  # noqa: BLE001 - any error of the store's: node 0 is gone
                return False
            if word is None:
                time.sleep(POLL_INTERVAL)
        if word != ROUND_RESTART:
            return False
        spec = dataclasses.replace(self.spec, restart_count=control.round + 1)
        if spec.checkpoint is not None:  # the latest checkpoint, as node 0 loaded it
            fields = control.for_round(spec.restart_count).checkpoint(spec.rendezvous_timeout_s)
            if fields is None:
                print("node 0 published no checkpoint for round %d; leaving the gang"
                      % spec.restart_count, file=sys.stderr, flush=True)
                return False
            spec = checkpoints.install_member(dataclasses.replace(spec, checkpoint=fields))
        self.spec = spec
        runner.new_round(spec)
        runner.start_ranks(range(self.topology.nproc_per_node))
        return True

    def _outlast_node_0(self, control):
        """(After a preemption, on Kubernetes.) Wait for node 0's task to end (its store goes
        away), within the grace the pods have. A deleted worker pod fails its Job, and with it
        the JobSet, once its process ends; Metaflow then stops following the task, and node 0,
        still recording the attempt as preempted, is not heard (docs/reliability.md)."""
        if self.spec.backend != "kubernetes":
            return
        deadline = time.monotonic() + self.spec.preempt_grace_s + preempt.STOP_MARGIN_S
        while time.monotonic() < deadline:
            try:
                control.aborted()
            except Exception:  # noqa: BLE001 - any error of the store's: node 0 is gone
                return
            time.sleep(0.2)

    def _preempt_node(self, runner, control, origin, at=None):
        """(The watch's thread.) This node's ranks get SIGTERM and the preemption's grace; a
        SIGTERM of this node's own is told to node 0, which preempts the whole gang."""
        preempt.leave_mark(self.spec.work_dir)
        self.watch.preempt(origin, self.spec.preempt_grace_s, at)
        preempt.forward([s.member for s in runner.slots])
        if origin == self.spec.node:
            _quietly(control.report_preempted, self.spec.node)
        print("preempted (SIGTERM to node %d): this node's ranks get SIGTERM" % origin,
              file=sys.stderr, flush=True)

    def _wait_for_exec_ranks(self, runner, control):
        """A node joins once its ranks are ready: exec'd ranks import Metaflow and torch first
        and check in with node 0 themselves (forked ones are ready at once). Node 0 counts the
        step's @timeout from the last join (usertimer.py), so this keeps their start-up off it.
        A rank that exits first, or node 0's abort, ends the wait: the watch reports those, and
        node 0's rendezvous timeout bounds it."""
        if self.spec.start_method != "exec":
            return
        pending = {naming.rank_join_id(s.rank) for s in runner.slots if s.rank is not None}
        deadline = time.monotonic() + self.spec.rendezvous_timeout_s
        while pending and time.monotonic() < deadline:
            pending = {j for j in pending if not control.joined(j)}
            if not pending or control.aborted() or any(
                    s.member.poll() is not None for s in runner.slots):
                return
            time.sleep(POLL_INTERVAL)

    def _exit_code(self, code, told_node_0):
        """The exit status of a node that failed or was aborted. On Kubernetes a failed worker
        Job fails the whole JobSet at once, and its controller then stops the control pod
        before node 0 has written the task's root cause and logs: a worker pod that node 0
        knows about leaves the verdict to node 0's Job (docs/kubernetes.md, "Semantics")."""
        return 0 if self.spec.backend == "kubernetes" and told_node_0 else code

    def _send_record(self, runner, control, joined_at):
        """Give node 0 this node's share of the gang's record: through the store from another
        machine, as a file in the gang's directory on node 0's own host."""
        if self.spec.backend == "local":
            _quietly(events.write_json, events.node_file(self.spec.work_dir, self.spec.node),
                     runner.node_record(joined_at))
        else:
            _quietly(control.send_node_events, self.spec.node,
                     runner.node_record(joined_at, self.spec.work_dir))


def run_exec_rank(spec, topology, step_func, args):
    """The body of an exec'd rank (start method exec): check in, run the step, exit status."""
    rank = topology.rank(spec.node, spec.local_rank)
    control = ControlPlane.connect(spec.master_addr, spec.master_port, spec.gang_id,
                                   spec.secret, spec.rendezvous_timeout_s)
    control.join(naming.rank_join_id(rank))
    current_mod.install(rank_info(spec, topology, spec.local_rank))
    return run_member_body(lambda: run_rank_body(spec, topology, spec.local_rank, step_func, args),
                           os.environ.get("TORCHELASTIC_ERROR_FILE"))


def users_own(ex, summary):
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


def _orphan_note(label, spec, pid):
    """What the pump of this process says if it dies without a word: a callable, asked when it
    died (the run may have been interrupted meanwhile, see interrupt.mark_interrupts)."""
    what = ("the node agent of node %d" % spec.node if spec.node != 0
            else "rank 0 (node 0, local rank 0), the Metaflow task process"
            if spec.start_method != "fork" else "the Metaflow task process of node 0")
    runtime = _local_runtime_pid(spec)

    def note():
        if runtime is not None and interrupt.was_interrupted(runtime):
            return ("%s @torch_distributed on step *%s*: %s (pid %d) was ended by Metaflow: the "
                    "run was interrupted (a SIGINT to its process), and Metaflow kills the tasks "
                    "still running 5 s later. Its ranks were stopped with it."
                    % (label, spec.step_name, what, pid))
        return ("%s @torch_distributed on step *%s*: %s (pid %d) died without a word: it was "
                "killed by a signal it cannot catch (SIGKILL: the OOM killer, a kill -9, the end "
                "of its container). Its ranks were stopped with it."
                % (label, spec.step_name, what, pid))

    return note


def _local_runtime_pid(spec):
    """The pid of the Metaflow runtime that started this gang on this host, or None: node 0's
    task is its child, a local node agent its grandchild (Linux's /proc says whose)."""
    if spec.backend != "local":
        return None
    if spec.node == 0:
        return os.getppid()
    try:
        with open("/proc/%d/stat" % os.getppid()) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _say(line):
    print(line, file=sys.stderr, flush=True)


def _on_sigterm(watch, signum, frame):
    """A supervising process's SIGTERM handler: noted for the watch's thread (preempt.py)."""
    watch.sigterm()


def _kill_ranks_and_leave(runner, signum, frame):
    """An agent told to stop (node 0 stops the gang) takes its ranks' process groups with it:
    a rank's own children (DataLoader workers, a child that ignores SIGTERM) would outlive it."""
    for slot in runner.slots:
        slot.member.signal_group(signal.SIGKILL)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _running_pid(slot):
    """The pid of `slot`'s process while it runs, else None."""
    return slot.member.pid if slot.member.returncode is None else None


def _forget_round(work_dir, runner, handback):
    """What the ranks of a stopped round left in the gang's directory that the next round's
    watch or hand-back would read as its own: error files, exit statuses, probes, rank 0's
    hand-back."""
    paths = [handback.path] if handback is not None else []
    for slot in runner.slots:
        if slot.rank is not None:
            paths += [slot.error_file, exit_file_of(slot.error_file),
                      stacks.probe_file(work_dir, slot.rank)]
    for path in paths:
        with contextlib.suppress(OSError, TypeError):
            os.remove(path)


def _stop_and_release(runner):
    runner.stop()
    runner.release()


def _say_end(attempt):
    """Tell the other nodes, waiting after their round, that no round follows: they leave
    (local agents are given AGENTS_LEAVE_WAIT s to, before the members are stopped)."""
    _quietly(attempt.control.say_word, ROUND_END)
    agents = [s.member for s in attempt.runner.slots if s.rank is None]
    deadline = time.monotonic() + AGENTS_LEAVE_WAIT
    while any(a.poll() is None for a in agents) and time.monotonic() < deadline:
        time.sleep(0.02)


def _abort_if_failed(attempt):
    """Tell the other nodes to stop, when the gang failed (its first step of teardown)."""
    if attempt.watch.failed():
        _quietly(attempt.control.abort)


def _restore_environ(saved):
    os.environ.clear()
    os.environ.update(saved)


def _aborted():
    return TorchDistributedAborted("another rank of the gang failed; stopping rank 0")


def _format_traceback(ex):
    return "".join(traceback.format_exception(type(ex), ex, ex.__traceback__))


def _ask(fn, *args):
    """A control-plane question while tearing down; False when the store cannot answer."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - the store may be gone; the answer only refines a report
        return False


def _quietly(fn, *args):
    """Best-effort control-plane calls while tearing down: the store may already be gone."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - teardown must go on; the root cause is reported elsewhere
        pass
