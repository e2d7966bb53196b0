"""The old way, num_parallel, in front of a @torch_distributed step: rejected with a fix.
With TD_PARALLEL_DECORATOR set, the step also carries Metaflow's @parallel itself."""

import os

from metaflow import FlowSpec, parallel, step, torch_distributed


def maybe_parallel(f):
    return parallel(f) if os.environ.get("TD_PARALLEL_DECORATOR") else f


class ParallelFlow(FlowSpec):
    @step
    def start(self):
        print("start step ran")
        self.next(self.train, num_parallel=2)

    @torch_distributed(nproc_per_node=2)
    @maybe_parallel
    @step
    def train(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ParallelFlow()
