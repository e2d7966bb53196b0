"""What a node reports of itself at the rendezvous, and the refusal of one that differs from
node 0 (core/nodefacts.py, mf/nodefacts.py): tables."""

import json

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import nodefacts
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedConfigError
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.nodefacts import \
    NodeFacts
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import \
    nodefacts as gathered

NODE_0 = NodeFacts(python="3.11.7", torch="2.13.0+cu126", cuda="12.6", nccl="2.27.3",
                   package="0.3.0", metaflow="2.19.39", code="ab12", gpus=8)


@pytest.mark.parametrize("changes, found", [
    ({}, []),
    ({"torch": "2.12.1+cu126"}, [("torch", "2.13.0+cu126", "2.12.1+cu126")]),
    ({"gpus": 7, "python": "3.10.14"}, [("python", "3.11.7", "3.10.14"), ("gpus", 8, 7)]),
    ({"cuda": None, "nccl": None}, [("cuda", "12.6", None), ("nccl", "2.27.3", None)]),
    ({"code": "cd34", "package": "0.2.0", "metaflow": "2.19.38"},
     [("package", "0.3.0", "0.2.0"), ("metaflow", "2.19.39", "2.19.38"),
      ("code", "ab12", "cd34")]),
])
def test_differences_name_each_fact_with_both_values(changes, found):
    assert nodefacts.differences(NODE_0, NODE_0.changed(changes)) == found


@pytest.mark.parametrize("accelerator, gpus, nproc, short", [
    ("cuda", 8, 8, None), ("cuda", 9, 8, None), ("cuda", 7, 8, ("gpus", 8, 7)),
    ("cpu", 0, 4, None),
])
def test_a_gpu_node_short_of_the_topology(accelerator, gpus, nproc, short):
    assert nodefacts.gpu_shortfall(NODE_0.changed({"gpus": gpus}), accelerator, nproc) == short


def test_the_refusal_says_node_fact_values_and_what_to_do():
    text = nodefacts.refusal(1, [("torch", "2.13.0", "2.12.1"), ("cuda", "12.6", None)],
                             ("gpus", 8, 7), "2 nodes x 8 processes")
    assert text.startswith("differs from node 0: torch 2.12.1 on node 1, 2.13.0 on node 0; "
                           "CUDA (torch.version.cuda) none on node 1, 12.6 on node 0; 7 visible "
                           "GPUs on node 1, where the gang (2 nodes x 8 processes) runs 8 "
                           "processes per node, one GPU each. It started none of its ranks.")
    assert "the same image" in text and "machine type" in text


def test_facts_round_trip_and_a_field_a_release_did_not_send_is_none():
    assert NodeFacts.from_dict(json.loads(json.dumps(NODE_0.to_dict()))) == NODE_0
    older = dict(NODE_0.to_dict())
    del older["nccl"]
    assert NodeFacts.from_dict(older).nccl is None
    with pytest.raises(ValueError, match="no such fact of a node: cudnn"):
        NODE_0.changed({"cudnn": "9"})


def test_this_nodes_facts_and_the_test_seam():
    import platform

    import torch

    env = {gathered.TEST_ENV: json.dumps({"1": {"torch": "2.12.0"}}),
           gathered.CODE_SHA_ENV: "ab12"}
    mine = gathered.gather("train", 0, env)
    assert (mine.python, mine.torch, mine.cuda, mine.code) == (
        platform.python_version(), torch.__version__, torch.version.cuda, "ab12")
    assert mine.package and mine.metaflow
    assert gathered.gather("train", 1, env).torch == "2.12.0"  # node 1's changed, not node 0's
    assert gathered.gather("train", 0, {}).code is None  # a local run has no code package


@pytest.mark.parametrize("raw, why", [
    ("{", "Expecting property name"), ('{"1": 3}', "not an object of objects"),
    ('{"1": {"cudnn": "9"}}', "no such fact: cudnn"),
])
def test_a_bad_test_seam_is_a_clear_error(raw, why):
    with pytest.raises(TorchDistributedConfigError) as got:
        gathered.gather("train", 1, {gathered.TEST_ENV: raw})
    assert why in str(got.value) and gathered.TEST_ENV in str(got.value)


class _Store:
    """What wait_for_nodes reads of the control plane: the nodes' checks, the abort and the
    news tokens, changed by `script` at given looks."""

    def __init__(self, script):
        self.script, self.looks, self.checks = dict(script), 0, set()
        self.is_aborted, self.news = False, 0
        self.flag_reads = 0

    def nodes_news(self):
        self.looks += 1
        for what in self.script.pop(self.looks, ()):
            if what == "abort":
                self.is_aborted = True
            else:
                self.checks.add(what)
                self.news += 1
        return str(self.news).encode()

    def leader_news(self):
        return b"1" if self.is_aborted else b""

    def checked(self, node):
        self.flag_reads += 1
        return node in self.checks

    def aborted(self):
        return self.is_aborted


def _wait(store, nodes=3, timeout=10.0):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang.common import \
        wait_for_nodes

    now = [0.0]

    def sleep(s):
        now[0] += s

    return wait_for_nodes(store, nodes, timeout, clock=lambda: now[0], sleep=sleep), now[0]


def test_every_node_checked_ends_the_wait():
    store = _Store({3: [1], 40: [2]})
    done, waited = _wait(store)
    assert done and 1.9 < waited < 2.1  # node 2's check came at the 40th look, 50 ms apart
    # flags were read on news (and once a second), not at every look
    assert store.flag_reads < 10


@pytest.mark.parametrize("script, timeout", [({5: [1, "abort"]}, 10.0), ({5: [1]}, 3.0)],
                         ids=["node 0 aborted", "timeout"])
def test_an_abort_or_the_timeout_ends_the_wait_without_a_go(script, timeout):
    done, waited = _wait(_Store(script), timeout=timeout)
    assert not done and waited <= timeout + 0.1
    if timeout < 10:
        assert waited >= timeout


def test_a_gang_of_one_node_waits_for_nobody():
    assert _wait(_Store({}), nodes=1) == (True, 0.0)
