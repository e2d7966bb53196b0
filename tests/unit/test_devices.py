"""Which accelerator a gang gets, and which GPUs each node sees (GPUs faked by a fixture)."""

import pytest

import metaflow  # noqa: F401  (loads the extension)
from metaflow_extensions.torch_distributed.plugins.torch_distributed import decorator as deco_mod
from metaflow_extensions.torch_distributed.plugins.torch_distributed.errors import \
    TorchDistributedEnvironmentError
from metaflow_extensions.torch_distributed.plugins.torch_distributed.topology import Topology


def make(topology, gpus_requested=None):
    deco = deco_mod.TorchDistributedDecorator(attributes={})
    deco.step_name, deco.topology, deco.gpus_requested = "train", topology, gpus_requested
    return deco


@pytest.fixture
def gpus(monkeypatch):
    def set_visible(n):
        monkeypatch.setattr(deco_mod, "visible_gpu_ids", lambda: [str(i) for i in range(n)])
    monkeypatch.delenv("METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL", raising=False)
    return set_visible


def test_enough_gpus_give_each_emulated_node_its_own_block(gpus):
    gpus(4)
    assert make(Topology(2, 2, gpu_per_rank=True), "@resources(gpu=2)")._local_devices() == (
        "cuda", {0: "0,1", 1: "2,3"})


def test_no_gpus_and_none_asked_for_is_a_cpu_gang(gpus):
    gpus(0)
    assert make(Topology(2, 2))._local_devices() == ("cpu", {})


def test_too_few_gpus_for_what_resources_asked_is_an_error(gpus):
    gpus(1)
    with pytest.raises(TorchDistributedEnvironmentError, match="needs 4 GPUs on this machine"):
        make(Topology(2, 2, gpu_per_rank=True), "@resources(gpu=2)")._local_devices()


def test_some_gpus_but_fewer_than_ranks_is_an_error_not_a_silent_cpu_gang(gpus):
    gpus(8)
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="this machine shows 8 GPUs, fewer than the 16 ranks"):
        make(Topology(1, 16))._local_devices()


def test_a_cpu_rehearsal_on_a_gpu_machine_hides_the_gpus(gpus, monkeypatch):
    gpus(2)
    monkeypatch.setattr("metaflow.metaflow_config.TORCH_DISTRIBUTED_CPU_REHEARSAL", "1")
    assert make(Topology(2, 4, gpu_per_rank=True), "@resources(gpu=4)")._local_devices() == (
        "cpu", {0: "", 1: ""})


def test_a_task_without_torch_gets_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch.distributed", None)  # import raises ImportError
    with pytest.raises(TorchDistributedEnvironmentError, match="torch is not installed where "
                       "this task runs"):
        deco_mod._require_torch("train")
