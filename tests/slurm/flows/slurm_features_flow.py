"""What a gang step has on AWS Batch, on Slurm (tests/slurm/test_slurm_features.py): HF
Accelerate's Accelerator() with no arguments over a 2 x 2 gang, a card of the user's beside the
gang's own, and @catch around a gang whose rank 3 (node 1) raises."""

from metaflow import FlowSpec, card, catch, current, step, torch_distributed
from metaflow.cards import Markdown


class SlurmFeaturesFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @card(type="blank")
    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch.distributed as dist
        from accelerate import Accelerator

        accelerator = Accelerator()
        self.ranks = current.torch_distributed.gather(dict(
            num_processes=accelerator.num_processes, process_index=accelerator.process_index,
            distributed_type=str(accelerator.distributed_type),
            group_size=dist.get_world_size()))
        if accelerator.process_index == 0:
            current.card.append(Markdown("built on rank 0"))
        self.next(self.caught)

    @catch(var="failure")
    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def caught(self):
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_rank() == 3:
            raise ValueError("rank 3 fails on purpose")
        dist.barrier()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SlurmFeaturesFlow()
