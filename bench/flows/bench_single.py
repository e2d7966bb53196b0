"""(d) The floor: the same work as one process in a plain step (world size 1)."""

import json
import os

from metaflow import FlowSpec, step

import work


class BenchSingle(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @step
    def train(self):
        os.environ["BENCH_WORLD"] = "1"
        self.result, state = work.run(work.task_created())
        if state is not None:
            self.state = state
        self.next(self.end)

    @step
    def end(self):
        print("BENCH_RESULT " + json.dumps(self.result))


if __name__ == "__main__":
    BenchSingle()
