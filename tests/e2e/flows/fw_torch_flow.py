"""Plain torch on a gang of 2 nodes x 2 processes: DDP over a DistributedSampler, with
init_process_group() and destroy_process_group() and no arguments anywhere.

TD_MODE=alone leaves init_process_group out: every rank then trains alone on all the data,
which the gang must report (an error, or a warning with METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK)."""

import os

from metaflow import FlowSpec, current, step, torch_distributed

ALONE = os.environ.get("TD_MODE") == "alone"


class TorchFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch
        from torch.distributed import destroy_process_group, init_process_group
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, DistributedSampler

        torch.manual_seed(0)
        rows = torch.arange(64.0).unsqueeze(1)
        model = torch.nn.Linear(1, 1)
        if ALONE:
            loader = DataLoader(rows, batch_size=4)
        else:
            init_process_group()
            model = DistributedDataParallel(model)
            loader = DataLoader(rows, batch_size=4, sampler=DistributedSampler(rows))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        seen = []
        for batch in loader:
            seen.extend(int(i) for i in batch[:, 0])
            optimizer.zero_grad()
            model(batch).pow(2).mean().backward()
            optimizer.step()
        weight_sum = float(sum(p.detach().sum() for p in model.parameters()))
        self.ranks = current.torch_distributed.gather(dict(seen=seen, weight_sum=weight_sum))
        if not ALONE:
            destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    TorchFlow()
