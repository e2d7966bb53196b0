"""A gang of TD_NODES x TD_NPROC ranks for `run --with torch_slurm` on the real Slurm cluster
of .ci/slurm. TD_FAIL_RANK raises on that rank after the all-reduce (in attempt
TD_FAIL_ATTEMPT and restart round TD_FAIL_ROUND only, if set; TD_RETRIES is the step's @retry,
TD_MAX_RESTARTS its max_restarts); TD_HANG_RANK sleeps on that rank while the others wait in
all_reduce (TD_HANG_TIMEOUT is the step's hang_timeout); TD_BUSY keeps every rank
in all-reduces for that many seconds (a test cancels the job meanwhile), or until any rank sees
current.torch_distributed.preempted: then every rank prints that it saw it and leaves its body
(TD_PREEMPT_GRACE is the step's preempt_grace). With TD_MARK_DIR, each rank writes
TD_MARK_DIR/training-<rank> (its pid) once it is in that loop."""

import os
import shutil
import socket
import time

from metaflow import FlowSpec, current, environment, retry, step, torch_distributed

TD = {k: v for k, v in os.environ.items() if k.startswith("TD_")}
# The file tests/slurm/conftest.py's OCI bundle has at the root of its filesystem: a process
# that reads it runs in that container.
BUNDLE_MARK = "/td-bundle"


def container():
    """Which test bundle this process runs in (None: none), and whether Slurm's commands
    are there (the bundle hides them, as an image without Slurm would)."""
    mark = open(BUNDLE_MARK).read() if os.path.exists(BUNDLE_MARK) else None
    return [mark, shutil.which("scontrol")]

NODES = int(TD.get("TD_NODES", "2"))
NPROC = int(TD.get("TD_NPROC", "2"))


class SlurmGangFlow(FlowSpec):
    @step
    def start(self):
        self.start_host = socket.gethostname()
        self.start_container = container()
        self.next(self.train)

    @environment(vars=TD)
    @retry(times=int(TD.get("TD_RETRIES", "0")), minutes_between_retries=0)
    @torch_distributed(nodes=NODES, nproc_per_node=NPROC, rendezvous_timeout=60,
                       max_restarts=int(TD.get("TD_MAX_RESTARTS", "0")),
                       hang_timeout=float(TD["TD_HANG_TIMEOUT"]) if TD.get("TD_HANG_TIMEOUT")
                       else None,
                       preempt_grace=float(TD["TD_PREEMPT_GRACE"]) if TD.get("TD_PREEMPT_GRACE")
                       else None)
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        rank = int(os.environ["RANK"])
        print("rank %d says hello from %s" % (rank, socket.gethostname()), flush=True)
        dist.init_process_group("gloo")
        total = torch.tensor([float(rank + 1)])
        if int(TD.get("TD_HANG_RANK", "-1")) == rank:
            print("rank %d hangs outside any collective" % rank, flush=True)
            time.sleep(3600)
        dist.all_reduce(total)
        deadline = time.time() + float(TD.get("TD_BUSY", "0"))
        preempted = current.torch_distributed.preempted
        if TD.get("TD_MARK_DIR"):
            with open(os.path.join(TD["TD_MARK_DIR"], "training-%d" % rank), "w") as f:
                f.write(str(os.getpid()))
        while True:  # every rank makes as many all_reduces: rank 0's clock decides when to stop
            busy = torch.tensor([float(time.time() < deadline)])
            dist.broadcast(busy, src=0)
            told = torch.tensor([float(preempted.is_set())])
            dist.all_reduce(told, op=dist.ReduceOp.MAX)
            if told.item():
                print("rank %d saw the preemption (its own event %s)"
                      % (rank, "set" if preempted.is_set() else "not set yet"), flush=True)
                return  # what a loop that saves on preemption does, after its save
            if not busy.item():
                break
            time.sleep(0.05)
        restart = current.torch_distributed.restart_count
        if int(TD.get("TD_FAIL_RANK", "-1")) == rank and \
                TD.get("TD_FAIL_ATTEMPT", str(current.retry_count)) == str(current.retry_count) \
                and TD.get("TD_FAIL_ROUND", str(restart)) == str(restart):
            raise ValueError("injected failure on rank %d" % rank)
        self.places = current.torch_distributed.gather(dict(
            rank=rank, host=socket.gethostname(), world_size=dist.get_world_size(),
            from_setup=os.environ.get("TD_FROM_SETUP"),
            slurm=sorted(k for k in os.environ if k.startswith("SLURM_")),
            interfaces=(os.environ.get("GLOO_SOCKET_IFNAME"),
                        os.environ.get("NCCL_SOCKET_IFNAME")),
            # the CPUs Slurm bound the node's task to, the threads the rank was given and
            # what torch took from them
            cpus=sorted(os.sched_getaffinity(0)),
            threads=(os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()),
            container=container()))
        self.total = total.item()
        self.attempt = current.retry_count
        self.restarts = restart
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        self.end_container = container()
        print("total %s over %d ranks" % (self.total, len(self.places)))


if __name__ == "__main__":
    SlurmGangFlow()
