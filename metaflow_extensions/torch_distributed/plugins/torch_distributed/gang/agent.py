"""A node other than node 0: its agent starts the node's ranks, checks in with node 0, watches
them, reports how they ended, and with restarts in place waits for node 0's word after each
round. Locally an agent is a spin-step process node 0 started on this host; remotely it is
the command of the node's container (an AWS Batch child node, a JobSet's worker pod)."""

import dataclasses
import functools
import os
import signal
import sys
import time
from types import FrameType
from typing import Any, Callable, NoReturn, Optional, Sequence

from ..core import naming
from ..core import nodefacts as facts
from ..core.failures import Failure, FailureKind, root_cause
from ..core.gangspec import GangSpec
from ..core.topology import Topology
from ..mf import checkpoints, events, nodefacts
from ..runtime import preempt, stacks
from ..runtime.control import ROUND_RESTART, ControlPlane, GangMismatch
from ..runtime.supervisor import POLL_INTERVAL, AgentWatch
from .common import NODES_STOP_WAIT, ask, quietly, say, wait_for_nodes
from .runner import NodeRunner, forget_round


class Agent:
    """A node other than node 0: starts the node's ranks, checks in, watches, reports."""

    def __init__(self, spec: GangSpec, topology: Topology,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.topology = topology
        self.clock, self.sleep = clock, sleep  # its waits (tests drive them)

    def run(self, step_func: Callable[..., object], args: Sequence[Any],
            decorator_name: str) -> int:
        """Run the node; the process exit status to leave with."""
        with stacks.ignoring_dumps():  # until each rank's body registers it
            return self._run(step_func, args, decorator_name)

    def _run(self, step_func: Callable[..., object], args: Sequence[Any],
             decorator_name: str) -> int:
        refused = self._same_as_node_0()
        if refused is not None:
            return refused
        runner = NodeRunner(self.spec, self.topology, step_func, args, decorator_name)
        runner.start_ranks(range(self.topology.nproc_per_node))
        runner.capture(naming.agent_label(self.spec.node))
        old_handler = signal.signal(signal.SIGTERM,
                                    functools.partial(_kill_ranks_and_leave, runner))
        # node 0's requests for every rank's stacks, followed across rounds
        on_demand = stacks.OnDemand(say, lambda: [s.member.pid for s in runner.slots])
        try:
            try:
                control = ControlPlane.of_attempt(self.spec.attempt,
                                                  self.spec.blueprint.rendezvous_timeout_s)
            except (GangMismatch, RuntimeError) as ex:
                print("cannot reach node 0 at %s:%d: %s"
                      % (self.spec.attempt.master_addr, self.spec.attempt.master_port, ex),
                      file=sys.stderr)
                return 2
            while True:
                supervisor = self._watch_round(runner, control, on_demand)
                code = self._end_round(runner, control, supervisor)
                # with restarts in place every node waits for node 0's word after a round
                if not (self.spec.blueprint.max_restarts and supervisor.preempted is None
                        and self._next_round(runner, control, supervisor)):
                    return code
                control = control.for_round(self.spec.restart_count)
        finally:
            preempt.withdraw()
            runner.stop()
            runner.release()
            signal.signal(signal.SIGTERM, old_handler)

    def _same_as_node_0(self) -> Optional[int]:
        """Before this node starts a rank: compare what it runs with (nodefacts.py) with what
        node 0 reported. None when it is the same and every other node said so too; else the
        exit status to leave with, having started no rank: a node that differs tells node 0
        why it refuses (the step's root cause). Its own connection to node 0's store, closed
        before any rank is forked."""
        spec, timeout = self.spec, self.spec.blueprint.rendezvous_timeout_s
        try:
            control = ControlPlane.of_attempt(spec.attempt, timeout)
        except (GangMismatch, RuntimeError) as ex:
            print("cannot reach node 0 at %s:%d: %s"
                  % (spec.attempt.master_addr, spec.attempt.master_port, ex), file=sys.stderr)
            return 2
        mine = nodefacts.gather(spec.blueprint.step_name, spec.node, os.environ,
                                spec.cuda_visible_devices)
        reference = control.facts(0, timeout)
        if reference is None:
            print("node 0 reported nothing of what it runs with within %.0f s; leaving the gang"
                  % timeout, file=sys.stderr, flush=True)
            return 2
        found = facts.differences(facts.NodeFacts.from_dict(reference), mine)
        short = facts.gpu_shortfall(mine, spec.accelerator, self.topology.nproc_per_node)
        if not found and short is None:
            control.report_checked(spec.node)
            # no rank of any node runs the step's code before every node was checked
            if wait_for_nodes(control, self.topology.nodes, timeout, self.clock, self.sleep):
                return None
            print("node 0 stopped the gang before every node was checked; starting no rank",
                  file=sys.stderr, flush=True)
            return self._exit_code(3, told_node_0=True)
        message = facts.refusal(spec.node, found, short, self.topology.describe())
        print("node %d %s" % (spec.node, message), file=sys.stderr, flush=True)
        told = ask(control.report_failure, spec.node,
                   Failure(None, spec.node, FailureKind.DIFFERS, time.time(),
                           message=message)) is not False
        return self._exit_code(1, told)

    def _watch_round(self, runner: NodeRunner, control: ControlPlane,
                     on_demand: stacks.OnDemand) -> AgentWatch:
        """Check this node's ranks of the round in with node 0 and watch them until the round
        ended for this node (the watch, ended)."""
        self._wait_for_exec_ranks(runner, control)
        # beat before joining: node 0 never sees this node joined and silent, unless
        # it went silent (AgentWatch beats on from here)
        control.beat(self.spec.node)
        control.join(naming.node_join_id(self.spec.node))
        joined_at = time.time()
        if not self.spec.attempt.local:
            print("joined the gang of node 0 at %s:%d%s" % (
                self.spec.attempt.master_addr, self.spec.attempt.master_port,
                " (round %d)" % control.round if control.round else ""), flush=True)
        hang_timeout = self.spec.blueprint.hang_timeout_s
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

    def _end_round(self, runner: NodeRunner, control: ControlPlane,
                   supervisor: AgentWatch) -> int:
        """Tell node 0 how this node's round ended; the exit status to leave with if no round
        follows."""
        if supervisor.aborted:
            print("node 0 aborted the gang; stopping this node's ranks", file=sys.stderr)
            self._stop_ranks(runner, control)
            if supervisor.preempted is not None:
                self._outlast_node_0(control)
            return self._exit_code(3, told_node_0=True)
        if supervisor.failed():
            # which ranks were still running: a hung one among them may be the cause
            quietly(control.report_running, self.spec.node, supervisor.running_ranks())
            told = ask(control.report_failure, self.spec.node,
                        root_cause(supervisor.failures)) is not False
            if supervisor.preempted is not None:
                self._outlast_node_0(control)  # its ranks keep their grace meanwhile
            self._stop_ranks(runner, control)
            return self._exit_code(1, told)
        control.finish(self.spec.node)
        return 0

    def _stop_ranks(self, runner: NodeRunner, control: ControlPlane) -> None:
        """(A round that failed or was aborted.) Stop this node's ranks, then tell node 0 which
        of them failed on their own: one may have raised its own error just as node 0's abort
        came, which the watch, ended by the abort, never reported (node 0 would call it
        stopped). Said before this node's output ends, which node 0 waits for."""
        runner.stop()
        quietly(control.report_own_failures, self.spec.node, runner.own_failures())

    def _next_round(self, runner: NodeRunner, control: ControlPlane,
                    supervisor: AgentWatch) -> bool:
        """(Restarts in place, the round over for this node.) Stop its ranks, tell node 0, and
        wait for node 0's word: True once the next round's ranks of this node started, with
        their restart_count and the checkpoint node 0 loaded for the round; False when node 0
        ends the attempt (its word, or its store gone) or a SIGTERM reached this node."""
        runner.stop()
        forget_round(self.spec.work_dir, runner, None)
        if supervisor.sigterm_at is not None:  # told to stop as its ranks stopped
            quietly(control.report_preempted, self.spec.node)
            return False
        if ask(control.report_stopped, self.spec.node) is False:
            return False
        deadline = self.clock() + self.spec.blueprint.rendezvous_timeout_s + NODES_STOP_WAIT
        word = None
        while word is None and self.clock() < deadline:
            if supervisor.sigterm_at is not None:  # told to stop: node 0 must not restart
                quietly(control.report_preempted, self.spec.node)
                return False
            try:
                word = control.word()
            except Exception:  # noqa: BLE001 - any error of the store's: node 0 is gone
                return False
            if word is None:
                self.sleep(POLL_INTERVAL)
        if word != ROUND_RESTART:
            return False
        spec = dataclasses.replace(self.spec, restart_count=control.round + 1)
        if spec.attempt.checkpoint is not None:  # the latest checkpoint, as node 0 loaded it
            fields = control.for_round(spec.restart_count).checkpoint(
                spec.blueprint.rendezvous_timeout_s)
            if fields is None:
                print("node 0 published no checkpoint for round %d; leaving the gang"
                      % spec.restart_count, file=sys.stderr, flush=True)
                return False
            spec = checkpoints.install_member(spec.with_attempt(checkpoint=fields))
        self.spec = spec
        runner.new_round(spec)
        runner.start_ranks(range(self.topology.nproc_per_node))
        return True

    def _outlast_node_0(self, control: ControlPlane) -> None:
        """(After a preemption, on Kubernetes.) Wait for node 0's task to end (its store goes
        away), within the grace the pods have. A deleted worker pod fails its Job, and with it
        the JobSet, once its process ends; Metaflow then stops following the task, and node 0,
        still recording the attempt as preempted, is not heard (docs/reliability.md)."""
        if self.spec.attempt.backend != "kubernetes":
            return
        deadline = self.clock() + self.spec.blueprint.preempt_grace_s + preempt.STOP_MARGIN_S
        while self.clock() < deadline:
            try:
                control.aborted()
            except Exception:  # noqa: BLE001 - any error of the store's: node 0 is gone
                return
            self.sleep(0.2)

    def _preempt_node(self, runner: NodeRunner, control: ControlPlane, origin: int,
                      at: Optional[float] = None) -> None:
        """(The watch's thread.) This node's ranks get SIGTERM and the preemption's grace; a
        SIGTERM of this node's own is told to node 0, which preempts the whole gang."""
        preempt.leave_mark(self.spec.work_dir)
        self.watch.preempt(origin, self.spec.blueprint.preempt_grace_s, at)
        preempt.forward([s.member for s in runner.slots])
        if origin == self.spec.node:
            quietly(control.report_preempted, self.spec.node)
        print("preempted (SIGTERM to node %d): this node's ranks get SIGTERM" % origin,
              file=sys.stderr, flush=True)

    def _wait_for_exec_ranks(self, runner: NodeRunner, control: ControlPlane) -> None:
        """A node joins once its ranks are ready: exec'd ranks import Metaflow and torch first
        and check in with node 0 themselves (forked ones are ready at once). Node 0 counts the
        step's @timeout from the last join (usertimer.py), so this keeps their start-up off it.
        A rank that exits first, or node 0's abort, ends the wait: the watch reports those, and
        node 0's rendezvous timeout bounds it."""
        if self.spec.start_method != "exec":
            return
        pending = {naming.rank_join_id(s.rank) for s in runner.slots if s.rank is not None}
        deadline = self.clock() + self.spec.blueprint.rendezvous_timeout_s
        while pending and self.clock() < deadline:
            pending = {j for j in pending if not control.joined(j)}
            if not pending or control.aborted() or any(
                    s.member.poll() is not None for s in runner.slots):
                return
            self.sleep(POLL_INTERVAL)

    def _exit_code(self, code: int, told_node_0: bool) -> int:
        """The exit status of a node that failed or was aborted. On Kubernetes a failed worker
        Job fails the whole JobSet at once, and its controller then stops the control pod
        before node 0 has written the task's root cause and logs: a worker pod that node 0
        knows about leaves the verdict to node 0's Job (docs/kubernetes.md, "Semantics")."""
        return 0 if self.spec.attempt.backend == "kubernetes" and told_node_0 else code

    def _send_record(self, runner: NodeRunner, control: ControlPlane,
                     joined_at: float) -> None:
        """Give node 0 this node's share of the gang's record: through the store from another
        machine, as a file in the gang's directory on node 0's own host."""
        if self.spec.attempt.local:
            quietly(events.write_json, events.node_file(self.spec.work_dir, self.spec.node),
                    runner.node_record(joined_at).to_dict())
        else:
            quietly(control.send_node_events, self.spec.node,
                    runner.node_record(joined_at, self.spec.work_dir).to_dict())


def run_local_agent(spec: GangSpec, topology: Topology, step_func: Callable[..., object],
                    args: Sequence[Any], decorator_name: str) -> NoReturn:
    """The body of a node agent node 0 forked on this host (Leader._start_local_agent): the
    node's place, its checkpoint, its ranks; it leaves with the agent's exit status."""
    raise SystemExit(Agent(checkpoints.install_member(spec), topology).run(
        step_func, args, decorator_name))


def _on_sigterm(watch: AgentWatch, signum: int, frame: Optional[FrameType]) -> None:
    """A supervising process's SIGTERM handler: noted for the watch's thread (preempt.py)."""
    watch.sigterm()


def _kill_ranks_and_leave(runner: NodeRunner, signum: int,
                          frame: Optional[FrameType]) -> None:
    """An agent told to stop (node 0 stops the gang) takes its ranks' process groups with it:
    a rank's own children (DataLoader workers, a child that ignores SIGTERM) would outlive it."""
    for slot in runner.slots:
        slot.member.signal_group(signal.SIGKILL)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
