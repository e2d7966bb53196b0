"""What a gang has on AWS Batch, on the real Slurm cluster of .ci/slurm: @checkpoint under
@retry (the checkpoints read back after the run), HF Accelerate with no arguments, the gang's
card beside a card of the user's, and @catch around a gang that fails."""

import json
import re

from tests.e2e.test_card import _cards, _contents
from tests.e2e.test_checkpoints import GANG, TRAIN, _starts, saved_at, stored_steps
from tests.slurm.test_slurm_flows import NODES, job_ids


def test_a_lost_rank_resumes_from_its_checkpoint_in_a_new_job(slurm_runner, slurm_cluster):
    """checkpoint_flow.py (the local layer's): rank 3, on node 1, is SIGKILLed at step 35 of
    attempt 0, whose job fails; @retry's attempt 1 is a new Slurm job whose every rank starts
    from the checkpoint of step 30, and each attempt's saves are its own."""
    res = slurm_runner.run("checkpoint_flow.py", env=dict(GANG, TD_KILL_RANK=3,
                                                          TD_KILL_STEP=35))
    assert res.returncode == 0, res
    assert "rank 3 (node 1, local rank 1) was killed by SIGKILL" in res.output, res
    assert _starts(slurm_runner, 0, 4) == [0, 0, 0, 0]
    assert _starts(slurm_runner, 1, 4) == [30, 30, 30, 30]
    assert stored_steps(slurm_runner, 0) == saved_at(10, 20, 30)
    assert stored_steps(slurm_runner, 1) == saved_at(40, 50, 60)
    attempts = slurm_runner.client(TRAIN + "result = [t.current_attempt, t['resumed_from'].data]")
    assert attempts == [1, 30], attempts
    jobs = job_ids(res.output)
    assert len(jobs) == 4, jobs  # start, train twice (@retry: a new job), end
    assert "JobState=FAILED" in slurm_cluster.job(jobs[1])
    assert "JobState=COMPLETED" in slurm_cluster.job(jobs[2])
    for job in jobs[1:3]:
        assert "NumNodes=2 " in slurm_cluster.job(job)


def test_accelerate_the_card_and_catch_on_a_gang(slurm_runner, slurm_cluster):
    res = slurm_runner.run("slurm_features_flow.py")
    assert res.returncode == 0, res
    got = slurm_runner.client(
        "run = Flow('SlurmFeaturesFlow').latest_run\n"
        "failure = run['caught'].task['failure'].data\n"
        "result = dict(ranks=run['train'].task['ranks'].data, failure=[failure.type, "
        "failure.exception], train=run['train'].task.pathspec)")
    # Accelerator() with no arguments: one group of the gang's 4 processes on 2 nodes
    assert [(r["num_processes"], r["process_index"], r["group_size"]) for r in got["ranks"]] \
        == [(4, rank, 4) for rank in range(4)], got
    assert {r["distributed_type"] for r in got["ranks"]} == {"DistributedType.MULTI_CPU"}
    # @catch recorded the gang's root cause, from node 1, and the run went on
    assert got["failure"][0].endswith(".TorchDistributedGangFailed"), got
    assert "rank 3 (node 1, local rank 1) raised ValueError: rank 3 fails on purpose" in \
        got["failure"][1], got
    # the user's card holds what rank 0 appended; the gang's card is beside it
    cards = _cards(slurm_runner, "slurm_features_flow.py", got["train"].split("/", 1)[1])
    assert _contents(cards[("None", "blank")]) == [
        {"type": "section", "contents": [{"type": "markdown", "source": "\nbuilt on rank 0"}]}]
    gang = json.dumps(cards[("torch_distributed", "torch_distributed")])
    assert "Gang of step train, attempt 0" in gang and "### Outcome: success" in gang
    hosts = set(re.findall(r"\b(n\d)\b", gang))
    assert len(hosts & NODES) == 2, hosts  # the card names the gang's two Slurm nodes
