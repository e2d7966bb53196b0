"""A gang of TD_NODES nodes on the start step, which `step-functions create` refuses for
TD_NODES > 1 (its state sets up the run's parameters first)."""
import os

from metaflow import FlowSpec, step, torch_distributed


class DeployStartGangFlow(FlowSpec):
    @torch_distributed(nodes=int(os.environ["TD_NODES"]), nproc_per_node=2)
    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DeployStartGangFlow()
