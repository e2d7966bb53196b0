"""A Lightning Trainer on a gang of 2 nodes x 2 that saves on SIGTERM through Lightning's own
mechanism: its signal connector notes the SIGTERM, the fit loop raises SIGTERMException on every
rank, and the OnExceptionCheckpoint callback saves the trainer's state (on rank 0). Nothing in
the body knows of the gang's preemption. Attempt 1 (@retry) trains 5 steps, resuming fit from
that checkpoint (ckpt_path) when there is one.

Each rank writes $TD_MARK_DIR/training-<rank> ({pid}) once it trains, and
$TD_MARK_DIR/exception-<rank> (the exception's type name) from on_exception; the callback's
checkpoint is $TD_MARK_DIR/on_exception.ckpt; attempt 1 keeps the step it resumed at."""

import os
import time

from metaflow import FlowSpec, current, retry, step, torch_distributed

MARKS = os.environ["TD_MARK_DIR"]
MAX_STEPS = 100000


class PreemptLightningFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @retry(times=1, minutes_between_retries=0)
    @torch_distributed(nodes=2, nproc_per_node=2, preempt_grace=10)
    @step
    def train(self):
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import OnExceptionCheckpoint
        from lightning.pytorch.demos.boring_classes import BoringModel

        rank = int(os.environ["RANK"])
        attempt = current.retry_count

        class Marks(pl.Callback):
            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                if trainer.global_step == 1 and attempt == 0:
                    with open(os.path.join(MARKS, "training-%d" % rank), "w") as f:
                        f.write(str(os.getpid()))
                time.sleep(0.02)

            def on_exception(self, trainer, module, exception):
                with open(os.path.join(MARKS, "exception-%d" % rank), "w") as f:
                    f.write(type(exception).__name__)

        ckpt = os.path.join(MARKS, "on_exception.ckpt")
        # attempt 0 trains "forever"; attempt 1 trains 5 steps, from the checkpoint if one
        # was saved
        resume = ckpt if attempt > 0 and os.path.exists(ckpt) else None
        self.had_checkpoint = resume is not None
        steps, self.resumed_at = (MAX_STEPS, None) if attempt == 0 else (5, 0)
        if resume:
            import torch

            self.resumed_at = torch.load(resume, weights_only=False)["global_step"]
            steps = self.resumed_at + 5
        trainer = pl.Trainer(max_steps=steps, logger=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[Marks(), OnExceptionCheckpoint(MARKS)])
        trainer.fit(BoringModel(), ckpt_path=resume)
        self.global_step = trainer.global_step
        self.next(self.end)

    @step
    def end(self):
        print("resumed at", self.resumed_at, "ended at", self.global_step)


if __name__ == "__main__":
    PreemptLightningFlow()
