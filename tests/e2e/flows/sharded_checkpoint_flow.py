"""Sharded checkpoints of an FSDP model (torch.distributed.checkpoint), resumed after a lost rank
(tests/e2e/test_checkpoints.py).

Each rank writes its DCP shard to a directory of its own and calls
current.torch_distributed.save_sharded() every EVERY steps. TD_KILL_RANK is SIGKILLed at step
TD_KILL_STEP on attempt 0 (TD_KILL_AFTER_SHARD: instead just after storing its shard of that
step's save, before the save is complete); the retry loads every shard from
current.checkpoint.directory on every rank of every node."""

import json
import os
import shutil
import signal
import tempfile
import time

from metaflow import FlowSpec, checkpoint, current, retry, step, torch_distributed

STEPS = 60
EVERY = 10


def mark(name, value):
    with open(os.path.join(os.environ["TD_MARK_DIR"], name), "w") as f:
        f.write(repr(value))


def killing(rank, step_no, variable):
    return (current.retry_count == 0 and rank == int(os.environ.get("TD_KILL_RANK", -1))
            and os.environ.get(variable) == str(step_no))


class ShardedCheckpointFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @retry(times=1, minutes_between_retries=0)
    @checkpoint
    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_model_state_dict,
                                                             set_model_state_dict)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        gang = current.torch_distributed
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (gang.world_size,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        first = 0
        if current.checkpoint.is_loaded:  # every rank's shard is in the directory, every node
            state = {"model": get_model_state_dict(model)}
            dcp.load(state, checkpoint_id=current.checkpoint.directory)
            set_model_state_dict(model, state["model"])
            with open(os.path.join(current.checkpoint.directory, "step.txt")) as f:
                first = int(f.read())
        mark("start-%d-rank-%d" % (current.retry_count, gang.rank), first)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for i in range(first, STEPS):
            if killing(gang.rank, i, "TD_KILL_STEP"):
                os.kill(os.getpid(), signal.SIGKILL)
            gen = torch.Generator().manual_seed(1000 * i + gang.rank)
            x = torch.randn(16, 8, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
            opt.step()
            if (i + 1) % EVERY == 0:
                shard = tempfile.mkdtemp()
                dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=shard)
                if gang.is_main:
                    with open(os.path.join(shard, "step.txt"), "w") as f:
                        f.write(str(i + 1))
                if killing(gang.rank, i + 1, "TD_KILL_AFTER_SHARD"):
                    current.checkpoint.save(path=shard, name="shard-%d" % gang.rank,
                                            latest=False)
                    mark("killed-at", time.time())
                    os.kill(os.getpid(), signal.SIGKILL)
                gang.save_sharded(shard, metadata={"step": i + 1})
                shutil.rmtree(shard)
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                    cpu_offload=True))
        self.weights = json.dumps({k: v.tolist() for k, v in sorted(full.items())})
        self.resumed_from = first
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ShardedCheckpointFlow()
