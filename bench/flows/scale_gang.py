"""A gang of BENCH_NODES emulated nodes x BENCH_NPROC ranks on this host (bench/scale.py), its
body in scale_body.py.

torch.distributed is imported with the flow, as a training flow does: every process that
loads the flow (node 0's task, each node agent) has it before the gang forks its ranks, which
then share it instead of importing it each (the store client of gather needs it). The
members start the product's way on Linux (start method fork); locally every node agent is a
spin-step process of its own."""

import os

import torch.distributed  # noqa: F401

from metaflow import FlowSpec, current, step, torch_distributed

import scale_body
import work

NODES = int(os.environ.get("BENCH_NODES", "1"))
NPROC = int(os.environ.get("BENCH_NPROC", "8"))


class ScaleGang(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=NODES, nproc_per_node=NPROC, start_method="fork")
    @step
    def train(self):
        scale_body.run(current.torch_distributed,
                       work.task_created() if current.torch_distributed.is_main else None)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ScaleGang()
