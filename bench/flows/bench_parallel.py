"""(b) Metaflow's own @parallel: num_parallel=BENCH_WORLD tasks on this host, the torch
environment set by hand from current.parallel. Every node is a real task and persists."""

import json
import os

from metaflow import FlowSpec, current, parallel, step

import work

WORLD = int(os.environ.get("BENCH_WORLD", "1"))


class BenchParallel(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=WORLD)

    @parallel
    @step
    def train(self):
        os.environ.update(MASTER_ADDR=current.parallel.main_ip,
                          MASTER_PORT=os.environ["BENCH_PORT"],
                          WORLD_SIZE=str(current.parallel.num_nodes),
                          RANK=str(current.parallel.node_index),
                          LOCAL_RANK=str(current.parallel.node_index))
        self.rank = current.parallel.node_index
        self.result, state = work.run(work.task_created())
        if state is not None:
            self.state = state  # every node persists its own copy
        self.next(self.join)

    @step
    def join(self, inputs):
        self.result = next(i.result for i in inputs if i.rank == 0)
        self.next(self.end)

    @step
    def end(self):
        print("BENCH_RESULT " + json.dumps(self.result))


if __name__ == "__main__":
    BenchParallel()
