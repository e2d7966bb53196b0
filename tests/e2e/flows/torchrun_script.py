"""A script as torchrun runs it: the group from the environment, one all_reduce, its result in
--out/sum-RANK. Exits with code 3 on the rank named by TD_SCRIPT_FAIL_RANK."""

import argparse
import os
import sys

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--verbose", action="store_true")
options = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
if os.environ.get("TD_SCRIPT_FAIL_RANK") == str(rank):
    print("script of rank %d failing" % rank, file=sys.stderr, flush=True)
    sys.exit(3)
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print("script rank %d of %d: sum %d" % (rank, dist.get_world_size(), total.item()), flush=True)
with open(os.path.join(options.out, "sum-%d" % rank), "w") as f:
    f.write(str(int(total.item())))
dist.destroy_process_group()
