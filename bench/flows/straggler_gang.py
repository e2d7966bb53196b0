"""A 2 x 2 gang that trains for BENCH_SECONDS with an all_reduce per step, for
bench/straggler_detect.py. BENCH_SLOW_RANK sleeps BENCH_SLOW_S before each step; with
BENCH_BY_TURNS=1 the rank that sleeps is the step's number modulo the world size instead (no
straggler). Rank 0 writes the time its group formed to $BENCH_MARK_DIR/formed."""

import os
import time

from metaflow import FlowSpec, step, torch_distributed


class StragglerGang(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        dist.barrier()
        rank, world = dist.get_rank(), dist.get_world_size()
        if rank == 0:
            with open(os.path.join(os.environ["BENCH_MARK_DIR"], "formed"), "w") as f:
                f.write(repr(time.time()))
        pause = float(os.environ.get("BENCH_SLOW_S", "0.5"))
        slow_rank = int(os.environ.get("BENCH_SLOW_RANK", "-1"))
        turns = bool(os.environ.get("BENCH_BY_TURNS"))
        end = time.time() + float(os.environ.get("BENCH_SECONDS", "90"))
        i = 0
        while True:
            go = torch.tensor([1.0 if time.time() < end else 0.0])
            dist.all_reduce(go, op=dist.ReduceOp.MIN)  # every rank stops at the same step
            if not go.item():
                break
            if rank == (i % world if turns else slow_rank):
                time.sleep(pause)
            dist.all_reduce(torch.ones(1))
            i += 1
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    StragglerGang()
