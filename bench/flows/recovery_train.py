"""The training of tests/e2e/flows/checkpoint_flow.py as a torchrun script, for bench/recovery.py.

A tiny linear model trained with DDP on gloo for 60 steps; rank 0 saves every 10 steps to
RECOVERY_CKPT (a file, with a rename: what a torchrun user writes); BENCH_KILL_RANK is SIGKILLed
at step 35 in the first round (TORCHELASTIC_RESTART_COUNT 0). A restarted round loads the file.
Marks in TD_MARK_DIR: killed-at, and first-step-<round>-rank-<rank> when each rank's first
step of a round began (the same names as the flow's).
"""

import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS, EVERY = 60, 10


def mark(name, value):
    with open(os.path.join(os.environ["TD_MARK_DIR"], name), "w") as f:
        f.write(repr(value))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    first = 0
    path = os.environ["RECOVERY_CKPT"]
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        first = state["step"]
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for i in range(first, STEPS):
        if restart == 0 and rank == int(os.environ.get("BENCH_KILL_RANK", -1)) and i == 35:
            mark("killed-at", time.time())
            os.kill(os.getpid(), signal.SIGKILL)
        if i == first:
            mark("first-step-%d-rank-%d" % (restart, rank), time.time())
        gen = torch.Generator().manual_seed(1000 * i + rank)
        x = torch.randn(16, 8, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True)).backward()
        opt.step()
        if (i + 1) % EVERY == 0:
            dist.barrier()
            if rank == 0:
                torch.save({"model": model.state_dict(), "step": i + 1}, path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
