"""GPU check: a gang asking for more GPUs than this host has must fail at start, clearly;
with METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL=1 the same topology runs on CPU with gloo."""

from metaflow import FlowSpec, resources, step, torch_distributed


class TooManyGpusFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @resources(gpu=4)
    @torch_distributed(nodes=2)
    @step
    def train(self):
        import os

        import torch
        import torch.distributed as dist

        if not os.environ.get("METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL"):
            raise AssertionError("the gang must not start without the GPUs")
        dist.init_process_group()  # rehearsal: gloo on CPU, same topology
        t = torch.ones(1)
        dist.all_reduce(t)
        self.total = t.item()
        self.backend = dist.get_backend()
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        print("GPU-REPORT rehearsal total=%s backend=%s" % (self.total, self.backend))


if __name__ == "__main__":
    TooManyGpusFlow()
