"""GPU check (run by tests/gpu/gpu_check.sh on a GPU machine, never in CI): a bare Lightning
Trainer inside a one-node gang on this host's GPUs."""

import json

from metaflow import FlowSpec, current, step, torch_distributed


class LightningGpuFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed
    @step
    def train(self):
        import lightning.pytorch as pl
        from lightning.pytorch.demos.boring_classes import BoringModel

        trainer = pl.Trainer(max_steps=20, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False)
        model = BoringModel()
        trainer.fit(model)
        report = dict(
            rank=current.torch_distributed.rank,
            strategy=type(trainer.strategy).__name__,
            accelerator=type(trainer.accelerator).__name__,
            root_device=str(trainer.strategy.root_device),
            world_size=trainer.world_size, num_nodes=trainer.num_nodes,
            cluster_env=type(getattr(trainer.strategy, "cluster_environment", None)).__name__,
            global_step=trainer.global_step,
            param_device=str(next(model.parameters()).device),
        )
        self.reports = current.torch_distributed.gather(report)
        self.next(self.end)

    @step
    def end(self):
        print("GPU-REPORT " + json.dumps(self.reports))


if __name__ == "__main__":
    LightningGpuFlow()
