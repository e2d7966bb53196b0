"""HF Accelerate with no arguments on a CPU gang of 2 nodes x 2 processes: Accelerator() forms
one group of 4 processes (not 4 processes alone), prepare() shards 64 indexed rows."""

from metaflow import FlowSpec, current, step, torch_distributed


class AccelerateFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch
        import torch.distributed as dist
        from accelerate import Accelerator

        accelerator = Accelerator()
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        loader = torch.utils.data.DataLoader(torch.arange(64.0).unsqueeze(1), batch_size=4)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        seen = []
        for batch in loader:
            seen.extend(int(i) for i in batch[:, 0])
            optimizer.zero_grad()
            accelerator.backward(model(batch).pow(2).mean())
            optimizer.step()
        self.ranks = current.torch_distributed.gather(dict(
            num_processes=accelerator.num_processes, process_index=accelerator.process_index,
            distributed_type=str(accelerator.distributed_type),
            group_size=dist.get_world_size(), seen=seen,
            weight_sum=float(sum(p.detach().sum() for p in model.parameters()))))
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    AccelerateFlow()
