"""Restarts in place: @torch_distributed(max_restarts=N) starts a failed gang again on the same
machine within the same Metaflow attempt, from the latest checkpoint.

checkpoint_flow.py trains a tiny DDP model for 60 steps (rank 0 saves every 10) on a gang of
TD_NODES x TD_NPROC processes; with TD_MAX_RESTARTS its marks count the gang's rounds
(current.torch_distributed.restart_count) instead of the attempts.
"""

import json

import pytest

import re

from tests.support import FlowRunner, card_charts, card_json

from tests.e2e.test_checkpoints import _mark, _starts, report_recovery, saved_at, stored_steps

TRAIN = "t = Flow('CheckpointFlow').latest_run['train'].task\n"
ONE_NODE = {"TD_NODES": 1, "TD_NPROC": 4, "TD_MAX_RESTARTS": 1}
TWO_NODES = {"TD_NODES": 2, "TD_NPROC": 2, "TD_MAX_RESTARTS": 1}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The weights of an uninterrupted run of a world of 4, run once for the module: ranks'
    batches depend only on (step, rank), and 1 x 4 and 2 x 2 end bit for bit the same
    (checked when this was written), so either topology's restarted run is compared to it."""
    runner = FlowRunner(tmp_path_factory.mktemp("uninterrupted"))
    whole = runner.run("checkpoint_flow.py", env=ONE_NODE)
    assert whole.returncode == 0, whole
    found = runner.client(TRAIN + "result = dict(w=t['weights'].data, "
                          "restarts=t['restart_count'].data)")
    runner.assert_no_leftovers()
    assert found["restarts"] == 0
    return json.loads(found["w"])


# every rank exec'd (a spin-step of the task), rank 0 too: the one SIGKILLed
EXEC_TWO_NODES = dict(TWO_NODES, METAFLOW_TORCH_DISTRIBUTED_START_METHOD="exec")


@pytest.mark.parametrize("gang, killed_rank", [(ONE_NODE, 3), (TWO_NODES, 3),
                                               (EXEC_TWO_NODES, 0)],
                         ids=["1x4", "2x2", "2x2-exec-rank-0"])
def test_a_killed_rank_restarts_the_gang_in_place_from_the_last_checkpoint(
        flow_runner, gang, killed_rank, uninterrupted):
    """Rank 3 (node 0 of 1 x 4, node 1 of 2 x 2), or rank 0 of an exec'd 2 x 2, is SIGKILLed
    at step 35: every rank of every node starts again within the attempt, from the checkpoint
    of step 30."""
    killed = flow_runner.run("checkpoint_flow.py",
                             env=dict(gang, TD_KILL_RANK=killed_rank, TD_KILL_STEP=35))
    assert killed.returncode == 0, killed
    node = killed_rank // gang["TD_NPROC"]
    assert ("restart 1 of 1 after rank %d (node %d) was killed by SIGKILL; every rank is "
            "started again" % (killed_rank, node) in killed.output), killed
    assert "Task is starting (retry)" not in killed.output, killed  # the same attempt
    assert _starts(flow_runner, 0, 4) == [0, 0, 0, 0]
    # every rank of round 1 started from the checkpoint of step 30, saved by round 0
    assert _starts(flow_runner, 1, 4) == [30, 30, 30, 30]
    assert [_mark(flow_runner, "restart-count-1-rank-%d" % r) for r in range(4)] == [1] * 4
    resumed = flow_runner.client(
        TRAIN + "import json\nresult = dict(w=t['weights'].data, first=t['resumed_from'].data, "
        "attempt=t.current_attempt, restarts=t['restart_count'].data, "
        "recorded=[json.loads(m.value) for m in t.metadata "
        "if m.name == 'torch_distributed_restart'])")
    assert resumed["attempt"] == 0 and resumed["restarts"] == 1, resumed
    assert resumed["first"] == 30, resumed
    assert [(r["restart"], r["rank"], r["kind"]) for r in resumed["recorded"]] == \
        [(1, killed_rank, "signal")], resumed
    report_recovery(flow_runner, "%dx%d in place%s" % (
        gang["TD_NODES"], gang["TD_NPROC"], ", exec" if gang is EXEC_TWO_NODES else ""), 4)
    # round 1 wrote model.pt again where it loaded the step-30 save from, and saved it under
    # keys of its own (issue 38): every save of either round holds the step it was saved at
    assert stored_steps(flow_runner, 0) == saved_at(10, 20, 30, 40, 50, 60)
    # the card's timeline has both rounds on each rank's row: the killed rank's first process
    # failed
    bars = _card_bars(flow_runner, killed.output)
    assert {b["outcome"] for b in bars if b["rank"] == killed_rank
            and b.get("round") == 0} == {"failed"}
    assert {b.get("round") for b in bars if b["rank"] == 1} == {0, None}, bars
    assert all(b["outcome"] == "finished" for b in bars if b.get("round") is None), bars

    # same seeds, same batches: the restarted gang ends with exactly the same weights
    assert json.loads(resumed["w"]) == uninterrupted


def test_the_same_error_in_two_rounds_stops_the_restarts_early(flow_runner):
    res = flow_runner.run("checkpoint_flow.py",
                          env={"TD_NODES": 1, "TD_NPROC": 2, "TD_MAX_RESTARTS": 3,
                               "TD_BUG": "one"})
    assert res.returncode != 0, res
    first, sep, _ = res.output.partition("Task is starting (retry).")
    assert sep, res  # the attempt failed, and @retry took over
    assert "restart 1 of 3 after rank 1 (node 0) raised ValueError: a bug in rank 1's" in first
    assert "restart 2 of 3" not in first, res
    assert ("Restarts stopped early: rank 1 (node 0, local rank 1) raised the same error in "
            "rounds 0 and 1") in first, res
    assert "ValueError: a bug in rank 1's training loop at step 5" in first


