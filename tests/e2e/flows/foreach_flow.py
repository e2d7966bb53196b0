"""A foreach of gangs: one 2-process gang per learning rate, joined as ordinary branches, with
merge_artifacts as Metaflow's own MergeArtifactsTest does."""

from metaflow import FlowSpec, current, step, torch_distributed


class ForeachGangs(FlowSpec):
    @step
    def start(self):
        self.lrs = [1.0, 10.0]
        self.next(self.train, foreach="lrs")

    @torch_distributed(nproc_per_node=2)
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.tensor([self.input * (dist.get_rank() + 1)])
        dist.all_reduce(t)
        self.lr = self.input
        self.total = t.item()
        self.port = current.torch_distributed.master_port
        dist.destroy_process_group()
        self.next(self.join)

    @step
    def join(self, inputs):
        # what the branches share merges (the gang keeps nothing of its own as an artifact)
        self.merge_artifacts(inputs, exclude=["lr", "total", "port"])
        self.merged_lrs = self.lrs
        self.results = sorted((i.lr, i.total) for i in inputs)
        self.ports = [i.port for i in inputs]
        self.n_inputs = len(list(inputs))
        self.next(self.end)

    @step
    def end(self):
        print("results", self.results)


if __name__ == "__main__":
    ForeachGangs()
