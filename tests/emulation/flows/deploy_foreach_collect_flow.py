"""A foreach of two gangs of TD_NODES nodes x 2 processes, each followed by a step before the join
(on Argo Workflows the join finds the last step's task ids by Metaflow's own formula), with
@retry, for `argo-workflows create`."""
import os

from metaflow import FlowSpec, retry, step, torch_distributed


class DeployForeachCollectFlow(FlowSpec):
    @step
    def start(self):
        self.shards = [1, 2]
        self.next(self.train, foreach="shards")

    @retry(times=1, minutes_between_retries=0)
    @torch_distributed(nodes=int(os.environ["TD_NODES"]), nproc_per_node=2)
    @step
    def train(self):
        self.shard = self.input
        self.next(self.collect)

    @step
    def collect(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.shards_seen = sorted(i.shard for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DeployForeachCollectFlow()
