"""Plain torch that forgets init_process_group on a gang of 2 nodes x 2 processes: every rank
trains alone on all 64 rows, which the gang must report (an error, or a warning with
METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK=warn). The right way, DDP over a DistributedSampler, is
the flow of docs/frameworks/torch.md and the sampler flow of test_local_gang.py."""

from metaflow import FlowSpec, current, step, torch_distributed


class TorchFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch
        from torch.utils.data import DataLoader

        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        seen = []
        for batch in DataLoader(torch.arange(64.0).unsqueeze(1), batch_size=4):
            seen.extend(int(i) for i in batch[:, 0])
            optimizer.zero_grad()
            model(batch).pow(2).mean().backward()
            optimizer.step()
        self.ranks = current.torch_distributed.gather(dict(seen=seen))
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    TorchFlow()
