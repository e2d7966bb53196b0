"""Shard a model with FSDP (torch's `fully_shard`, FSDP2) over a 2-process gang.

    python examples/fsdp_flow.py --no-pylint run

It runs on CPU with gloo. The same code runs on GPUs: give the step @resources(gpu=N) (or run it
where GPUs are visible) and `current.torch_distributed.device` becomes cuda:LOCAL_RANK, the
device mesh a CUDA mesh and the backend NCCL.
"""

from metaflow import FlowSpec, current, step, torch_distributed


def make_model():
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 1),
    )


class FSDPExample(FlowSpec):
    @step
    def start(self):
        self.steps = 40
        self.next(self.train)

    @torch_distributed(nproc_per_node=2)
    @step
    def train(self):
        import torch
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        gang = current.torch_distributed
        if gang.device.type == "cuda":
            torch.cuda.set_device(gang.device)
        # env:// needs no address; the backend follows the device the gang chose for this rank
        dist.init_process_group("nccl" if gang.device.type == "cuda" else "gloo")
        mesh = init_device_mesh(gang.device.type, (gang.world_size,))

        torch.manual_seed(0)  # the same initial weights on every rank
        model = make_model().to(gang.device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)  # each rank keeps a slice of this layer
        fully_shard(model, mesh=mesh)
        # Parameters are now DTensors; to_local() is this rank's slice.
        self.params_per_rank = gang.gather(sum(p.to_local().numel() for p in model.parameters()))

        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = torch.Generator().manual_seed(1000 + gang.rank)  # each rank its own batches
        target = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
        losses = []
        for _ in range(self.steps):
            x = torch.randn(64, 32, generator=data)
            loss = torch.nn.functional.mse_loss(model(x.to(gang.device)), (x @ target).to(gang.device))
            opt.zero_grad()
            loss.backward()  # gradients are reduce-scattered: each rank gets its slice's
            opt.step()
            losses.append(loss.item())
        self.first_and_last_loss = gang.gather((losses[0], losses[-1]))

        # Every rank takes part; rank 0 receives the full, unsharded weights in CPU memory
        # (the other ranks get {}). Rank 0's self.state_dict is the step's artifact.
        self.state_dict = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        model = make_model()  # an ordinary, unsharded model
        model.load_state_dict(self.state_dict)
        total = sum(p.numel() for p in model.parameters())
        print("parameters: %d in total, held per rank while training: %s"
              % (total, self.params_per_rank))
        print("loss (first, last) per rank:",
              [("%.3f" % first, "%.3f" % last) for first, last in self.first_and_last_loss])


if __name__ == "__main__":
    FSDPExample()
