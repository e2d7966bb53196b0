"""Plain steps (no gang) for `run --with torch_slurm`: each one a one-node Slurm job; `middle`
names its own options."""

import os
import socket

from metaflow import FlowSpec, step, torch_slurm


def where():
    return dict(host=socket.gethostname(), job=os.environ.get("SLURM_JOB_ID"),
                nodes=os.environ.get("SLURM_JOB_NUM_NODES"),
                partition=os.environ.get("SLURM_JOB_PARTITION"))


class SlurmPlainFlow(FlowSpec):
    @step
    def start(self):
        self.places = [where()]
        self.next(self.middle)

    @torch_slurm(partition="debug", time="10")
    @step
    def middle(self):
        self.places = self.places + [where()]
        self.next(self.end)

    @step
    def end(self):
        self.places = self.places + [where()]
        print("ran on", [p["host"] for p in self.places])


if __name__ == "__main__":
    SlurmPlainFlow()
