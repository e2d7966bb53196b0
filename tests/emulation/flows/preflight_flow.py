import os

from metaflow import FlowSpec, resources, step, torch_distributed


class PreflightFlow(FlowSpec):
    """A 2-node gang whose per-node resources come from TD_CPU and TD_GPU (the preflight's
    cases); its body never runs in the preflight tests."""

    @step
    def start(self):
        self.next(self.train)

    @resources(cpu=int(os.environ.get("TD_CPU", "2")), memory=1024,
               gpu=int(os.environ.get("TD_GPU", "0")))
    @torch_distributed(nodes=2, nproc_per_node=1)
    @step
    def train(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    PreflightFlow()
