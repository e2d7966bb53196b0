"""bench/slurm_launch.py's hand-written baseline: the script `srun torchrun` runs on each node
of an sbatch job. Each rank writes BENCH_MARKS/rank-<rank>.json as bench/flows/slurm_gang.py
does."""

import json
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
formed = time.time()
ones = torch.ones(1)
dist.all_reduce(ones)
with open(os.path.join(os.environ["BENCH_MARKS"], "rank-%d.json" % dist.get_rank()), "w") as f:
    json.dump({"formed": formed, "collective": time.time()}, f)
dist.destroy_process_group()
