"""Every way a rank can fail stops the whole gang fast, names the cause and leaves nothing.

2 nodes x 2 processes: rank 0 is the Metaflow task, rank 1 a member forked on node 0, rank 2
a member on node 1 (started by node 1's agent)."""

import time

import pytest

from tests.support import FlowRunner

GANG = {"TD_NODES": 2, "TD_NPROC": 2}
# Issue 2 promises detection within 10 s; the fault matrix targets 5 s (docs/reliability.md).
DETECTION_BOUND = 10.0
WHERE = {0: "rank 0 (node 0, local rank 0)", 1: "rank 1 (node 0, local rank 1)",
         2: "rank 2 (node 1, local rank 0)"}


def run_failing(flow_runner, rank, when, how, extra=None):
    env = dict(GANG, TD_FAIL_RANK=rank, TD_FAIL_WHEN=when, TD_FAIL_HOW=how, **(extra or {}))
    res = flow_runner.run("gang_flow.py", env=env)
    ended = time.time()
    failed_at = flow_runner.failed_at()
    assert failed_at is not None, res
    return res, ended - failed_at


@pytest.mark.parametrize("when", ["before_init", "in_collective", "after_body"])
@pytest.mark.parametrize("how", ["raise", "exit", "sigkill"])
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_failing_rank_fails_the_gang(flow_runner, rank, when, how):
    res, latency = run_failing(flow_runner, rank, when, how)
    assert res.returncode != 0, res
    assert latency < DETECTION_BOUND, (latency, res)
    if not (rank == 0 and how == "sigkill"):  # a SIGKILLed task cannot speak for itself
        assert WHERE[rank] in res.output, res
    if how == "raise":
        assert "ValueError: injected failure on rank %d" % rank in res.output, res
        assert "Traceback" in res.output
    if how == "exit" and rank != 0:
        assert "exited with code 3" in res.output, res
    if how == "sigkill" and rank != 0:
        assert "killed by SIGKILL" in res.output, res
    # the failing rank's last lines are in the log
    assert "[rank %d] last words of rank %d" % (rank, rank) in res.output, res
    print("detection latency rank=%d when=%s how=%s: %.2fs" % (rank, when, how, latency))


def test_missing_node_fails_after_rendezvous_timeout(flow_runner):
    # node 1's agent hangs while importing the flow: it never joins
    res = flow_runner.run("gang_flow.py", env=dict(GANG, TD_HANG_NODE=1, TD_RDZV_TIMEOUT=4))
    assert res.returncode != 0, res
    assert "rendezvous timeout of 4" in res.output, res
    assert "node 1 (ranks 2-3)" in res.output, res
