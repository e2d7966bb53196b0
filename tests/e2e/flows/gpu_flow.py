"""A GPU topology (@resources(gpu=2) -> 2 processes per node), for the local GPU checks."""

from metaflow import FlowSpec, current, resources, step, torch_distributed


class GpuFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed()
    @resources(gpu=2)
    @step
    def train(self):
        import torch.distributed as dist

        dist.init_process_group()
        self.world = dist.get_world_size()
        self.devices = current.torch_distributed.gather(str(current.torch_distributed.device))
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    GpuFlow()
