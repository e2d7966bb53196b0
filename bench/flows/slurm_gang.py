"""bench/slurm_launch.py's flow: a gang of 2 nodes x 2 on Slurm (`run --with torch_slurm`).
Each rank writes BENCH_MARKS/rank-<rank>.json with the time its process group formed and its
first all_reduce completed (wall clock, this machine's: every Slurm node of .ci/slurm is a
namespace of it)."""

import json
import os
import time

from metaflow import FlowSpec, step, torch_distributed


class SlurmBenchFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        formed = time.time()
        ones = torch.ones(1)
        dist.all_reduce(ones)
        with open(os.path.join(os.environ["BENCH_MARKS"], "rank-%d.json" % dist.get_rank()),
                  "w") as f:
            json.dump({"formed": formed, "collective": time.time()}, f)
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SlurmBenchFlow()
