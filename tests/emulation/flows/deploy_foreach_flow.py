"""A foreach of two gangs of TD_NODES nodes x 2 processes, for `step-functions create`."""
import os

from metaflow import FlowSpec, step, torch_distributed


class DeployForeachFlow(FlowSpec):
    @step
    def start(self):
        self.shards = [1, 2]
        self.next(self.train, foreach="shards")

    @torch_distributed(nodes=int(os.environ["TD_NODES"]), nproc_per_node=2)
    @step
    def train(self):
        self.shard = self.input
        self.next(self.join)

    @step
    def join(self, inputs):
        self.shards_seen = sorted(i.shard for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DeployForeachFlow()