def test_exhausted_restarts_fail_with_the_last_cause_and_a_line_per_round(flow_runner):
    res = flow_runner.run("checkpoint_flow.py",
                          env={"TD_NODES": 1, "TD_NPROC": 2, "TD_MAX_RESTARTS": 1,
                               "TD_BUG": "changing"})
    assert res.returncode != 0, res
    first = res.output.partition("Task is starting (retry).")[0]
    assert "ValueError: a flaky failure in round 1" in first, res
    assert "Restarts exhausted: the gang was restarted in place once (max_restarts=1)." in first
    assert ("Earlier rounds of this attempt (restarted in place): round 0: rank 1 (node 0) "
            "raised ValueError: a flaky failure in round 0.") in first, res


def test_a_sigterm_to_the_task_while_a_round_stops_is_not_lost_on_a_restart(flow_runner):
    """The task is told to stop (a scheduler's SIGTERM) while it stops the failed round: no new
    round starts, and the attempt fails with the round's root cause."""
    res = flow_runner.run("checkpoint_flow.py",
                          env=dict(ONE_NODE, TD_KILL_RANK=3, TD_KILL_STEP=35,
                                   TD_TERM_TASK_ON_STOP=1))
    first = res.output.partition("Task is starting (retry).")[0]
    assert "restart 1 of 1" not in first, res
    assert "Not restarted in place: a SIGTERM reached the task while the failed round " \
        "stopped" in first, res
    assert "rank 3 (node 0, local rank 3) was killed by SIGKILL" in first, res
    assert not (flow_runner.marks / "start-1-rank-0").exists()  # round 1 never began


def test_a_sigterm_to_a_node_agent_while_a_round_stops_ends_the_attempt(flow_runner):
    """Node 1's agent is told to stop (its machine is going away) while it stops its ranks of
    the failed round: node 0 restarts nothing, the attempt fails with the round's root cause,
    and @retry takes over."""
    res = flow_runner.run("checkpoint_flow.py",
                          env=dict(TWO_NODES, TD_KILL_RANK=3, TD_KILL_STEP=35,
                                   TD_TERM_AGENT_ON_STOP=1))
    first, sep, _ = res.output.partition("Task is starting (retry).")
    assert sep, res
    assert "restart 1 of 1" not in first, res
    assert "Not restarted in place: a SIGTERM reached node 1 while the failed round stopped" \
        in first, res
    assert "rank 3 (node 1, local rank 1) was killed by SIGKILL" in first, res
    assert not (flow_runner.marks / "start-1-rank-0").exists()  # round 1 never began


def test_a_lost_node_is_not_restarted_in_place_and_retry_takes_over(flow_runner):
    """Node 1's agent is SIGKILLed (its machine gone): no restart in place, the attempt fails
    naming the node, and @retry's attempt resumes from the latest checkpoint."""
    res = flow_runner.run("checkpoint_flow.py", env=dict(TWO_NODES, TD_KILL_AGENT_STEP=35))
    assert res.returncode == 0, res
    first, sep, _ = res.output.partition("Task is starting (retry).")
    assert sep, res  # the attempt failed, and @retry took over
    assert "restart 1 of 1" not in first, res
    assert "node 1 node agent exited with code -9 before reporting a cause" in first, res
    assert "A failure of this kind (agent) is not restarted in place" in first, res
    # the retry's round 0 started from the checkpoint of step 30 on every rank
    assert _starts(flow_runner, 0, 4) == [30, 30, 30, 30]


def _card_bars(flow_runner, output):
    """The bars of the gang card's timeline of the train task the run's `output` names."""
    run_id = re.search(r"run-id (\d+)", output).group(1)
    pathspec = "%s/train/%s" % (run_id, re.search(r"%s/train/(\d+)" % run_id, output).group(1))
    listed = flow_runner.cli("checkpoint_flow.py", "card", "list", pathspec)
    [card_hash] = re.findall(r"Card Type: torch_distributed\s+Card Hash: (\w+)", listed.output)
    target = flow_runner.root / "card.html"
    got = flow_runner.cli("checkpoint_flow.py", "card", "get", pathspec, "--hash", card_hash,
                          str(target))
    assert got.returncode == 0, got.output
    return card_charts(card_json(target.read_text()))[0]


def test_every_round_starts_its_ranks_with_the_signal_handling_of_the_first(flow_runner):
    """A round's ranks are forked while their supervisor (node 0's task, node 1's agent) has
    its own handlers installed: they must not inherit them. Each round's ranks start as the
    first round's did (the package's SIGTERM handler, Metaflow's @timeout alarm, no wakeup fd
    of the supervisor's), so the stop's SIGTERM unwinds rank 0 in every round: its finally
    block runs and @catch keeps what it set."""
    res = flow_runner.run("round_signals_flow.py")
    assert res.returncode == 0, res  # @catch
    assert "restart 1 of 1 after rank 3 (node 1) raised ValueError: rank 3 fails round 0" \
        in res.output, res
    for rank in range(4):
        first, second = (json.loads((flow_runner.marks / ("signals-%d-%d" % (r, rank)))
                                    .read_text()) for r in (0, 1))
        assert second == first, (rank, first, second)
        assert "install_rank_handler" in second["SIGTERM"] and second["wakeup_fd"] == -1, second
    assert (flow_runner.marks / "finally-0").exists() and (flow_runner.marks / "finally-1").exists()
    got = flow_runner.client("t = Flow('RoundSignalsFlow').latest_run['train'].task\n"
                             "result = [t['left'].data, str(t['err'].data)]")
    assert got[0] == 1, got
    assert "rank 3 fails round 1" in got[1], got
