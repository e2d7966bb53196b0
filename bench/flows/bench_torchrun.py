"""(a) What users write today: a plain step that runs `torchrun --standalone` on a script."""

import json
import os
import subprocess
import sys
import tempfile

from metaflow import FlowSpec, step

import work

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_worker.py")


class BenchTorchrun(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @step
    def train(self):
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, BENCH_TASK_CREATED=repr(work.task_created()), BENCH_OUT=out)
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node", os.environ["BENCH_WORLD"], WORKER],
                           env=env, check=True)
            with open(os.path.join(out, "rank0.json")) as f:
                self.result = json.load(f)
        self.next(self.end)

    @step
    def end(self):
        print("BENCH_RESULT " + json.dumps(self.result))


if __name__ == "__main__":
    BenchTorchrun()
