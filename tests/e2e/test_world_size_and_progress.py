"""One gang run, checked twice: `world_size` alone on a machine without GPUs is one node of
that many processes (the plan is printed when the gang starts), and a rank's tqdm bar shows
while the step runs, in `run`'s output and in `logs`."""

import pytest

from tests.support import FlowRunner

WORLD = 2
TRAIN = "t = Flow('ProgressFlow').latest_run['train'].task\n"


@pytest.fixture(scope="module")
def gang(tmp_path_factory):
    runner = FlowRunner(tmp_path_factory.mktemp("progress"))
    res = runner.run("progress_flow.py", env={"TD_WORLD": WORLD})
    yield runner, res
    runner.assert_no_leftovers()


def test_world_size_alone_without_gpus_is_one_node(gang):
    runner, res = gang
    assert res.returncode == 0, res
    assert "train: 1 node x 2 processes = world size 2 (CPU, gloo)" in res.output, res
    got = runner.client(TRAIN + "result = dict(places=t['places'].data, total=t['total'].data)")
    places = got["places"]
    assert [(p["node_rank"], p["local_rank"]) for p in places] == [(0, 0), (0, 1)]
    assert {(p["num_nodes"], p["local_world_size"]) for p in places} == {(1, WORLD)}
    # rank 1 is a process of the task itself (forked by it), not of a node agent
    assert places[1]["parent"] == places[0]["pid"]
    assert got["total"] == WORLD
