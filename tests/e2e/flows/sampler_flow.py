"""Plain torch with no arguments anywhere: DistributedSampler shards 64 items over the gang."""

from metaflow import FlowSpec, current, step, torch_distributed


class SamplerFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch.distributed as dist
        from torch.utils.data import DistributedSampler

        dist.init_process_group()
        seen = list(DistributedSampler(list(range(64)), shuffle=False))
        self.shards = current.torch_distributed.gather(seen)
        self.world = dist.get_world_size()
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SamplerFlow()
