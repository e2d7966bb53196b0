"""A gang whose rank 0 adds a component to the step's card with current.card.append (as a user
building a report card does): the user's own card must come back exactly as built, and the
gang's card (type and id torch_distributed) must be there beside it, without the user asking.

TD_CARD_CREATE_FAILS=1: Metaflow's `card create` cannot run (this file exits with 3 when it
is loaded for that command), as where the task's environment lacks what the command needs."""

import os
import sys

from metaflow import FlowSpec, current, step, torch_distributed
from metaflow.cards import Markdown

if os.environ.get("TD_CARD_CREATE_FAILS") and "card" in sys.argv and "create" in sys.argv:
    sys.exit(3)


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
