"""plan_topology: every inference rule and every error, as tables; Topology's rank arithmetic."""

import os

import metaflow  # noqa: F401 - metaflow must load the extension before its modules are imported
import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.devices import (
    node_cpus,
    requested_gpus,
    visible_gpu_ids,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import (
    Topology,
    plan_line,
    plan_topology,
)

RES8 = "@resources(gpu=8)"
VIS4 = "4 visible GPUs"

# (id, kwargs of plan_topology, nodes, nproc_per_node)
INFERRED = [
    ("defaults to one node, one process", {}, 1, 1),
    ("world_size only: every process on one node without GPUs", dict(world_size=4), 1, 4),
    ("world_size=1 without GPUs", dict(world_size=1), 1, 1),
    ("world_size and nodes: several CPU nodes only when nodes says so",
     dict(world_size=4, nodes=4), 4, 1),
    ("nodes only", dict(nodes=3), 3, 1),
    ("nproc_per_node only", dict(nproc_per_node=4), 1, 4),
    ("gpus of @resources alone: one node with all of them",
     dict(gpus=8, gpu_source=RES8), 1, 8),
    ("world_size with @resources(gpu=8): nodes inferred",
     dict(world_size=16, gpus=8, gpu_source=RES8), 2, 8),
    ("nodes with @resources(gpu=8)", dict(nodes=3, gpus=8, gpu_source=RES8), 3, 8),
    ("visible GPUs alone", dict(gpus=4, gpu_source=VIS4), 1, 4),
    ("world_size with visible GPUs", dict(world_size=8, gpus=4, gpu_source=VIS4), 2, 4),
    ("world_size and nodes", dict(world_size=8, nodes=2), 2, 4),
    ("world_size and nodes agreeing with @resources",
     dict(world_size=16, nodes=2, gpus=8, gpu_source=RES8), 2, 8),
    ("world_size and nodes beat visible GPUs (no request to contradict)",
     dict(world_size=4, nodes=2, gpus=4, gpu_source=VIS4), 2, 2),
    ("world_size and nproc_per_node", dict(world_size=6, nproc_per_node=3), 2, 3),
    ("nodes and nproc_per_node", dict(nodes=3, nproc_per_node=2), 3, 2),
    ("all three agreeing", dict(world_size=8, nodes=2, nproc_per_node=4), 2, 4),
    ("nproc_per_node below the requested GPUs",
     dict(nproc_per_node=4, gpus=8, gpu_source=RES8), 1, 4),
    ("nproc_per_node above the visible GPUs is allowed (nothing was requested)",
     dict(nproc_per_node=8, gpus=4, gpu_source=VIS4), 1, 8),
    # torchrun's words (torch.distributed.run.determine_local_world_size)
    ('"gpu": one process per GPU of @resources', dict(nproc_per_node="gpu", gpus=8,
                                                      gpu_source=RES8), 1, 8),
    ('"gpu" with nodes and visible GPUs', dict(nproc_per_node="gpu", nodes=2, gpus=4,
                                               gpu_source=VIS4), 2, 4),
    ('"gpu" with world_size', dict(nproc_per_node="gpu", world_size=16, gpus=8,
                                   gpu_source=RES8), 2, 8),
    ('"auto" with GPUs is one process per GPU', dict(nproc_per_node="auto", gpus=8,
                                                     gpu_source=RES8, cpus=64), 1, 8),
    ('"auto" without GPUs: one process per CPU', dict(nproc_per_node="auto", cpus=6,
                                                      cpu_source="6 CPUs of this machine"), 1, 6),
    ('"auto" without GPUs, with nodes', dict(nproc_per_node="auto", nodes=2, cpus=4,
                                             cpu_source="@batch(cpu=4)"), 2, 4),
]


@pytest.mark.parametrize("kwargs,nodes,nproc",
                         [row[1:] for row in INFERRED], ids=[row[0] for row in INFERRED])
def test_inference(kwargs, nodes, nproc):
    topo = plan_topology(**kwargs)
    assert (topo.nodes, topo.nproc_per_node) == (nodes, nproc)
    assert topo.world_size == nodes * nproc
    if "world_size" in kwargs:
        assert topo.world_size == kwargs["world_size"]


# (id, kwargs, fragments every one of which the message must contain)
ERRORS = [
    ("zero world_size", dict(world_size=0), ["world_size=0", "at least 1"]),
    ("zero nodes", dict(nodes=0), ["nodes=0", "at least 1"]),
    ("zero nproc_per_node", dict(nproc_per_node=0), ["nproc_per_node=0", "at least 1"]),
    ("negative nodes", dict(nodes=-2), ["nodes=-2", "at least 1"]),
    ("negative world_size", dict(world_size=-8), ["world_size=-8", "at least 1"]),
    ("float world_size", dict(world_size=2.5), ["world_size=2.5", "not a whole number"]),
    ("whole float nodes", dict(nodes=2.0), ["nodes=2.0", "not a whole number"]),
    ("string nproc_per_node", dict(nproc_per_node="2"),
     ["nproc_per_node='2'", "not a whole number"]),
    ("string world_size", dict(world_size="2"), ["world_size='2'", "not a whole number"]),
    ("bool nodes", dict(nodes=True), ["nodes=True", "not a whole number"]),
    ("bool world_size", dict(world_size=True), ["world_size=True", "not a whole number"]),
    ("world_size not divisible by nproc_per_node", dict(world_size=6, nproc_per_node=4),
     ["world_size=6", "4 processes per node", "nproc_per_node=4", "6 / 4 = 1.50"]),
    ("world_size smaller than nproc_per_node", dict(world_size=2, nproc_per_node=4),
     ["world_size=2", "2 / 4 = 0.50"]),
    ("world_size not divisible by nodes", dict(world_size=6, nodes=4),
     ["world_size=6", "nodes=4", "6 / 4 = 1.50"]),
    ("world_size not divisible by the @resources GPUs", dict(world_size=12, gpus=8,
                                                              gpu_source=RES8),
     ["world_size=12", "8 processes per node", RES8, "12 / 8 = 1.50"]),
    ("world_size not divisible by the visible GPUs", dict(world_size=6, gpus=4, gpu_source=VIS4),
     ["world_size=6", VIS4, "6 / 4 = 1.50"]),
    ("nodes x nproc_per_node != world_size", dict(world_size=8, nodes=3, nproc_per_node=2),
     ["nodes=3", "x 2", "= 6", "world_size=8"]),
    ("nodes x nproc_per_node != world_size beside visible GPUs",
     dict(world_size=12, nodes=2, nproc_per_node=4, gpus=4, gpu_source=VIS4),
     ["nodes=2", "x 4", "= 8", "world_size=12"]),
    ("world_size / nodes mismatching @resources GPUs",
     dict(world_size=8, nodes=2, gpus=8, gpu_source=RES8),
     ["world_size=8", "nodes=2", "= 4 processes per node", RES8, "8 GPUs", "= 16"]),
    ("nproc_per_node above the requested GPUs", dict(nproc_per_node=16, gpus=8, gpu_source=RES8),
     ["nproc_per_node=16", "8 GPUs", RES8, "nproc_per_node=8"]),
    ('"gpu" without GPUs', dict(nproc_per_node="gpu", cpus=8),
     ['nproc_per_node="gpu" means one process per GPU', "asks for no GPUs",
      "@resources(gpu=N)", 'nproc_per_node="auto"']),
    ('"auto" planned without a CPU count (internal)', dict(nproc_per_node="auto"),
     ['nproc_per_node="auto" found neither GPUs nor a CPU count']),
    ("a word torchrun knows but the decorator does not", dict(nproc_per_node="cpu"),
     ["nproc_per_node='cpu' is not a whole number", '"gpu" or "auto"']),
    ('"GPU" is not "gpu"', dict(nproc_per_node="GPU", gpus=8, gpu_source=RES8),
     ["nproc_per_node='GPU' is not a whole number", '"gpu" or "auto"']),
    ('"auto" on CPUs that world_size is not a multiple of',
     dict(nproc_per_node="auto", world_size=6, cpus=4, cpu_source="@batch(cpu=4)"),
     ["world_size=6", '(from nproc_per_node="auto": no GPUs, @batch(cpu=4))', "6 / 4 = 1.50"]),
    ('"gpu" whose GPUs disagree with world_size and nodes',
     dict(nproc_per_node="gpu", world_size=8, nodes=2, gpus=8, gpu_source=RES8),
     ["nodes=2 x 8 processes per node", 'nproc_per_node="gpu": @resources(gpu=8)',
      "not world_size=8"]),
]


@pytest.mark.parametrize("kwargs,fragments", [row[1:] for row in ERRORS],
                         ids=[row[0] for row in ERRORS])
def test_errors_show_the_arithmetic(kwargs, fragments):
    with pytest.raises(ValueError) as info:
        plan_topology(**kwargs)
    message = str(info.value)
    missing = [f for f in fragments if f not in message]
    assert not missing, "%r lacks %r" % (message, missing)


def test_error_names_the_first_bad_attribute_not_a_later_one():
    with pytest.raises(ValueError, match=r"^nodes=0 ") as info:
        plan_topology(world_size=4, nodes=0, nproc_per_node="x")
    assert "nproc_per_node" not in str(info.value)


@pytest.mark.parametrize("nodes,nproc", [(1, 1), (2, 4), (3, 2), (4, 8)])
def test_rank_and_locate_are_inverse(nodes, nproc):
    topo = Topology(nodes, nproc)
    ranks = [topo.rank(n, l) for n in range(nodes) for l in range(nproc)]
    assert ranks == list(range(nodes * nproc))
    for rank in ranks:
        node, local = topo.locate(rank)
        assert topo.rank(node, local) == rank
        assert rank in topo.ranks_of(node)


def test_rank_arithmetic_of_two_nodes_by_four():
    topo = Topology(2, 4)
    assert topo.world_size == 8
    assert topo.rank(1, 2) == 6
    assert topo.locate(6) == (1, 2)
    assert topo.locate(3) == (0, 3)
    assert list(topo.ranks_of(0)) == [0, 1, 2, 3]
    assert list(topo.ranks_of(1)) == [4, 5, 6, 7]


@pytest.mark.parametrize("nodes,nproc,text", [
    (1, 1, "1 node x 1 process per node = world size 1"),
    (2, 4, "2 nodes x 4 processes per node = world size 8"),
    (1, 8, "1 node x 8 processes per node = world size 8"),
    (3, 1, "3 nodes x 1 process per node = world size 3"),
])
def test_describe(nodes, nproc, text):
    assert Topology(nodes, nproc).describe() == text


class _Deco:
    def __init__(self, name, **attributes):
        self.name = name
        self.attributes = attributes


@pytest.mark.parametrize("decos,expected", [
    ([], (None, None)),
    ([_Deco("resources", gpu=8)], (8, "@resources(gpu=8)")),
    ([_Deco("resources", gpu="4")], (4, "@resources(gpu=4)")),
    ([_Deco("resources", gpu=0), _Deco("retry", times=2)], (None, None)),
    ([_Deco("resources", gpu=None)], (None, None)),
    ([_Deco("resources", gpu=2), _Deco("batch", gpu=4)], (4, "@batch(gpu=4)")),
    ([_Deco("kubernetes", gpu=1), _Deco("resources", gpu="0")], (1, "@kubernetes(gpu=1)")),
    ([_Deco("catch", gpu=8)], (None, None)),
])
def test_requested_gpus_from_step_decorators(decos, expected):
    assert requested_gpus(decos) == expected


def test_requested_gpus_feed_plan_topology():
    gpus, source = requested_gpus([_Deco("resources", gpu=8)])
    topo = plan_topology(world_size=16, gpus=gpus, gpu_source=source)
    assert (topo.nodes, topo.nproc_per_node) == (2, 8)
    with pytest.raises(ValueError, match=r"\(from @resources\(gpu=8\)\)"):
        plan_topology(world_size=12, gpus=gpus, gpu_source=source)


@pytest.mark.parametrize("kwargs,named", [
    (dict(world_size=12, gpus=8, gpu_source=RES8), "8 processes per node (from %s)" % RES8),
    (dict(world_size=6, gpus=4, gpu_source=VIS4), "4 processes per node (from %s)" % VIS4),
    (dict(world_size=6, gpus=4), "4 processes per node (from 4 GPUs)"),
    (dict(world_size=5, nproc_per_node=2), "2 processes per node (from nproc_per_node=2)"),
    (dict(world_size=8, nodes=3, nproc_per_node=2),
     "nodes=3 x 2 processes per node (from nproc_per_node=2) = 6, not world_size=8"),
])
def test_a_shape_that_does_not_add_up_names_where_processes_per_node_came_from(kwargs, named):
    with pytest.raises(ValueError) as info:
        plan_topology(**kwargs)
    assert named in str(info.value)


@pytest.mark.parametrize("decos,expected", [
    ([], (1, "Metaflow's default of cpu=1 per node")),
    ([_Deco("resources", cpu="4", gpu=None)], (4, "@resources(cpu=4)")),
    ([_Deco("resources", cpu="2"), _Deco("batch", cpu="8")], (8, "@batch(cpu=8)")),
    ([_Deco("batch", cpu="0.5")], (1, "@batch(cpu=0.5)")),
    ([_Deco("kubernetes", cpu=16), _Deco("catch", cpu=64)], (16, "@kubernetes(cpu=16)")),
])
def test_node_cpus_of_a_remote_step_come_from_its_decorators(decos, expected):
    assert node_cpus(decos, remote=True) == expected


def test_node_cpus_of_a_local_step_are_the_cpus_this_process_may_use():
    # as torch._utils.cpu_count counts them for torchrun's "auto": the affinity, not cpu=
    assert node_cpus([_Deco("resources", cpu="64")], remote=False, affinity={0, 3, 5}) == \
        (3, "3 CPUs of this machine")
    assert node_cpus([], remote=False)[0] == len(os.sched_getaffinity(0))


def test_visible_gpu_ids_from_proc_and_cuda_visible_devices(tmp_path):
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for i in range(4):
        (gpus / ("0000:0%d:00.0" % i)).mkdir()
    assert visible_gpu_ids({}, str(gpus)) == ["0", "1", "2", "3"]
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "1,3"}, str(gpus)) == ["1", "3"]
    assert visible_gpu_ids({}, str(tmp_path / "absent")) == []
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "0"}, str(tmp_path / "absent")) == []


@pytest.mark.parametrize("topology,accelerator,emulated,line", [
    (Topology(1, 4), "cpu", True, "train: 1 node x 4 processes = world size 4 (CPU, gloo)"),
    (Topology(1, 1), "cpu", True, "train: 1 node x 1 process = world size 1 (CPU, gloo)"),
    (Topology(2, 8), "cuda", False, "train: 2 nodes x 8 processes = world size 16 (CUDA, nccl)"),
    (Topology(2, 2), "cpu", True, "train: 2 nodes x 2 processes = world size 4 "
     "(CPU, gloo; the 2 nodes emulated on this machine)"),
])
def test_the_plan_printed_when_the_gang_starts(topology, accelerator, emulated, line):
    assert plan_line("train", topology, accelerator, emulated) == line
