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
# The failing rank fails before its group forms, so its peers wait in the rendezvous instead
# of failing on their own a moment later: its failure is the gang's first. (Mid-collective, a
# peer's script can exit first on a loaded machine, its rank seeing it before the failing rank
# sees its own script's exit: docs/index.md, `run_script`.)
if os.environ.get("TD_SCRIPT_FAIL_RANK") == os.environ["RANK"]:
    print("script of rank %s failing" % os.environ["RANK"], file=sys.stderr, flush=True)
    sys.exit(3)
dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print("script rank %d of %d: sum %d" % (rank, dist.get_world_size(), total.item()), flush=True)
with open(os.path.join(options.out, "sum-%d" % rank), "w") as f:
    f.write(str(int(total.item())))
dist.destroy_process_group()
