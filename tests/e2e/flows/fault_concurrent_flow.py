"""Many gangs on one host: a foreach of TD_GANGS 2-rank gangs, run with --max-workers 4, so
4 gangs at a time bind their rendezvous ports and form their groups side by side."""

import os
import time

from metaflow import FlowSpec, step, torch_distributed


def task_started():
    """When the task started (rank 0's parent: the task forks it), on time.time()'s clock.
    (psutil's create_time adds a boot time rounded to whole seconds, up to ~1 s early here,
    which made gangs that ran one after the other look as if they overlapped.)"""
    with open("/proc/%d/stat" % os.getppid()) as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


class ConcurrentGangs(FlowSpec):
    @step
    def start(self):
        self.items = list(range(int(os.environ.get("TD_GANGS", "40"))))
        self.next(self.train, foreach="items")

    @torch_distributed(nproc_per_node=2)
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        self.started = task_started()  # the task, hence its port, exists
        dist.init_process_group("gloo")
        t = torch.tensor([float(self.input + 1)])
        dist.all_reduce(t)
        self.total = t.item()
        self.port = int(os.environ["MASTER_PORT"])
        dist.destroy_process_group()
        self.ended = time.time()
        self.next(self.join)

    @step
    def join(self, inputs):
        self.gangs = [dict(item=i.input, total=i.total, port=i.port, started=i.started,
                           ended=i.ended) for i in inputs]
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ConcurrentGangs()
