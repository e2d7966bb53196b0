"""A gang of 2 nodes x 2 that trains until it is preempted, saves in the preemption's window,
and resumes on its retry. Every step, the ranks agree (an all_reduce of max) whether any of them
was told, so they all save at the same step: what a real loop does.

Each rank writes $TD_MARK_DIR/running-<rank>-<attempt> ({pid, ppid}) once training, and
$TD_MARK_DIR/checkpoint-<rank>.json ({step, at, own_handler}) when it saves. Rank 2 installs a
SIGTERM handler of its own (as a framework does): it replaces the gang's, and it runs (it writes
$TD_MARK_DIR/own-handler-2, the time). The
other ranks look at current.torch_distributed.preempted. Attempt 1 trains 5 steps from its
checkpoint and keeps where it resumed. TD_RANK0_LEAVES_FIRST: in attempt 0, rank 0 leaves its
body at once (writing $TD_MARK_DIR/rank0-left) and the others wait, without collectives, to be
told."""

import json
import os
import signal
import time

from metaflow import FlowSpec, current, retry, step, torch_distributed

MARKS = os.environ["TD_MARK_DIR"]


def train_steps(dist, torch, start, attempt, preempted, told_me, saved, own_handler):
    """Steps until preempted (attempt 0: then save, None) or 5 steps from `start`."""
    step_no = start
    while attempt == 0 or step_no < start + 5:
        told = torch.tensor([1.0 if (preempted.is_set() or told_me) else 0.0])
        dist.all_reduce(told, op=dist.ReduceOp.MAX)
        if told.item():
            with open(saved, "w") as f:
                json.dump({"step": step_no, "at": time.time(), "own_handler": bool(told_me)}, f)
            deadline = time.time() + 5
            while own_handler and not told_me and time.time() < deadline:
                time.sleep(0.01)  # rank 2 stays until its own SIGTERM came (the agreement
                # may have told it first), as a framework that acts on its signal would
            return None  # saved: the gang fails the attempt as preempted
        step_no += 1
        time.sleep(0.02)
    return step_no


class PreemptFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @retry(times=1, minutes_between_retries=0)
    @torch_distributed(nodes=2, nproc_per_node=2,
                       preempt_grace=float(os.environ.get("TD_PREEMPT_GRACE", "20")))
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        rank = int(os.environ["RANK"])
        attempt = current.retry_count
        saved = os.path.join(MARKS, "checkpoint-%d.json" % rank)
        start = 0
        if os.path.exists(saved):
            with open(saved) as f:
                start = json.load(f)["step"]
        told_me = []
        if rank == 2:
            def own_handler(signum, frame):  # a framework's, replacing the gang's
                told_me.append(time.time())
                with open(os.path.join(MARKS, "own-handler-2"), "w") as f:
                    f.write(repr(time.time()))
            signal.signal(signal.SIGTERM, own_handler)
        dist.init_process_group("gloo")
        preempted = current.torch_distributed.preempted
        with open(os.path.join(MARKS, "running-%d-%d" % (rank, attempt)), "w") as f:
            json.dump({"pid": os.getpid(), "ppid": os.getppid()}, f)
        self.resumed_from = start
        if os.environ.get("TD_RANK0_LEAVES_FIRST") and attempt == 0:
            # rank 0 is done with its body; the others work on, with no collective, until told
            if rank == 0:
                open(os.path.join(MARKS, "rank0-left"), "w").close()
            else:
                while not (preempted.is_set() or told_me):
                    time.sleep(0.02)
                with open(saved, "w") as f:
                    json.dump({"step": 0, "at": time.time(), "own_handler": bool(told_me)}, f)
            self.steps = None
        else:
            self.steps = train_steps(dist, torch, start, attempt, preempted, told_me, saved,
                                     own_handler=rank == 2)
        if self.steps is not None:
            dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        print("resumed from", self.resumed_from)


if __name__ == "__main__":
    PreemptFlow()
