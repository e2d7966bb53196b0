"""Train a small model with plain torch DDP on random data, as a 2-process gang.

    python examples/ddp_flow.py --no-pylint run

No num_parallel, no node index, no join of node tasks: rank 0's `self.*` become the step's
artifacts, and `end` reads them like any other step's.
"""

from metaflow import FlowSpec, current, step, torch_distributed


class DDPExample(FlowSpec):
    @step
    def start(self):
        self.epochs = 3
        self.next(self.train)

    @torch_distributed(nproc_per_node=2)
    @step
    def train(self):
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

        dist.init_process_group()  # env:// : the gang's environment says everything
        torch.manual_seed(0)
        x = torch.randn(512, 16)
        y = x @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
        data = TensorDataset(x, y)
        sampler = DistributedSampler(data)  # num_replicas and rank come from the group
        loader = DataLoader(data, batch_size=32, sampler=sampler)
        model = DDP(torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for epoch in range(self.epochs):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                loss.backward()
                opt.step()
        # Per-rank values reach rank 0 without hand-written collectives.
        self.final_losses = current.torch_distributed.gather(loss.item())
        self.samples_per_rank = len(sampler)
        self.state_dict = {k: v.cpu() for k, v in model.module.state_dict().items()}
        print("rank %d done, loss %.4f" % (dist.get_rank(), loss.item()))
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        print("final loss of every rank:", ["%.4f" % l for l in self.final_losses])
        print("samples per rank:", self.samples_per_rank)
        print("trained weights:", self.state_dict["weight"].shape)


if __name__ == "__main__":
    DDPExample()
