"""One node's ranks: started (forked or exec'd) by its supervisor, their output carried into the
supervisor's own, stopped, and started again for the next round of a restart in place."""

import contextlib
import dataclasses
import functools
import os
import sys
import threading
import time
from math import inf
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..core import naming
from ..core.gangspec import SLURM_BACKEND
from ..core.devices import usable_cpus
from ..core.envcontract import Rendezvous, foreign_launcher_vars, rank_env
from ..core.failures import Failure, FailureKind, from_exit
from ..core.gangspec import GangSpec, Role
from ..core.topology import Topology
from ..mf import current as current_mod
from ..mf import events
from ..mf.spinstep import member_command
from ..runtime import interrupt, preempt, stacks
from ..runtime.control import interface_toward, loopback_interface
from ..runtime.procs import (
    OutputPump,
    SignalSetup,
    Sink,
    exit_file_of,
    fork_member,
    spawn_member,
    stop_members,
)
from ..runtime.remote_logs import LogShipper
from ..runtime.supervisor import Slot
from .rank import HandBack, rank_info, run_handing_back, run_rank_body

# Seconds a stopped member gets between SIGTERM and SIGKILL.
STOP_GRACE = 1.0
# ... and a local node agent: it stops its own ranks (STOP_GRACE) and tells node 0 which of
# them failed on their own (Agent._stop_ranks) before it leaves. One that left at once is
# not waited for.
AGENT_STOP_GRACE = STOP_GRACE + 2.0
# Seconds to copy the last output of exited members into the task's log.
DRAIN_TIMEOUT = 5.0


