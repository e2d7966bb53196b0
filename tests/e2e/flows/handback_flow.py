"""Rank 0 runs in a process of its own, forked by the Metaflow task (or, under the start method
exec, a spin-step the task started), and what its body leaves
reaches the task as if the body had run there: a large artifact (written once, by rank 0), a
foreach out of the ganged step, and a body that changes what only its own process should see
(it ignores SIGCHLD, so the kernel reaps its children; it empties os.environ).

TD_LEAVE=sys_exit: rank 0 leaves with sys.exit(0) after self.next() (a finished rank, as on
every other rank). TD_LEAVE=os_exit: rank 0 leaves with os._exit(0), handing back nothing."""

import hashlib
import os
import signal
import subprocess
import sys

from metaflow import FlowSpec, current, step, torch_distributed

BIG = 20 * 1024 * 1024
LEAVE = os.environ.get("TD_LEAVE")  # read before rank 0's body empties os.environ


class HandbackFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(world_size=2)
    @step
    def train(self):
        import psutil
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        self.shards = ["a", "b", "c"]
        # the attempt's secret, in this rank's environment or a child's (issue 37, point 7)
        secret = current.torch_distributed._secret
        child = subprocess.run([sys.executable, "-c", "import os; print(repr(dict(os.environ)))"],
                               capture_output=True, text=True, check=True).stdout
        self.secret_in_env = current.torch_distributed.gather(
            [any(secret in v for v in os.environ.values()), secret in child])
        if rank == 0:
            me = psutil.Process()
            mine, parents = me.cmdline(), me.parent().cmdline()
            # forked by the task: its parent runs the same command line; exec'd: a spin-step
            # of the task (`step train`)
            self.rank0_started_by = ("fork" if parents == mine else "exec" if
                                     "spin-step" in mine and "step" in parents
                                     and "spin-step" not in parents else "?")
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
            self.big = os.urandom(BIG)  # incompressible: stored as large as it is
            self.big_sha = hashlib.sha256(self.big).hexdigest()
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            os.environ.clear()
        self.next(self.each, foreach="shards")

    def next(self, *steps, **kwargs):
        """self.next(), then (TD_LEAVE) the way out of the body after it: a step's last line
        must be its self.next() (Metaflow's graph check)."""
        super().next(*steps, **kwargs)
        if self._current_step != "train":
            return
        if LEAVE == "sys_exit":  # every rank: a finished rank, whichever it is
            sys.exit(0)
        if LEAVE == "os_exit" and int(os.environ.get("RANK", "0")) == 0:
            sys.stdout.flush()
            os._exit(0)

    @step
    def each(self):
        self.shard = self.input
        self.next(self.join)

    @step
    def join(self, inputs):
        self.shards_seen = sorted(i.shard for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    HandbackFlow()
