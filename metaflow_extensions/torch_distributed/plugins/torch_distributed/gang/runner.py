"""One node's ranks: started (forked or exec'd) by its supervisor, their output carried into the
supervisor's own, stopped, and started again for the next round of a restart in place."""

import contextlib
import dataclasses
import functools
import os
import sys
import threading
import time

from ..core import naming
from ..core.envcontract import Rendezvous, foreign_launcher_vars, rank_env
from ..core.gangspec import GangSpec, Role
from ..mf import current as current_mod
from ..mf import events
from ..mf.spinstep import member_command
from ..runtime import interrupt, stacks
from ..runtime.control import loopback_interface
from ..runtime.procs import OutputPump, exit_file_of, fork_member, spawn_member, stop_members
from ..runtime.remote_logs import LogShipper
from ..runtime.supervisor import Slot
from .rank import rank_info, run_handing_back, run_rank_body

# Seconds a stopped member gets between SIGTERM and SIGKILL.
STOP_GRACE = 1.0
# Seconds to copy the last output of exited members into the task's log.
DRAIN_TIMEOUT = 5.0


class NodeRunner:
    """Starts the ranks of one node (all, or all but local rank 0 on node 0) and carries their
    output. Forks happen here, before any thread of this process is started."""

    def __init__(self, spec: GangSpec, topology, step_func, args, decorator_name,
                 handback=None):
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
        remote = not spec.attempt.local and spec.node != 0
        if remote:
            import torch.distributed  # noqa: F401
        # Node 0's pump keeps each rank's last lines for the gang's card.
        tee = (lambda: LogShipper(spec)) if remote else (
            lambda: events.TailKeeper(events.tails_file(spec.work_dir))) if spec.node == 0 else None
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
        attempt = self.spec.attempt
        return Rendezvous(attempt.master_addr, attempt.master_port, attempt.gang_id,
                          self.spec.restart_count, self.spec.blueprint.max_restarts)

    def error_file(self, rank):
        return os.path.join(self.spec.work_dir, "error-rank-%d.json" % rank)

    def env_of(self, local_rank):
        rank = self.topology.rank(self.spec.node, local_rank)
        return rank_env(self.topology, self.spec.node, local_rank, self.rendezvous(),
                        accelerator=self.spec.accelerator, error_file=self.error_file(rank),
                        cuda_visible_devices=self.spec.cuda_visible_devices,
                        base_env=os.environ, cpu_count=os.cpu_count() or 1,
                        loopback_interface=loopback_interface()
                        if self.spec.attempt.local else None)

    def start_ranks(self, local_ranks, close_fds=()):
        local_ranks = list(local_ranks)
        restarts = self.spec.blueprint.max_restarts
        if restarts and self.spec.start_method == "fork" and self.pipes is None:
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
                    Role.RANK, naming.hidden_task_id(self.spec.attempt.task.task_id,
                                                     self.spec.node, local_rank),
                    local_rank=local_rank)
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

    def new_round(self, spec: GangSpec):
        """Forget the ranks of the round that ended (every one stopped): the next round's are
        started with `spec`, its restart_count one more."""
        self.spec = spec
        self.slots = [s for s in self.slots if s.rank is None]
        self.stop_started = None
        self.stopped = []

    def command(self, role: Role, hidden_task_id, **fields):
        spec = dataclasses.replace(self.spec, role=role, **fields)
        return member_command(spec, hidden_task_id, self.decorator_name, self.base_env)

    def _body(self, local_rank):
        def body():
            current_mod.install(rank_info(self.spec, self.topology, local_rank))
            run_rank_body(self.spec, self.topology, local_rank, self.step_func, self.args)
        if self.handback is None or (self.spec.node, local_rank) != (0, 0):
            return body
        return functools.partial(run_handing_back, body, self.handback)

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
        info = events.node_info(self.spec.node, self.spec.attempt.master_addr, os.environ)
        return events.node_record(info, self.slots, self.spawned, joined_at, work_dir)


def stop_and_release(runner):
    runner.stop()
    runner.release()


def forget_round(work_dir, runner, handback):
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
                    % (label, spec.blueprint.step_name, what, pid))
        return ("%s @torch_distributed on step *%s*: %s (pid %d) died without a word: it was "
                "killed by a signal it cannot catch (SIGKILL: the OOM killer, a kill -9, the end "
                "of its container). Its ranks were stopped with it."
                % (label, spec.blueprint.step_name, what, pid))

    return note


def _local_runtime_pid(spec):
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
