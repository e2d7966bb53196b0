"""Two gang steps of TD_NODES nodes x 2 processes in one flow, for the deploy commands: each
step compiles to a gang of its own (one multi-node Batch job or one JobSet per step)."""
import os

from metaflow import FlowSpec, step, torch_distributed


class DeployTwoGangsFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.pretrain)

    @torch_distributed(nodes=int(os.environ["TD_NODES"]), nproc_per_node=2)
    @step
    def pretrain(self):
        self.next(self.finetune)

    @torch_distributed(nodes=int(os.environ["TD_NODES"]), nproc_per_node=2)
    @step
    def finetune(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    DeployTwoGangsFlow()
