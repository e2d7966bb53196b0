"""(c) The work as a @torch_distributed step: world_size=BENCH_WORLD on this host (one node: no
GPUs), start method BENCH_START_METHOD (fork or exec). BENCH_NODE_PER_RANK=1 adds
nodes=BENCH_WORLD: one process per emulated node, the plan world_size alone had on CPU before
issue 11."""

import json
import os
import sys

from metaflow import FlowSpec, current, step, torch_distributed

import work

WORLD = int(os.environ.get("BENCH_WORLD", "1"))

# BENCH_PRELOAD=1: the train task imports torch before the gang forks its members, which is
# what the decorator itself could do (docs/benchmarks.md, "Where the time goes").
if os.environ.get("BENCH_PRELOAD") and "step" in sys.argv and "train" in sys.argv:
    import torch.distributed  # noqa: F401

# BENCH_UNSEALED=1, for bench/seal_launch.py only: the ranks skip the seal of torch's own
# rendezvous (runtime/rendezvous_seal.py), so that its cost on a whole flow can be measured
# against the same code without it. The package itself has no such switch.
if os.environ.get("BENCH_UNSEALED"):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import (
        rendezvous_seal,
    )

    rendezvous_seal.install = lambda *args, **kwargs: None


class BenchOurs(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(world_size=WORLD, nodes=WORLD if os.environ.get("BENCH_NODE_PER_RANK")
                       else None, start_method=os.environ.get("BENCH_START_METHOD", "fork"))
    @step
    def train(self):
        result, state = work.run(work.task_created())
        if current.torch_distributed.is_main:
            self.result = result
            if state is not None:
                self.state = state
        self.next(self.end)

    @step
    def end(self):
        print("BENCH_RESULT " + json.dumps(self.result))


if __name__ == "__main__":
    BenchOurs()
