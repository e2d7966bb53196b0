"""A node that differs from node 0 is refused before it starts a rank (issue 41, point 3): a
local gang of 2 nodes whose node 1 reports another torch, or a GPU fewer, through the facts
each node reports at the rendezvous (METAFLOW_TORCH_DISTRIBUTED_TEST_NODE_FACTS, the test
seam of mf/nodefacts.py). The step fails at once with the node, the fact and both values, and
no rank of either node ran the step's code."""

import json

import pytest
import torch

from tests.support import FlowRunner

GANG = {"TD_NODES": 2, "TD_NPROC": 1, "TD_RDZV_TIMEOUT": 60}
FACTS = "METAFLOW_TORCH_DISTRIBUTED_TEST_NODE_FACTS"


@pytest.mark.parametrize("method", ["fork", "exec"])
@pytest.mark.parametrize("facts, said", [
    ({"1": {"torch": "2.12.0+cu121"}},
     "node 1 differs from node 0: torch 2.12.0+cu121 on node 1, %s on node 0" % torch.__version__),
    ({"0": {"gpus": 8}, "1": {"gpus": 7}},
     "node 1 differs from node 0: visible GPUs 7 on node 1, 8 on node 0"),
], ids=["torch", "gpus"])
def test_a_node_that_differs_is_refused_before_its_ranks_start(tmp_path, facts, said, method):
    runner = FlowRunner(tmp_path)
    res = runner.run("gang_flow.py", env=dict(
        GANG, **{FACTS: json.dumps(facts), "METAFLOW_TORCH_DISTRIBUTED_START_METHOD": method}))
    assert res.returncode != 0, res
    assert said in res.output, res.output[-4000:]
    assert "It started none of its ranks" in res.output
    assert res.elapsed < 45, "failed at once, not at the rendezvous timeout (60 s)"
    # no rank ran the step's code: node 1 started none, node 0's waited for node 1's check
    assert not list(runner.marks.glob("body-*")), sorted(p.name for p in runner.marks.iterdir())
    runner.assert_no_leftovers()


@pytest.mark.parametrize("method", ["fork", "exec"])
def test_the_same_nodes_run(tmp_path, method):
    """The control: the same facts on every node (the seam changes nothing that differs); node
    0's ranks wait for both other nodes' check, then every rank runs the body."""
    runner = FlowRunner(tmp_path)
    res = runner.run("gang_flow.py", env=dict(GANG, TD_NODES=3, **{
        FACTS: json.dumps({"0": {"gpus": 0}, "2": {"gpus": 0}}),
        "METAFLOW_TORCH_DISTRIBUTED_START_METHOD": method}))
    assert res.returncode == 0, res
    assert "differs from node 0" not in res.output
    assert sorted(p.name for p in runner.marks.glob("body-*")) == ["body-0", "body-1", "body-2"]
