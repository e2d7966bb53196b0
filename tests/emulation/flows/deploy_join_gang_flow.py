"""A gang of TD_NODES nodes on a foreach's join, which `step-functions create` refuses for
TD_NODES > 1 (its state reads the foreach's results first)."""
import os

from metaflow import FlowSpec, step, torch_distributed


class DeployJoinGangFlow(FlowSpec):
    @step
    def start(self):
        self.shards = [1, 2]
        self.next(self.train, foreach="shards")

    @step
    def train(self):
        self.shard = self.input
        self.next(self.join)

    @torch_distributed(nodes=int(os.environ["TD_NODES"]), nproc_per_node=2)
    @step
    def join(self, inputs):
        self.shards_seen = sorted(i.shard for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DeployJoinGangFlow()
