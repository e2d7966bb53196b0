"""The one backend interface (backends/base.py) and its registry: every backend implements it,
the local one included, and each answers only at its own moments."""

import json

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import (
    argo,
    batch,
    kubernetes,
    local,
    registry,
    stepfunctions,
    trampoline,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends.base import Backend
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedEnvironmentError,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import (
    AgentOrder,
)
from tests import records


def test_every_backend_implements_the_interface_and_the_local_one_places_node_0_last():
    assert all(isinstance(b, Backend) for b in registry.BACKENDS)
    names = [b.name for b in registry.BACKENDS]
    assert names == ["batch", "kubernetes", "step-functions", "argo-workflows", "slurm",
                     "local"]
    assert registry.BACKENDS[-1] is local.BACKEND
    for backend in registry.BACKENDS:
        assert registry.by_name("train", backend.name) is backend


def test_an_unknown_backend_names_the_releases_that_differ():
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="backend 'lsf', which this release of @torch_distributed does "
                             "not know .* Install the same release everywhere"):
        registry.by_name("train", "lsf")


def test_node_0_is_placed_by_the_backend_whose_plan_it_finds_else_by_the_local_one():
    step = records.gang_step(nodes=2)
    identity = records.IDENTITY
    placed = registry.node_zero(step, {}, identity)
    assert (placed.backend, placed.master_addr, placed.port) == ("local", "127.0.0.1", 0)
    env = dict(trampoline.plan_env(batch.MAIN_NODE_ENV, "train", 2),
               **{batch.NUM_NODES: "2", "MF_PARALLEL_MAIN_IP": "10.0.0.5"})
    placed = registry.node_zero(step, env, identity)
    assert (placed.backend, placed.master_addr) == ("batch", "10.0.0.5")
    # another step's plan is not this step's: the task is placed locally
    other = dict(trampoline.plan_env(batch.MAIN_NODE_ENV, "other", 2), **{batch.NUM_NODES: "2"})
    assert registry.node_zero(step, other, identity).backend == "local"


def test_a_multi_node_gang_in_a_remote_container_that_no_backend_placed_is_refused():
    step = records.gang_step(nodes=2)
    with pytest.raises(TorchDistributedEnvironmentError, match="did not give it 2 machines"):
        registry.node_zero(step, {"AWS_BATCH_JOB_ID": "j"}, records.IDENTITY)
    rehearsal = records.gang_step(nodes=2, rehearsal=True)
    assert registry.node_zero(rehearsal, {"AWS_BATCH_JOB_ID": "j"},
                              records.IDENTITY).backend == "local"


@pytest.mark.parametrize("decorators, nodes, expected", [
    ((), 2, {}),
    (("batch",), 1, {batch.TRAMPOLINE_ENV: "train"}),  # one node: the forwarder
    (("batch",), 2, {batch.TRAMPOLINE_ENV: "train"}),
    (("kubernetes",), 1, {}),  # one node: Metaflow's own pod
    (("kubernetes",), 2, {kubernetes.TRAMPOLINE_ENV: "train"}),
])
def test_what_the_runtime_sets_on_the_steps_command(decorators, nodes, expected):
    assert registry.launch_env(records.gang_step(decorators, nodes=nodes)) == expected


def test_each_backend_installs_only_in_its_own_process(monkeypatch):
    installed = []
    for module in (batch, kubernetes, stepfunctions, argo):
        monkeypatch.setattr(module, "install_trampoline" if hasattr(module, "install_trampoline")
                            else "install", lambda step, m=module: installed.append(m.__name__))
    monkeypatch.setattr(batch, "install_forwarding", lambda step_name: installed.append("fwd"))
    step = records.gang_step(nodes=2)
    registry.install(step, {}, None)  # `run`, the task, any process but these
    assert installed == []
    registry.install(step, {batch.TRAMPOLINE_ENV: "other"}, None)  # another step's job
    assert installed == []
    registry.install(step, {batch.TRAMPOLINE_ENV: "train"}, None)
    registry.install(step, {kubernetes.TRAMPOLINE_ENV: "train"}, None)
    registry.install(step, {}, "step-functions")
    registry.install(step, {}, "argo-workflows")
    assert [name.rsplit(".", 1)[1] for name in installed] == [
        "batch", "kubernetes", "stepfunctions", "argo"]
    installed.clear()
    registry.install(records.gang_step(nodes=1), {batch.TRAMPOLINE_ENV: "train"},
                     "step-functions")
    assert installed == ["fwd"]  # one node: no gang to compile, Batch's forwarder only


def test_the_agents_order_travels_with_nothing_of_the_attempt():
    order = AgentOrder(records.blueprint(), "kubernetes")
    text = json.dumps(order.to_env())
    for secret_or_place in ("secret", "gang_id", "master_addr", "master_port", "task_id"):
        assert secret_or_place not in text
