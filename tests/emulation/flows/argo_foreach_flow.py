"""A foreach of two gangs (2 nodes x 1 process each) for `argo-workflows create`: a step between
the gangs and the join (on Argo the join finds the last step's task ids by Metaflow's own
formula, which a gang's JobSet does not follow)."""

import os

from metaflow import FlowSpec, current, step, torch_distributed


class ArgoForeachFlow(FlowSpec):
    @step
    def start(self):
        self.lrs = [0.1, 0.2]
        self.next(self.train, foreach="lrs")

    @torch_distributed(nodes=2, nproc_per_node=1, rendezvous_timeout=60)
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        value = torch.tensor([self.input])
        dist.all_reduce(value)
        # every rank of a gang sees the gang's own foreach input
        self.seen = current.torch_distributed.gather((
            self.input, int(os.environ["NODE_RANK"]),
            os.environ.get("METAFLOW_KUBERNETES_JOBSET_NAME")))
        self.lr = self.input
        self.sum = value.item()
        dist.destroy_process_group()
        self.next(self.collect)

    @step
    def collect(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.results = sorted((i.lr, i.sum, i.seen) for i in inputs)
        print("results %r" % (self.results,))
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ArgoForeachFlow()
