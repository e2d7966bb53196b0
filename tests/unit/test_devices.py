"""Which accelerator a gang gets, and which GPUs each node sees (GPUs faked by a fixture)."""

import pytest

import metaflow  # noqa: F401  (loads the extension)
from metaflow_extensions.torch_distributed.plugins.torch_distributed import decorator as deco_mod
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import devices
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedEnvironmentError
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology


def local(topology, visible, requested=None, rehearsal=False):
    return devices.local_devices("train", topology, [str(i) for i in range(visible)], rehearsal,
                                 requested)


def test_enough_gpus_give_each_emulated_node_its_own_block():
    assert local(Topology(2, 2), 4, "@resources(gpu=2)") == (
        "cuda", {0: "0,1", 1: "2,3"})


def test_no_gpus_and_none_asked_for_is_a_cpu_gang():
    assert local(Topology(2, 2), 0) == ("cpu", {})


def test_too_few_gpus_for_what_resources_asked_is_an_error():
    with pytest.raises(TorchDistributedEnvironmentError, match="needs 4 GPUs on this machine"):
        local(Topology(2, 2), 1, "@resources(gpu=2)")


def test_some_gpus_but_fewer_than_ranks_is_an_error_not_a_silent_cpu_gang():
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="this machine shows 8 GPUs, fewer than the 16 ranks"):
        local(Topology(1, 16), 8)


def test_a_cpu_rehearsal_on_a_gpu_machine_hides_the_gpus():
    assert local(Topology(2, 4), 2, "@resources(gpu=4)", rehearsal=True) == (
        "cpu", {0: "", 1: ""})


def test_a_node_of_separate_machines_says_whether_to_hide_its_gpus():
    topology = Topology(2, 2)
    assert devices.node_devices("train", topology, ["0", "1"], False, None) == ("cuda", False)
    assert devices.node_devices("train", topology, ["0", "1"], True, None) == ("cpu", True)
    assert devices.node_devices("train", topology, [], False, None) == ("cpu", False)
    with pytest.raises(TorchDistributedEnvironmentError, match="needs 2 GPUs on this node"):
        devices.node_devices("train", topology, ["0"], False, "@batch(gpu=2)")


class _Cuda:
    def __init__(self, initialised):
        self.cuda = type("cuda", (), {"is_initialized": staticmethod(lambda: initialised)})


def test_auto_start_method_forks_on_linux_until_cuda_is_initialised():
    assert devices.resolve_start_method("exec") == "exec"
    assert devices.resolve_start_method("auto", "linux", {}) == "fork"
    assert devices.resolve_start_method("auto", "linux", {"torch": _Cuda(False)}) == "fork"
    assert devices.resolve_start_method("auto", "linux", {"torch": _Cuda(True)}) == "exec"
    assert devices.resolve_start_method("auto", "darwin", {}) == "exec"


def test_a_task_without_torch_gets_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch.distributed", None)  # import raises ImportError
    with pytest.raises(TorchDistributedEnvironmentError, match="torch is not installed where "
                       "this task runs"):
        deco_mod._require_torch("train")
