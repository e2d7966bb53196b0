"""A plain Metaflow step that runs recovery_train.py under `torchrun --max-restarts=1` (what
users write today for in-job restarts), for bench/recovery.py."""

import os
import subprocess
import sys
import tempfile

from metaflow import FlowSpec, step

HERE = os.path.dirname(os.path.abspath(__file__))


class RecoveryTorchrunFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @step
    def train(self):
        # Without it, torch 2.13's torchrun restarts the workers on the rendezvous store of the
        # failed round, whose peer addresses gloo then dials (pytorch/pytorch#135712: "Connection
        # refused" in connectFullMesh): the known workaround, which torchrun users need too.
        env = dict(os.environ, RECOVERY_CKPT=os.path.join(tempfile.mkdtemp(), "model.pt"),
                   TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=%s" % os.environ.get("BENCH_WORLD", "4"),
                        "--max-restarts=1", os.path.join(HERE, "recovery_train.py")],
                       env=env, check=True)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    RecoveryTorchrunFlow()
