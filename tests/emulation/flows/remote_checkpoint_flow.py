"""@checkpoint on a gang of 2 nodes x 1 process on emulated AWS Batch or Kubernetes, under @retry.

Attempt 0: rank 0 writes state.txt into current.checkpoint.directory and saves it; then rank 1
(node 1, under its node agent) is SIGKILLed, or with TD_LOSE_NODE=1 every rank keeps
all-reducing after leaving the mark `saved`, until the test takes node 1 away (each rank leaves
preempted-<rank> once current.torch_distributed.preempted is set).
With TD_PREEMPT=1, attempt 0 instead trains (all_reduce steps) until a rank hears of a preemption
(current.torch_distributed.preempted, or for rank 1 on node 1 its own SIGTERM handler, as a
framework's), then rank 0 saves the step where the gang stands; each rank leaves marks:
training-<rank> once it trains, own-handler-1 (when its handler ran) and preempt-saved-<rank>
(when the save was done).
Attempt 1 (a new multi-node job or JobSet): every rank reads what it finds in its
current.checkpoint.directory, and rank 0 gathers it into `loaded`, with where each rank ran.
TD_MAX_RESTARTS=N gives the gang max_restarts=N: the SIGKILL of rank 1 then restarts the gang in
place, and round 1 of attempt 0 does what attempt 1 does (`restarts` is its restart_count), then
rank 0 writes state.txt again ("saved by rank 0 in round 1") and saves it: a checkpoint of its
own, next to round 0's.
TD_START_METHOD is the step's start_method (exec: every rank, rank 0 included, a spin-step).
Marks go to S3 under TD_MARKS (s3://bucket/prefix; tests/emulation/aws.py: Marks), as a remote
task's would: no node shares a folder with the test. The run's metadata is the metadata
service's (metadata_service.py): @checkpoint reads the run's tags with Metaflow's client when a
task starts, and a remote task reads them there, as on AWS or a cluster."""

import functools
import os
import signal
import time

from metaflow import FlowSpec, checkpoint, current, environment, retry, step, torch_distributed

TD = {k: v for k, v in os.environ.items() if k.startswith("TD_")}
@functools.lru_cache(maxsize=None)
def _s3():
    import boto3

    return boto3.client("s3")


def mark(name, value):
    """Puts the object `name` (repr(value)) under TD_MARKS, with the S3 endpoint and credentials
    the node has (moto's)."""
    bucket, _, prefix = TD["TD_MARKS"][len("s3://"):].partition("/")
    _s3().put_object(Bucket=bucket, Key="%s/%s" % (prefix, name), Body=repr(value).encode())


def train_until_preempted(rank, state):
    import torch
    import torch.distributed as dist

    heard = []
    if rank == 1:  # its own SIGTERM handler, as Lightning and transformers install theirs
        def own_handler(signum, frame):
            heard.append(signum)
            mark("own-handler-1", time.time())

        signal.signal(signal.SIGTERM, own_handler)
    mark("training-%d" % rank, os.getpid())
    step, deadline = 0, time.time() + 150
    while time.time() < deadline:
        told = current.torch_distributed.preempted.is_set() or bool(heard)
        agreed = torch.tensor([1.0 if told else 0.0])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        if agreed.item():
            break
        step += 1
        time.sleep(0.05)
    if rank == 0:
        with open(state, "w") as f:
            f.write("saved by rank 0 at step %d, preempted" % step)
        current.checkpoint.save()
    dist.barrier()
    mark("preempt-saved-%d" % rank, time.time())


class RemoteCheckpointFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @environment(vars=TD)
    @retry(times=1, minutes_between_retries=0)
    @checkpoint
    @torch_distributed(nodes=2, nproc_per_node=1, rendezvous_timeout=60,
                       preempt_grace=float(TD.get("TD_PREEMPT_GRACE", "25")),
                       max_restarts=int(TD.get("TD_MAX_RESTARTS", "0")),
                       start_method=TD.get("TD_START_METHOD"))
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        state = os.path.join(current.checkpoint.directory, "state.txt")
        found = None
        if current.checkpoint.is_loaded:
            with open(state) as f:
                found = f.read()
        self.loaded = current.torch_distributed.gather(
            dict(rank=rank, node=os.environ.get("AWS_BATCH_JOB_NODE_INDEX"),
                 pod=os.environ.get("METAFLOW_KUBERNETES_POD_NAME"), found=found,
                 is_loaded=current.checkpoint.is_loaded))
        first = current.retry_count == 0 and current.torch_distributed.restart_count == 0
        self.restarts = current.torch_distributed.restart_count
        if first and "TD_PREEMPT" in TD:
            train_until_preempted(rank, state)
        elif first:
            if rank == 0:
                with open(state, "w") as f:
                    f.write("saved by rank 0 in attempt 0")
                current.checkpoint.save()
            dist.barrier()
            if "TD_LOSE_NODE" in TD:
                if rank == 1:
                    mark("saved", time.time())
                deadline, marked = time.time() + 120, False
                while time.time() < deadline:  # until node 1 is gone, and its peers with it
                    if current.torch_distributed.preempted.is_set() and not marked:
                        mark("preempted-%d" % rank, time.time())
                        marked = True
                    dist.all_reduce(torch.ones(1))
                    time.sleep(0.05)
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.barrier()
        else:
            # no rank leaves the group while a peer is still in init_process_group (rank 0,
            # which loaded the checkpoint in the task first, can be seconds behind): gloo then
            # fails that peer with "Connection closed by peer"
            if rank == 0 and current.torch_distributed.restart_count:
                with open(state, "w") as f:
                    f.write("saved by rank 0 in round %d"
                            % current.torch_distributed.restart_count)
                current.checkpoint.save()
            dist.barrier()
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    RemoteCheckpointFlow()
