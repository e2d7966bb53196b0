"""A gang of 2 nodes x 2 processes for `run --with batch` against the emulated AWS Batch.

The launching environment's TD_* variables choose the topology and failures; @environment
carries them into the Batch job, so every node imports this file with the same values.
TD_FAIL_RANK raises on that rank (in attempt TD_FAIL_ATTEMPT only, if set), or with
TD_FAIL_HOW=oom allocates until the OOM killer of its container's cgroup ends it (nodes as
hosts: a memory cgroup per node, limited to the job's memory); TD_BUSY keeps every
rank in all-reduces for that many seconds (a test stops a node meanwhile, once each rank says
it all-reduced once). TD_INTRUDER (the path
of tests/intruder.py): rank 0 starts it first, an outside process that reached the gang's store
with MASTER_ADDR and MASTER_PORT only; it writes to TD_INTRUDER_DIR (`-`: to rank 0's log, as the
tests give it). TD_HANG_RANK sleeps on that rank while the others wait in all_reduce;
TD_HANG_TIMEOUT is the step's hang_timeout.
TD_START_METHOD is the step's start_method (exec: every rank, rank 0 included, a spin-step).
TD_MAX_RESTARTS is the step's max_restarts; TD_FAIL_ROUND fails TD_FAIL_RANK in that round of a
restart in place only. TD_LATE_ROUND: in that round, node 1's ranks say so and wait before
joining the process group (a test cuts node 1 off meanwhile)."""

import os
import runpy
import sys
import time

from metaflow import FlowSpec, current, environment, retry, step, torch_distributed

TD = {k: v for k, v in os.environ.items()
      if k.startswith("TD_") or k == "METAFLOW_TORCH_DISTRIBUTED_HEARTBEAT_TIMEOUT"}
NODES = int(TD.get("TD_NODES", "2"))
NPROC = int(TD.get("TD_NPROC", "2"))
RETRIES = int(TD.get("TD_RETRIES", "0"))
TIMEOUT = int(TD.get("TD_RENDEZVOUS_TIMEOUT", "60"))


def failing(rank):
    restart = current.torch_distributed.restart_count
    return (int(TD.get("TD_FAIL_RANK", "-1")) == rank
            and TD.get("TD_FAIL_ATTEMPT", str(current.retry_count)) == str(current.retry_count)
            and TD.get("TD_FAIL_ROUND", str(restart)) == str(restart))


class BatchGangFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @environment(vars=TD)
    @retry(times=RETRIES, minutes_between_retries=0)
    @torch_distributed(nodes=NODES, nproc_per_node=NPROC, rendezvous_timeout=TIMEOUT,
                       hang_timeout=float(TD["TD_HANG_TIMEOUT"]) if TD.get("TD_HANG_TIMEOUT")
                       else None, max_restarts=int(TD.get("TD_MAX_RESTARTS", "0")),
                       start_method=TD.get("TD_START_METHOD"))
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        rank = int(os.environ["RANK"])
        print("rank %d says hello from batch node %s" % (rank, os.environ.get("AWS_BATCH_JOB_NODE_INDEX")))
        print("rank %d writes to stderr" % rank, file=sys.stderr)
        before_gather = runpy.run_path(TD["TD_INTRUDER"])["intrude_from"](
            rank, NODES * NPROC, NODES, TD["TD_INTRUDER_DIR"]) if TD.get("TD_INTRUDER") \
            else (lambda: None)
        if TD.get("TD_LATE_ROUND") == str(current.torch_distributed.restart_count) \
                and os.environ["NODE_RANK"] == "1":
            print("rank %d waits before joining round %s" % (rank, TD["TD_LATE_ROUND"]),
                  flush=True)
            time.sleep(600)
        dist.init_process_group("gloo")
        total = torch.tensor([float(rank + 1)])
        if int(TD.get("TD_HANG_RANK", "-1")) == rank:
            print("rank %d hangs outside any collective" % rank, flush=True)
            time.sleep(3600)
        dist.all_reduce(total)
        if TD.get("TD_BUSY"):  # a test that stops a node mid-training waits for this line
            print("rank %d all-reduced once" % rank, flush=True)
        deadline = time.time() + float(TD.get("TD_BUSY", "0"))
        while True:  # every rank makes as many all_reduces: rank 0's clock decides when to stop
            busy = torch.tensor([float(time.time() < deadline)])
            dist.broadcast(busy, src=0)
            if not busy.item():
                break
            time.sleep(0.05)
        if failing(rank):
            print("last words of rank %d" % rank, file=sys.stderr, flush=True)
            if TD.get("TD_FAIL_HOW") == "oom":  # until its container's OOM killer ends it
                hog = []
                while True:
                    hog.append(b"\x01" * (64 << 20))
            raise ValueError("injected failure on rank %d" % rank)
        before_gather()
        self.places = current.torch_distributed.gather(dict(
            rank=rank,
            node_rank=int(os.environ["NODE_RANK"]),
            batch_node=os.environ.get("AWS_BATCH_JOB_NODE_INDEX"),
            job=os.environ.get("AWS_BATCH_JOB_ID", "").split("#")[0],
            master=(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
            world_size=dist.get_world_size(),
        ))
        self.total = total.item()
        self.attempt = current.retry_count
        self.restarts = current.torch_distributed.restart_count
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        print("total %s over %d ranks" % (self.total, len(self.places)))


if __name__ == "__main__":
    BatchGangFlow()
