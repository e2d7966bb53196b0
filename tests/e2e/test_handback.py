"""Rank 0's body in a process of its own (issue 22, point 1): what it leaves reaches the task
as if it had run there, and nothing it does to its own process reaches the supervisor."""

import glob
import os

import pytest

from tests.support import FlowRunner

pytestmark = pytest.mark.slow

TRAIN = "t = Flow('HandbackFlow').latest_run['train'].task\n"


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    return FlowRunner(tmp_path_factory.mktemp("handback"))


def large_blobs(runner):
    """The paths of the blobs over 1 MB in the flow's datastore."""
    return {p for p in glob.glob(str(runner.root / ".metaflow" / "HandbackFlow" / "data" / "*"
                                      / "*"))
            if not p.endswith("_meta") and os.path.getsize(p) > 1024 * 1024}


@pytest.mark.parametrize("method", ["fork", "exec"])
def test_rank_0s_artifacts_and_foreach_reach_the_task_from_its_own_process(runner, method):
    before = large_blobs(runner)
    res = runner.run("handback_flow.py",
                     env={"METAFLOW_TORCH_DISTRIBUTED_START_METHOD": method})
    assert res.returncode == 0, res
    got = runner.client(
        "import hashlib\n" + TRAIN + "big = t['big'].data\n"
        "run = Flow('HandbackFlow').latest_run\n"
        "result = dict(by=t['rank0_started_by'].data, size=len(big),\n"
        "              same=hashlib.sha256(big).hexdigest() == t['big_sha'].data,\n"
        "              each=len(list(run['each'])), seen=run['join'].task['shards_seen'].data,\n"
        "              big_key=t['big'].sha, secret_in_env=t['secret_in_env'].data)")
    big_key = got.pop("big_key")
    # no rank's environment, nor a process it starts, holds the attempt's secret: an exec'd
    # rank removes it as soon as it read it (before, each rank's and its children's held it)
    assert got == dict(by=method, size=20 * 1024 * 1024, same=True, each=3,
                       seen=["a", "b", "c"], secret_in_env=[[False, False], [False, False]])
    # the 20 MB artifact (random bytes: new in each run) is stored once, by rank 0
    assert [os.path.basename(p) for p in large_blobs(runner) - before] == [big_key]


def test_sys_exit_0_is_a_finished_rank_on_every_rank_rank_0_included(runner):
    res = runner.run("handback_flow.py", env={"TD_LEAVE": "sys_exit"})
    assert res.returncode == 0, res
    assert runner.client(TRAIN + "result = len(t['big'].data)") == 20 * 1024 * 1024


def test_a_rank_0_that_leaves_through_os_exit_is_said_to_have_handed_back_nothing(runner):
    res = runner.run("handback_flow.py", env={"TD_LEAVE": "os_exit"})
    assert res.returncode != 0, res
    assert "rank 0's process ended with exit status 0 but handed back nothing of its body " \
           "(it left through os._exit)" in res.output, res
