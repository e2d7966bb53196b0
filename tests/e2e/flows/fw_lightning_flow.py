"""Lightning with zero configuration on a gang of 2 nodes x 2 processes: a bare
Trainer(max_steps=4) trains BoringModel on 64 indexed rows, 16 per rank.

TD_LT picks the package (lightning.pytorch or pytorch_lightning). TD_TRAP picks one of the traps
of docs/frameworks/lightning.md instead of the bare Trainer: subclass (class FineTuner(Trainer)),
cli (LightningCLI), devices1 (Trainer(devices=1)) or a strategy that starts processes of its
own (ddp_spawn: Trainer(strategy="ddp_spawn")).
Every body appends "RANK PID" to $TD_MARK_DIR/bodies, so a test sees any re-executed script."""

import importlib
import os

from metaflow import FlowSpec, current, step, torch_distributed

PACKAGE = os.environ.get("TD_LT", "lightning.pytorch")
TRAP = os.environ.get("TD_TRAP", "")
ROWS, BATCH, STEPS = 64, 4, 4
QUIET = dict(max_steps=STEPS, logger=False, enable_checkpointing=False,
             enable_progress_bar=False, enable_model_summary=False)


class LightningFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=2, nproc_per_node=2)
    @step
    def train(self):
        import torch

        pl = importlib.import_module(PACKAGE)
        boring = importlib.import_module(PACKAGE + ".demos.boring_classes")
        with open(os.path.join(os.environ["TD_MARK_DIR"], "bodies"), "a") as f:
            f.write("%s %d\n" % (os.environ["RANK"], os.getpid()))
        seen = []

        class IndexedModel(boring.BoringModel):
            """BoringModel whose rows carry their index in column 0."""

            def training_step(self, batch, batch_idx):
                seen.extend(int(i) for i in batch[:, 0])
                return super().training_step(batch, batch_idx)

            def train_dataloader(self):
                rows = torch.randn(ROWS, 32, generator=torch.Generator().manual_seed(0))
                rows[:, 0] = torch.arange(ROWS)
                return torch.utils.data.DataLoader(rows, batch_size=BATCH)

        if TRAP == "cli":
            cli_module = importlib.import_module(PACKAGE + ".cli")
            cli = cli_module.LightningCLI(IndexedModel, run=False, save_config_callback=None,
                                          args=["--trainer.%s=%s" % (k, str(v).lower())
                                                for k, v in QUIET.items()])
            trainer, model = cli.trainer, cli.model
        else:
            model = IndexedModel()
            if TRAP == "subclass":
                class FineTuner(pl.Trainer):
                    pass

                trainer = FineTuner(**QUIET)
            elif TRAP == "devices1":
                trainer = pl.Trainer(devices=1, **QUIET)
            elif TRAP.startswith("ddp_"):
                trainer = pl.Trainer(strategy=TRAP, **QUIET)
            else:
                trainer = pl.Trainer(**QUIET)
        trainer.fit(model)
        # None under SingleDeviceStrategy (the subclass trap)
        environment = getattr(trainer.strategy, "cluster_environment", None)
        self.ranks = current.torch_distributed.gather(dict(
            strategy=type(trainer.strategy).__name__,
            world_size=trainer.world_size,
            global_rank=trainer.global_rank,
            environment=type(environment).__name__,
            external=getattr(environment, "creates_processes_externally", None),
            seen=seen,
            weight_sum=float(sum(p.detach().sum() for p in model.parameters())),
        ))
        self.state = {k: v.tolist() for k, v in model.state_dict().items()}
        self.next(self.end)

    @step
    def end(self):
        self.state_shapes = {k: [len(v), len(v[0]) if isinstance(v[0], list) else 0]
                             for k, v in self.state.items()}


if __name__ == "__main__":
    LightningFlow()
