"""GPU check (run by tests/gpu/gpu_check.sh on a GPU machine, never in CI): a one-node gang
on this host's GPUs, NCCL picked by init_process_group() with no arguments."""

import json
import os

from metaflow import FlowSpec, current, step, torch_distributed

NPROC = os.environ.get("GPU_NPROC")


class NcclFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(**({"nproc_per_node": int(NPROC)} if NPROC else {}))
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        info = current.torch_distributed
        torch.cuda.set_device(info.device)
        dist.init_process_group()
        t = torch.ones(1, device=info.device) * (info.rank + 1)
        dist.all_reduce(t)
        report = dict(
            rank=info.rank, world_size=info.world_size, device=str(info.device),
            backend=str(dist.get_backend()), total=t.item(),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            gpu=torch.cuda.get_device_name(info.device),
            nccl_env={k: v for k, v in os.environ.items() if "NCCL" in k},
            nccl_version=".".join(map(str, torch.cuda.nccl.version())),
        )
        self.reports = info.gather(report)
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        print("GPU-REPORT " + json.dumps(self.reports))


if __name__ == "__main__":
    NcclFlow()