class NodeRunner:
    """Starts the ranks of one node (all, or all but local rank 0 on node 0) and carries their
    output. Forks happen here, before any thread of this process is started."""

    def __init__(self, spec: GangSpec, topology: Topology, step_func: Callable[..., object],
                 args: Sequence[Any], decorator_name: str,
                 handback: Optional[HandBack] = None) -> None:
        self.spec = spec
        # node 0's rank 0, forked: what its process hands back to the task (mf/handback.py)
        self.handback = handback
        self.topology = topology
        self.step_func = step_func
        self.args = args
        self.decorator_name = decorator_name
        self.base_env = dict(os.environ)  # what exec'd members start from
        # what forked members start with in every round, before this process's own handlers
        self.signals = SignalSetup.of_this_process()
        self.slots: List[Slot] = []
        # A remote node also ships its output to node 0, whose task log Metaflow keeps. The
        # shipper's store client needs torch: import it before the pump is forked.
        remote = not spec.attempt.local and spec.node != 0
        if remote:
            import torch.distributed  # noqa: F401
        # Node 0's pump keeps each rank's last lines for the gang's card.
        tee: Optional[Callable[[], Sink]] = None
        if remote:
            tee = lambda: LogShipper(spec)  # noqa: E731
        elif spec.node == 0:
            tee = lambda: events.TailKeeper(events.tails_file(spec.work_dir))  # noqa: E731
        self.pump = OutputPump(tee=tee)
        # On Slurm, a node has several interfaces as often as not (Ethernet, InfiniBand,
        # management): gloo and NCCL use the one that reaches node 0 (backends/slurm.py).
        self.node_interface = interface_toward(spec.attempt.master_addr) \
            if spec.attempt.backend == SLURM_BACKEND else None
        self.saved_fds: Optional[Tuple[int, int]] = None
        # With restarts in place, each local rank's stdout and stderr are pipes of this node,
        # not of one process: {local rank: its pipes}, closed as this node releases its output.
        self.pipes: Optional[Dict[int, RankPipes]] = None
        self.spawned: Dict[int, float] = {}  # rank -> when its process was started
        self.stop_started: Optional[float] = None
        self.stopped: List[str] = []
        # The watch's thread, a watchdog and the main thread may each stop and release: the
        # first does it, the others wait for it (stop) or find it done (release).
        self._stop_lock = threading.Lock()
        self._release_lock = threading.Lock()

    def rendezvous(self) -> Rendezvous:
        attempt = self.spec.attempt
        return Rendezvous(attempt.master_addr, attempt.master_port, attempt.gang_id,
                          self.spec.restart_count, self.spec.blueprint.max_restarts)

    def error_file(self, rank: int) -> str:
        return os.path.join(self.spec.work_dir, "error-rank-%d.json" % rank)

    @functools.cached_property
    def node_cpu_count(self) -> int:
        """The CPUs this node's ranks share (OMP_NUM_THREADS divides them): those this process
        may use, whatever a container's quota or a cpuset leaves of the machine; nodes emulated
        on this host share its CPUs."""
        cpus, _ = usable_cpus()
        return max(1, cpus // self.topology.nodes) if self.spec.attempt.local else cpus

    def env_of(self, local_rank: int) -> Dict[str, str]:
        rank = self.topology.rank(self.spec.node, local_rank)
        return rank_env(self.topology, self.spec.node, local_rank, self.rendezvous(),
                        accelerator=self.spec.accelerator, error_file=self.error_file(rank),
                        cuda_visible_devices=self.spec.cuda_visible_devices,
                        base_env=os.environ, cpu_count=self.node_cpu_count,
                        loopback_interface=loopback_interface()
                        if self.spec.attempt.local else None,
                        node_interface=self.node_interface)

    def start_ranks(self, local_ranks: Iterable[int],
                    close_fds: Sequence[int] = ()) -> List[Slot]:
        local_ranks = list(local_ranks)
        restarts = self.spec.blueprint.max_restarts
        if restarts and self.pipes is None:
            self.pipes = {lr: RankPipes.open() for lr in local_ranks}
        for local_rank in local_ranks:
            rank = self.topology.rank(self.spec.node, local_rank)
            label = naming.rank_label(rank)
            env = self.env_of(local_rank)
            pipes = self.pipes[local_rank] if self.pipes else None
            write_ends = None if pipes is None else pipes.write_ends()
            if self.spec.start_method == "fork":
                member = fork_member(label, self._body(local_rank), env,
                                     remove_env=foreign_launcher_vars(os.environ),
                                     error_file=self.error_file(rank),
                                     close_fds=[*close_fds, *self._open_pipe_fds()],
                                     pipes=write_ends, signals=self.signals)
            else:
                argv, spawn_env = self.command(
                    Role.RANK, naming.hidden_task_id(self.spec.attempt.task.task_id,
                                                     self.spec.node, local_rank),
                    local_rank=local_rank, **self._handback_fields(local_rank))
                spawn_env.update(env)
                for key in foreign_launcher_vars(spawn_env):
                    del spawn_env[key]
                member = spawn_member(label, argv, spawn_env, error_file=self.error_file(rank),
                                      pipes=write_ends)
            if pipes is not None:
                member.stdout_fd, member.stderr_fd = pipes.out_read, pipes.err_read
            self.spawned[rank] = time.time()
            self.slots.append(Slot(member, self.spec.node, rank, local_rank, self.error_file(rank)))
        return self.slots

    def slot_of(self, rank: int) -> Slot:
        """The slot of this node's rank `rank` in the running round (local node agents' slots
        come first from the second round on)."""
        return next(s for s in self.slots if s.rank == rank)

    def member_fds(self) -> List[int]:
        """Every fd this node holds for its members' output (their pipes' read ends, and with
        restarts in place both ends): what a process it forks must not keep."""
        fds = [fd for s in self.slots for fd in (s.member.stdout_fd, s.member.stderr_fd)
               if fd is not None]
        return sorted(set(fds + self._open_pipe_fds()))

    def _open_pipe_fds(self) -> List[int]:
        return [fd for pipes in (self.pipes or {}).values() for fd in pipes.open_fds()]

    def new_round(self, spec: GangSpec) -> None:
        """Forget the ranks of the round that ended (every one stopped): the next round's are
        started with `spec`, its restart_count one more."""
        self.spec = spec
        preempt.clear_stop_mark(spec.work_dir)
        self.slots = [s for s in self.slots if s.rank is None]
        self.stop_started = None
        self.stopped = []

    def command(self, role: Role, hidden_task_id: str,
                **fields: Any) -> Tuple[List[str], Dict[str, str]]:
        spec = dataclasses.replace(self.spec, role=role, **fields)
        return member_command(spec, hidden_task_id, self.decorator_name, self.base_env)

    def _handback_fields(self, local_rank: int) -> Dict[str, Any]:
        """The GangSpec fields of an exec'd rank: node 0's rank 0 hands its results back."""
        if self.handback is None or (self.spec.node, local_rank) != (0, 0):
            return {}
        return {"handback_path": self.handback.path, "keep_failed": self.handback.keep_failed}

    def _body(self, local_rank: int) -> Callable[[], None]:
        def body() -> None:
            current_mod.install(rank_info(self.spec, self.topology, local_rank))
            run_rank_body(self.spec, self.topology, local_rank, self.step_func, self.args)
        if self.handback is None or (self.spec.node, local_rank) != (0, 0):
            return body
        return functools.partial(run_handing_back, body, self.handback)

    def capture(self, own_label: str, close_in_pump: Sequence[int] = ()) -> None:
        """Send every member's output, and this process's own (as `own_label`), through the
        pump into this process's original stdout and stderr. Forks the pump: call it before
        this process starts any thread."""
        sys.stdout.flush()
        sys.stderr.flush()
        for slot in self.slots:
            # A node agent prefixes its ranks' lines itself.
            prefix = slot.member.label if slot.rank is not None else ""
            for fd, target in ((slot.member.stdout_fd, 1), (slot.member.stderr_fd, 2)):
                if fd is not None:
                    self.pump.add(fd, prefix, target)
        own = [os.pipe(), os.pipe()]
        for (r, _), target in zip(own, (1, 2)):
            self.pump.add(r, own_label, target)
        self.pump.start(close_in_child=[w for _, w in own] + list(close_in_pump) + [
                            fd for pipes in (self.pipes or {}).values()
                            for fd in pipes.write_ends()],
                        orphan_note=_orphan_note(own_label, self.spec, os.getpid()))
        for pipes in (self.pipes or {}).values():
            pipes.out_read = pipes.err_read = None  # closed by the pump's start: the pump's now
        self.saved_fds = (os.dup(1), os.dup(2))
        for (_, w), fd in zip(own, (1, 2)):
            os.dup2(w, fd)
            os.close(w)

    def release(self) -> None:
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

    def stop(self, ranks_only: bool = False) -> Tuple[float, List[str]]:
        """Stop the members still running (with `ranks_only`, the ranks, not local node agents:
        a restart in place keeps the nodes). Returns (when the first stop began, the labels of
        every member stopped so far): the watch may have stopped some before the main thread."""
        with self._stop_lock:
            if self.stop_started is None:
                self.stop_started = time.time()
            agents = {id(s.member) for s in self.slots if s.rank is None}
            preempt.leave_stop_mark(self.spec.work_dir)
            self.stopped += stop_members(
                [s.member for s in self.slots if s.rank is not None or not ranks_only],
                lambda m: AGENT_STOP_GRACE if id(m) in agents else STOP_GRACE)
        return self.stop_started, list(self.stopped)

    def own_failures(self) -> List[Failure]:
        """The failures of this node's ranks that ended and failed on their own: a rank failed
        on its own if it ended, or recorded its exception, before the node stopped it (the
        watch may have stopped watching by then), or if what it recorded is an error of its
        own. A stop ends a rank by a signal, never by an exception, so only a symptom (a peer
        went away) can be the stop's doing: ranks that raise the same error a few ms apart (a
        framework's check) all raised it, whichever the watch saw first."""
        stopped_at = self.stop_started if self.stop_started is not None else inf
        own = []
        for slot in self.slots:
            code = slot.member.poll() if slot.rank is not None else None
            if not code:  # an agent, still running, or finished
                continue
            failure = from_exit(slot.rank, slot.node, slot.local_rank, code, time.time(),
                                slot.error_file)
            if (slot.member.label not in self.stopped
                    or (failure.kind is FailureKind.EXCEPTION
                        and (failure.detected_at < stopped_at or not failure.is_symptom()))):
                own.append(failure)
        return own

    def node_record(self, joined_at: Optional[float],
                    work_dir: Optional[str] = None) -> events.NodeRecord:
        """This node's share of the gang's record (events.py)."""
        info = events.node_info(self.spec.node, self.spec.attempt.master_addr, os.environ)
        return events.NodeRecord.of_node(info, self.slots, self.spawned, joined_at, work_dir)


@dataclasses.dataclass
class RankPipes:
    """The stdout and stderr pipes of one local rank for every round of a restart in place:
    the write ends held by the node for each round's process, the read ends the pump's (None
    here once the pump has them)."""

    out_read: Optional[int]
    out_write: int
    err_read: Optional[int]
    err_write: int

    @classmethod
    def open(cls) -> "RankPipes":
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        return cls(out_read, out_write, err_read, err_write)

    def write_ends(self) -> Tuple[int, int]:
        return self.out_write, self.err_write

    def open_fds(self) -> List[int]:
        return [fd for fd in (self.out_read, self.out_write, self.err_read, self.err_write)
                if fd is not None]


def stop_and_release(runner: NodeRunner) -> None:
    runner.stop()
    runner.release()


def forget_round(work_dir: str, runner: NodeRunner, handback: Optional[HandBack]) -> None:
    """What the ranks of a stopped round left in the gang's directory that the next round's
    watch or hand-back would read as its own: error files, exit statuses, probes, rank 0's
    hand-back."""
    paths = [handback.path] if handback is not None else []
    for slot in runner.slots:
        if slot.rank is not None:
            paths += [slot.error_file, exit_file_of(slot.error_file),
                      stacks.probe_file(work_dir, slot.rank)]
    for path in paths:
        if path is not None:
            with contextlib.suppress(OSError):
                os.remove(path)


def _orphan_note(label: str, spec: GangSpec, pid: int) -> Callable[[], str]:
    """What the pump of this process says if it dies without a word: a callable, asked when it
    died (the run may have been interrupted meanwhile, see interrupt.mark_interrupts)."""
    what = ("the node agent of node %d" % spec.node if spec.node != 0
            else "the Metaflow task process of node 0")
    runtime = _local_runtime_pid(spec)

    def note() -> str:
        stopped = read_stop_mark(spec.work_dir, spec.node) if spec.node != 0 else None
        if stopped is not None:  # node 0 stopped it, and said why: no death of its own
            return ("%s @torch_distributed on step *%s*: %s (pid %d) was stopped by node 0: %s"
                    % (label, spec.blueprint.step_name, what, pid, stopped))
        if runtime is not None and interrupt.was_interrupted(runtime):
            return ("%s @torch_distributed on step *%s*: %s (pid %d) was ended by Metaflow: the "
                    "run was interrupted (a SIGINT to its process), and Metaflow kills the tasks "
                    "still running 5 s later. Its ranks were stopped with it."
                    % (label, spec.blueprint.step_name, what, pid))
        return ("%s @torch_distributed on step *%s*: %s (pid %d) died without a word: it was "
                "killed by a signal it cannot catch (SIGKILL: the OOM killer, a kill -9, the end "
                "of its container). Its ranks were stopped with it."
                % (label, spec.blueprint.step_name, what, pid))

    return note


def stop_mark(work_dir: str, node: int) -> str:
    """Where node 0 says why it stopped the local agent of `node` (the gang's directory)."""
    return os.path.join(work_dir, "stopped-node-%d" % node)


def read_stop_mark(work_dir: str, node: int) -> Optional[str]:
    try:
        with open(stop_mark(work_dir, node), encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def mark_agent_stops(runner: NodeRunner, failure: Failure,
                     joined: Callable[[int], bool]) -> None:
    """Before node 0 stops the gang: leave, for each agent of a node on this host, why node 0
    stops it, where the agent's pump reads it if the agent ends without a word (_orphan_note):
    a member node 0 stopped at the rendezvous deadline did not join in time, it was not killed
    by SIGKILL or the OOM killer. `joined(node)`: whether that node's agent joined the gang."""
    blueprint = runner.spec.blueprint
    cause = failure.describe().splitlines()[0].rstrip(".")
    for slot in runner.slots:
        if slot.rank is not None or slot.node == 0:
            continue
        if joined(slot.node):
            why = "the gang failed (%s)" % cause
        elif failure.kind is FailureKind.MISSING:
            why = ("it did not join the gang within the rendezvous timeout of %ss, and node 0 "
                   "stops every member that has not joined at that deadline" %
                   blueprint.rendezvous_timeout_s)
        else:
            why = "it had not joined the gang yet when the gang failed (%s)" % cause
        if runner.spec.start_method == "exec" and not joined(slot.node):
            why += ("; an agent joins once its ranks have started, and under start_method exec "
                    "each rank first imports Metaflow, the flow and torch, which takes seconds "
                    "on a loaded machine")
        try:
            with open(stop_mark(runner.spec.work_dir, slot.node), "w", encoding="utf-8") as f:
                f.write(why + ". Its ranks were stopped with it.")
        except OSError:  # the gang's directory is gone: the gang is tearing down
            pass


def _local_runtime_pid(spec: GangSpec) -> Optional[int]:
    """The pid of the Metaflow runtime that started this gang on this host, or None: node 0's
    task is its child, a local node agent its grandchild (Linux's /proc says whose)."""
    if not spec.attempt.local:
        return None
    if spec.node == 0:
        return os.getppid()
    try:
        with open("/proc/%d/stat" % os.getppid()) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
