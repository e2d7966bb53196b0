"""A gang sized by world_size alone (no GPUs, so one node), each rank drawing a real tqdm bar
on stderr for TD_BAR_SECONDS between plain lines on stdout."""

import os
import sys
import time

from metaflow import FlowSpec, current, step, torch_distributed

WORLD = int(os.environ.get("TD_WORLD", "2"))
BAR_SECONDS = float(os.environ.get("TD_BAR_SECONDS", "8"))
BAR_STEPS = 80


class ProgressFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(world_size=WORLD)
    @step
    def train(self):
        import torch
        import torch.distributed as dist
        from tqdm import tqdm

        dist.init_process_group("gloo")
        gang = current.torch_distributed
        self.places = gang.gather(dict(node_rank=gang.node_rank, local_rank=gang.local_rank,
                                       num_nodes=gang.num_nodes,
                                       local_world_size=gang.local_world_size,
                                       pid=os.getpid(), parent=os.getppid()))
        print("rank %d before the bar" % gang.rank, flush=True)
        for _ in tqdm(range(BAR_STEPS), desc="rank %d" % gang.rank, file=sys.stderr,
                      mininterval=0.05, ascii=True):
            time.sleep(BAR_SECONDS / BAR_STEPS)
        print("rank %d after the bar" % gang.rank, flush=True)
        total = torch.ones(1)
        dist.all_reduce(total)
        self.total = total.item()
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ProgressFlow()
