"""A gang of TD_NODES nodes x 2 processes, for the deploy commands (step-functions, argo-workflows,
airflow create)."""
import os

from metaflow import FlowSpec, step, torch_distributed


class DeployGangFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=int(os.environ["TD_NODES"]), nproc_per_node=2)
    @step
    def train(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DeployGangFlow()
