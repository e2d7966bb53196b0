"""One rank's body, in the process its node started: its events recorded, its probe and
stack dumps set up, and on node 0's rank 0 its results handed back to the task."""

import dataclasses
import functools
import os
import signal
import sys
from typing import Any, Callable, NoReturn, Optional, Sequence

from ..core import naming
from ..core.errors import TorchDistributedAborted
from ..core.gangspec import SLURM_BACKEND, GangSpec
from ..core.topology import Topology
from ..mf import current as current_mod
from ..mf import events, groupcheck, internals
from ..mf import handback as rank0_results
from ..runtime import preempt, rendezvous_seal, stacks
from ..runtime.control import ControlPlane
from ..runtime.procs import run_member_body
from .common import NODES_STOP_WAIT, wait_for_nodes


def run_rank_body(spec: GangSpec, topology: Topology, local_rank: int,
                  step_func: Callable[..., object], args: Sequence[Any]) -> None:
    """A rank's step body, its events recorded for the gang's card, its probe (stacks.py)
    telling its node's watch where it stands while hang detection is on."""
    rank = topology.rank(spec.node, local_rank)
    # torch's own rendezvous through the gang's store opens only what members wrote
    rendezvous_seal.install(spec.blueprint.step_name, spec.attempt.secret, spec.attempt.gang_id,
                            spec.restart_count)
    # node 0's rank 0 unwinds on the gang's stop (its finally blocks run, what @catch keeps is
    # handed back); every other rank ends at once
    preempt.install_rank_handler(spec.work_dir, on_stop=_raise_aborted
                                 if (spec.node, local_rank) == (0, 0) else None,
                                 scheduler_signals_all=spec.attempt.backend == SLURM_BACKEND)
    if spec.node == 0 and topology.nodes > 1 and not spec.restart_count:
        _wait_for_every_node(spec, topology)
    probe = None
    if spec.blueprint.hang_timeout_s:
        hang_timeout = spec.blueprint.hang_timeout_s
        probe = stacks.Probe(stacks.probe_file(spec.work_dir, rank),
                             stacks.interval_for(hang_timeout), rank,
                             stacks.history_after(hang_timeout),
                             live=functools.partial(events.live_of_rank, rank == 0)).start()
    dumps = stacks.register_dump()  # stacks on demand
    try:
        events.run_recorded(rank, events.rank_file(spec.work_dir, rank),
                            lambda: groupcheck.run_body(
                                step_func, args, spec.blueprint.step_name, topology,
                                default_mode=spec.blueprint.group_check_default,
                                on_join=events.note_join))
    finally:
        if dumps:
            stacks.unregister_dump()
        if probe is not None:
            probe.stop()


def _wait_for_every_node(spec: GangSpec, topology: Topology) -> None:
    """(A rank of node 0, the gang's first round.) Until every other node's agent found that
    it runs with what node 0 does (Agent._same_as_node_0): a node that differs fails the gang
    before any rank runs the step's code. The gang's stop ends the wait as it ends a body."""
    control = ControlPlane.of_attempt(spec.attempt, spec.blueprint.rendezvous_timeout_s)
    if not wait_for_nodes(control, topology.nodes, spec.blueprint.rendezvous_timeout_s
                          + NODES_STOP_WAIT):
        raise aborted()


def run_handing_back(body: Callable[[], object], handback: "HandBack") -> None:
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


def _send_quietly(sender: rank0_results.Sender) -> None:
    """Hand back a failed body's artifacts for @catch; the body's own failure is the step's."""
    try:
        sender.send()
    except Exception as ex:  # noqa: BLE001 - the step fails with the body's error anyway
        print("could not hand back the artifacts of the failed body: %s: %s"
              % (type(ex).__name__, ex), file=sys.stderr, flush=True)


def _raise_aborted() -> NoReturn:
    raise aborted()


@dataclasses.dataclass
class HandBack:
    """Where rank 0's process sends what its body produced (mf/handback.py): the task's flow
    and its output datastore; `keep_failed` when @catch keeps a failed body's artifacts."""
    flow: Any  # Metaflow's flow object
    task_datastore: Any  # Metaflow's TaskDataStore of the attempt
    keep_failed: bool = False
    path: Optional[str] = None  # in the gang's work directory, set by Leader.run

    def sender(self) -> rank0_results.Sender:
        return rank0_results.Sender(self.flow, self.task_datastore, self._path())

    def receive(self) -> bool:
        return rank0_results.receive(self.flow, self.task_datastore, self._path())

    def _path(self) -> str:
        if self.path is None:
            raise RuntimeError("a hand-back is given its path when the gang starts (Leader.run)")
        return self.path


def rank_info(spec: GangSpec, topology: Topology,
              local_rank: int) -> current_mod.TorchDistributedInfo:
    """`current.torch_distributed` of the rank `local_rank` of the member `spec`'s node."""
    attempt = spec.attempt
    return current_mod.TorchDistributedInfo(topology, spec.node, local_rank, attempt.master_addr,
                                            attempt.master_port, spec.accelerator,
                                            attempt.gang_id, attempt.secret, spec.restart_count)


def run_exec_rank(spec: GangSpec, topology: Topology, step_func: Callable[..., object],
                  args: Sequence[Any], flow: Any) -> int:
    """The body of an exec'd rank (start method exec), a spin-step of the task whose flow is
    `flow`: check in, run the step, exit status. Node 0's rank 0 hands its results back to the
    task, its artifacts saved into the task's own datastore."""
    local_rank = spec.local_rank
    if local_rank is None:
        raise RuntimeError("an exec'd rank is started with its local rank (NodeRunner)")
    rank = topology.rank(spec.node, local_rank)
    # its check-in is its round's (a restart in place starts every rank again)
    control = ControlPlane.of_attempt(spec.attempt, spec.blueprint.rendezvous_timeout_s)
    control.for_round(spec.restart_count).join(naming.rank_join_id(rank))
    current_mod.install(rank_info(spec, topology, local_rank))

    def body() -> None:
        run_rank_body(spec, topology, local_rank, step_func, args)

    if spec.handback_path is not None:
        task = spec.attempt.task
        handback = HandBack(flow, internals.task_output_datastore(
            flow.name, task.orig_datastore, task.run_id, spec.blueprint.step_name,
            task.task_id, task.retry_count), spec.keep_failed, spec.handback_path)
        return run_member_body(functools.partial(run_handing_back, body, handback),
                               os.environ.get("TORCHELASTIC_ERROR_FILE"))
    return run_member_body(body, os.environ.get("TORCHELASTIC_ERROR_FILE"))


def aborted() -> TorchDistributedAborted:
    return TorchDistributedAborted("another rank of the gang failed; stopping rank 0")
