"""Lightning in a rank, with the real Lightning: when it checks the gang's shape (as
docs/frameworks/lightning.md says), and its own process launch inside a rank (strategy="ddp_spawn", "ddp_fork",
"ddp_notebook"), with the real Lightning: refused with the fix before any process of its own
starts, so nothing trains twice. Each body runs in a forked member, as a rank's does (Lightning
starts multiprocessing's resource tracker before its launch, which ends with the member). The
flow that runs it in a gang is in tests/e2e/test_frameworks.py."""

import os
import selectors
import re
from pathlib import Path

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
    read_error_file,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.groupcheck import run_body
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import fork_member
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology

QUIET = dict(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False)


@pytest.fixture(autouse=True)
def _outside_any_gang(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR",
                 "MASTER_PORT", "PL_TRAINER_DEVICES", "PL_TRAINER_NUM_NODES"):
        monkeypatch.delenv(name, raising=False)


def in_a_rank(body, tmp_path):
    """Run `body` as rank 0 of a 1 x 2 gang in a forked member: its error's message, or None."""
    error_file = str(tmp_path / "error.json")
    member = fork_member("[rank 0]", lambda: run_body(body, (), "train", Topology(1, 2),
                                                      environ={}), {}, error_file=error_file)
    with selectors.DefaultSelector() as sel:
        for fd in (member.stdout_fd, member.stderr_fd):
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select(timeout=60):
                if not os.read(key.fd, 65536):
                    sel.unregister(key.fd)
                    os.close(key.fd)
    os.waitpid(member.pid, 0)
    recorded = read_error_file(error_file)
    return recorded[0] if recorded else None


@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
@pytest.mark.parametrize("strategy, named", [
    ("ddp_spawn", 'strategy="ddp_spawn"'),
    ("ddp_fork", 'strategy="ddp_fork" or "ddp_notebook"'),
    ("ddp_notebook", 'strategy="ddp_fork" or "ddp_notebook"'),
])
def test_a_lightning_strategy_that_starts_processes_is_named_before_any_starts(
        strategy, named, package, tmp_path):
    import importlib

    pl = importlib.import_module(package)
    boring = importlib.import_module(package + ".demos.boring_classes")
    trained = tmp_path / "trained"

    class Model(boring.BoringModel):  # defined in the step: "ddp_spawn" could not pickle it
        def training_step(self, batch, batch_idx):
            trained.touch()
            return super().training_step(batch, batch_idx)

    def body():
        pl.Trainer(strategy=strategy, accelerator="cpu", devices=2, **QUIET).fit(Model())

    message = in_a_rank(body, tmp_path)
    assert message.startswith(
        "TorchDistributedFrameworkError: @torch_distributed on step *train*: Lightning was "
        "given %s, which starts 2 processes of its own in every rank" % named), message
    assert 'remove strategy= from Trainer(...) (or Fabric(...)), or pass strategy="ddp"' \
        in message
    assert not trained.exists()


def test_fabric_is_refused_the_same_way(tmp_path):
    from lightning.fabric import Fabric

    def body():
        Fabric(strategy="ddp_spawn", accelerator="cpu", devices=2).launch(_mark, str(tmp_path))

    message = in_a_rank(body, tmp_path)
    assert 'Lightning was given strategy="ddp_spawn"' in message, message
    assert not (tmp_path / "launched").exists()


def test_the_users_own_start_processes_goes_through(tmp_path):
    import torch.multiprocessing as mp

    def body():
        mp.start_processes(_mark, args=(str(tmp_path),), nprocs=1, start_method="fork")

    message = in_a_rank(body, tmp_path)
    # it ran; then the group check found that the rank never joined the gang
    assert (tmp_path / "launched").exists()
    assert "finished the step without joining" in message, message


def _mark(*args):
    folder = args[-1]
    Path(folder, "launched").touch()


LIGHTNING_PAGE = Path(__file__).parents[2] / "docs" / "frameworks" / "lightning.md"
# rank 0 of a gang of 2 nodes x 2 processes, as envcontract.py sets it
GANG_ENV = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", GROUP_RANK="0",
                NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                TORCHELASTIC_RUN_ID="gang", PL_TRAINER_NUM_NODES="2", PL_TRAINER_DEVICES="2")


def test_explicit_devices_pass_the_trainer_and_fail_in_fit_as_the_lightning_page_says(
        monkeypatch):
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    for name, value in GANG_ENV.items():
        monkeypatch.setenv(name, value)
    trainer = pl.Trainer(devices=1, accelerator="cpu", **QUIET)  # no error here
    with pytest.raises(ValueError, match=re.escape("You set `devices=1` and `num_nodes=2`")):
        trainer.fit(BoringModel())
    row = next(line for line in LIGHTNING_PAGE.read_text().splitlines()
               if line.startswith("| `Trainer(devices=1)`"))
    assert "in `trainer.fit`" in row and "when the Trainer is built" not in row, row
