"""Checkpoints and recovery: @checkpoint + @torch_distributed + @retry with no glue code.

checkpoint_flow.py trains a tiny DDP model for 60 steps on a gang of 2 nodes x 2 processes;
every 10 steps rank 0 writes model.pt into current.checkpoint.directory (the name a retry loads
it from) and saves it with current.checkpoint.save(). Ranks 2 and 3 run on node 1, under
its node agent (a spin-step process, where @checkpoint's own hooks never run).
"""

import json
import os

from tests.support import same_weights

GANG = {"TD_NODES": 2, "TD_NPROC": 2}
TRAIN = "t = Flow('CheckpointFlow').latest_run['train'].task\n"


def _mark(flow_runner, name):
    return float((flow_runner.marks / name).read_text())


def _starts(flow_runner, attempt, world_size):
    """The step each rank of `attempt` started training at (marks written by the flow)."""
    return [int(_mark(flow_runner, "start-%d-rank-%d" % (attempt, rank)))
            for rank in range(world_size)]


def _recovery_seconds(flow_runner, world_size):
    """From the SIGKILL to the first training step of the last rank of the resumed gang."""
    resumed = max(_mark(flow_runner, "first-step-1-rank-%d" % r) for r in range(world_size))
    return resumed - _mark(flow_runner, "killed-at")


# Every checkpoint attempt ATTEMPT of the task stored, oldest save first, read back with
# metaflow-checkpoint's own API: [the step its save's metadata names, the step its file holds].
STORED = """import os, tempfile, torch
from metaflow import Checkpoint
saves = sorted(Checkpoint().list(task=t, attempt=%d), key=lambda c: int(c['version_id']))
result = []
for c in saves:
    folder = tempfile.mkdtemp()
    Checkpoint().load(c, path=folder)
    result.append([c['metadata']['step'],
                   torch.load(os.path.join(folder, 'model.pt'))['step']])
"""


def stored_steps(flow_runner, attempt, train=TRAIN):
    """What each checkpoint of the latest run's `attempt` of the train task holds, oldest first:
    [(the step it was saved at, the step its model.pt holds)]."""
    return [tuple(pair) for pair in flow_runner.client(train + STORED % attempt)]


def saved_at(*steps):
    """What stored_steps finds when every save kept the step it was saved at."""
    return [(s, s) for s in steps]


def report_recovery(flow_runner, gang, world_size):
    """The recovery's seconds (from the SIGKILL to the resumed gang's first step), appended to
    TD_RECOVERY_REPORT when it is set (docs/checkpoints.md quotes these)."""
    recovery = _recovery_seconds(flow_runner, world_size)
    assert recovery > 0
    if os.environ.get("TD_RECOVERY_REPORT"):
        with open(os.environ["TD_RECOVERY_REPORT"], "a") as f:
            f.write(json.dumps({"gang": gang, "recovery_s": round(recovery, 2)}) + "\n")


def test_a_lost_rank_resumes_from_the_last_checkpoint_on_every_node(flow_runner):
    killed = flow_runner.run("checkpoint_flow.py",
                             env=dict(GANG, TD_KILL_RANK=3, TD_KILL_STEP=35))
    assert killed.returncode == 0, killed
    assert "rank 3 (node 1, local rank 1) was killed by SIGKILL" in killed.output, killed
    assert _starts(flow_runner, 0, 4) == [0, 0, 0, 0]
    # every rank of attempt 1, node 1's included, started from the checkpoint of step 30
    assert _starts(flow_runner, 1, 4) == [30, 30, 30, 30]
    resumed = flow_runner.client(TRAIN + "result = dict(w=t['weights'].data, "
                                 "first=t['resumed_from'].data, attempt=t.current_attempt)")
    assert resumed["first"] == 30 and resumed["attempt"] == 1, resumed
    report_recovery(flow_runner, "2x2", 4)
    # rank 0 wrote model.pt again where attempt 1 loaded it from (issue 38): attempt 0's saves
    # still hold the steps they were saved at, and attempt 1's saves are its own
    assert stored_steps(flow_runner, 0) == saved_at(10, 20, 30)
    assert stored_steps(flow_runner, 1) == saved_at(40, 50, 60)

    whole = flow_runner.run("checkpoint_flow.py", env=GANG)
    assert whole.returncode == 0, whole
    uninterrupted = flow_runner.client(TRAIN + "result = dict(w=t['weights'].data, "
                                       "first=t['resumed_from'].data)")
    assert uninterrupted["first"] == 0
    # same seeds, same batches: the resumed run ends with the same weights (support.py:
    # same_weights says why not to the last bit)
    assert same_weights(json.loads(resumed["w"]), json.loads(uninterrupted["w"]))


def test_a_rank_killed_in_the_middle_of_a_save_resumes_from_the_previous_checkpoint(
        flow_runner):
    # rank 0 (the task) dies inside the save of step 40, its files stored but not marked latest
    res = flow_runner.run("checkpoint_flow.py",
                          env={"TD_NODES": 2, "TD_NPROC": 1, "TD_KILL_IN_SAVE": 40})
    assert res.returncode == 0, res
    assert (flow_runner.marks / "killed-at").exists()
    assert _starts(flow_runner, 1, 2) == [30, 30]


def test_a_bug_fails_every_attempt_and_each_attempt_shows_it(flow_runner):
    res = flow_runner.run("checkpoint_flow.py", env={"TD_NODES": 2, "TD_NPROC": 1, "TD_BUG": 1})
    assert res.returncode != 0, res
    first, sep, retry = res.output.partition("Task is starting (retry).")
    assert sep, res  # @retry ran the gang again ...
    bug = "ValueError: a bug in the training loop at step 5"
    # ... and both attempts failed with the user's error, each in its own attempt's log
    assert bug in first and bug in retry, res
    assert _starts(flow_runner, 1, 2) == [0, 0]  # nothing was saved before step 5


SHARDED = "t = Flow('ShardedCheckpointFlow').latest_run['train'].task\n"


def test_sharded_checkpoints_of_every_rank_resume_every_node(flow_runner):
    """FSDP + torch.distributed.checkpoint: each rank stores its own shard with
    current.torch_distributed.save_sharded(); the retry loads all of them on every node."""
    weights = []
    for case in ({"TD_KILL_RANK": 3, "TD_KILL_STEP": 35},  # a lost rank
                 {"TD_KILL_RANK": 2, "TD_KILL_AFTER_SHARD": 40},  # dies inside a save
                 {}):  # uninterrupted
        for old in flow_runner.marks.glob("start-*"):
            old.unlink()
        res = flow_runner.run("sharded_checkpoint_flow.py", env=case)
        assert res.returncode == 0, res
        got = flow_runner.client(SHARDED + "result = dict(w=t['weights'].data, "
                                 "first=t['resumed_from'].data)")
        weights.append(json.loads(got["w"]))
        if case:
            # the save of step 40 that rank 2 did not finish is not what the retry loads
            assert _starts(flow_runner, 1, 4) == [30, 30, 30, 30], case
            assert got["first"] == 30
    assert weights[0] == weights[2] and weights[1] == weights[2]
