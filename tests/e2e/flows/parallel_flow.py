"""The old way, num_parallel, in front of a @torch_distributed step: rejected with a fix."""

from metaflow import FlowSpec, step, torch_distributed


class ParallelFlow(FlowSpec):
    @step
    def start(self):
        print("start step ran")
        self.next(self.train, num_parallel=2)

    @torch_distributed(nproc_per_node=2)
    @step
    def train(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ParallelFlow()
