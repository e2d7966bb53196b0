"""Lightning Fabric with no arguments on a gang of 2 nodes x 2 processes: Fabric() forms the
group, setup_dataloaders shards 64 indexed rows, 16 per rank."""

from metaflow import FlowSpec, current, step, torch_distributed


class FabricFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch
        from lightning.fabric import Fabric

        fabric = Fabric()
        fabric.launch()
        fabric.seed_everything(0)
        model, optimizer = fabric.setup(*_model_and_optimizer(torch))
        loader = fabric.setup_dataloaders(
            torch.utils.data.DataLoader(torch.arange(64.0).unsqueeze(1), batch_size=4))
        seen = []
        for batch in loader:
            seen.extend(int(i) for i in batch[:, 0])
            optimizer.zero_grad()
            fabric.backward(model(batch).pow(2).mean())
            optimizer.step()
        self.ranks = current.torch_distributed.gather(dict(
            world_size=fabric.world_size, global_rank=fabric.global_rank,
            strategy=type(fabric.strategy).__name__, seen=seen,
            weight_sum=float(sum(p.detach().sum() for p in model.parameters()))))
        self.next(self.end)

    @step
    def end(self):
        pass


def _model_and_optimizer(torch):
    model = torch.nn.Linear(1, 1)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)


if __name__ == "__main__":
    FabricFlow()
