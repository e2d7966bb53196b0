"""A step whose @torch_slurm time is not one of Slurm's forms: refused at validation."""

from metaflow import FlowSpec, step, torch_slurm


class SlurmBadTimeFlow(FlowSpec):
    @torch_slurm(time="2h")
    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    SlurmBadTimeFlow()
