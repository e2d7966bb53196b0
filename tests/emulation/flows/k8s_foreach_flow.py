"""A foreach of two gangs (2 nodes x 1 process each) on the emulated Kubernetes."""

import os

from metaflow import FlowSpec, current, environment, step, torch_distributed

# @environment carries it into the pods, so every pod imports this file with the same value
TIMEOUT = os.environ.get("TD_RENDEZVOUS_TIMEOUT", "60")


class KubernetesForeachFlow(FlowSpec):
    @step
    def start(self):
        self.lrs = [0.1, 0.2]
        self.next(self.train, foreach="lrs")

    @environment(vars={"TD_RENDEZVOUS_TIMEOUT": TIMEOUT})
    @torch_distributed(nodes=2, nproc_per_node=1, rendezvous_timeout=int(TIMEOUT))
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        value = torch.tensor([self.input])
        dist.all_reduce(value)
        # every rank of a gang sees the gang's own foreach input
        self.seen = current.torch_distributed.gather((
            self.input, os.environ["MASTER_PORT"],
            os.environ.get("METAFLOW_KUBERNETES_JOBSET_NAME")))
        self.lr = self.input
        self.sum = value.item()
        dist.destroy_process_group()
        self.next(self.join)

    @step
    def join(self, inputs):
        self.results = sorted((i.lr, i.sum, i.seen) for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    KubernetesForeachFlow()
