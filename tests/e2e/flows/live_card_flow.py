"""A 2 nodes x 2 gang that trains for about TD_STEPS x TD_STEP_S seconds, every rank saying its
progress and recording a loss each step, rank 0 printing a line every 10 steps: what the
gang's live card shows while it runs (tests/e2e/test_live_card.py)."""

import os
import time

from metaflow import FlowSpec, current, step, torch_distributed

STEPS = int(os.environ.get("TD_STEPS", "60"))
STEP_S = float(os.environ.get("TD_STEP_S", "0.4"))


class LiveCardFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        gang = current.torch_distributed
        total = torch.zeros(1)
        for i in range(STEPS):
            time.sleep(STEP_S)
            one = torch.ones(1)
            dist.all_reduce(one)
            total += one
            gang.progress(i + 1, total=STEPS)
            gang.record("loss", 1.0 / (i + 1))
            if gang.rank == 0 and (i + 1) % 10 == 0:
                print("step %d of %d" % (i + 1, STEPS), flush=True)
        self.total = total.item()
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    LiveCardFlow()
