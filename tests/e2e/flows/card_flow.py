"""A gang whose rank 0 adds a component to the step's card with current.card.append (as a user
building a report card does): the user's own card must come back exactly as built, and the
gang's card (type and id torch_distributed) must be there beside it, without the user asking."""

from metaflow import FlowSpec, current, step, torch_distributed
from metaflow.cards import Markdown


class CardFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(world_size=2)
    @step
    def train(self):
        import torch.distributed as dist

        dist.init_process_group()
        dist.barrier()
        if current.torch_distributed.rank == 0:
            current.card.append(Markdown("79"))
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    CardFlow()
