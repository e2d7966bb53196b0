"""Restarts in place, as data: which round's failure starts the next round, what is said, and
how a round's keys stay apart from the other rounds' (core/rounds.py, core/naming.Keys)."""

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import naming, rounds
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedConfigError)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
    Failure)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.settings import resolve
from tests.unit.test_settings import CONFIG


def raised(rank, message="ValueError: bad", at=1.0):
    return Failure(rank, 0, "exception", at, local_rank=rank, message=message)


KILLED = Failure(3, 0, "signal", 2.0, -9, local_rank=3)


@pytest.mark.parametrize("kind", ["exception", "exit", "signal", "hung", "unfinished"])
def test_a_failure_of_the_ranks_own_making_is_restarted(kind):
    failure = Failure(1, 0, kind, 1.0, -9 if kind == "signal" else 3, local_rank=1)
    assert rounds.why_not_restart(failure, [], 2) is None


@pytest.mark.parametrize("kind", ["preempted", "lost", "missing", "agent", "control"])
def test_a_failure_the_same_machines_cannot_fix_is_left_to_the_attempt(kind):
    failure = Failure(None, 1, kind, 1.0)
    said = rounds.why_not_restart(failure, [], 2)
    assert said.startswith("A failure of this kind (%s) is not restarted in place" % kind)


def test_without_restarts_nothing_is_restarted_and_nothing_said():
    assert rounds.why_not_restart(KILLED, [], 0) == ""


def test_the_same_error_of_the_same_rank_twice_in_a_row_stops_early():
    said = rounds.why_not_restart(raised(1), [raised(1)], 5)
    assert said.startswith("Restarts stopped early: rank 1 (node 0, local rank 1) raised the "
                           "same error in rounds 0 and 1")
    # another rank, another message, or the same error not in the round just before: restart
    assert rounds.why_not_restart(raised(2), [raised(1)], 5) is None
    assert rounds.why_not_restart(raised(1, "ValueError: other"), [raised(1)], 5) is None
    assert rounds.why_not_restart(raised(1), [raised(1), KILLED], 5) is None
    # a signal twice is not a deterministic bug's mark (an OOM kill may not come again)
    assert rounds.why_not_restart(KILLED, [KILLED], 5) is None


def test_restarts_end_after_max_restarts():
    assert rounds.why_not_restart(KILLED, [KILLED], 2) is None
    assert rounds.why_not_restart(KILLED, [KILLED, raised(0)], 2) == (
        "Restarts exhausted: the gang was restarted in place 2 times (max_restarts=2).")
    assert "in place once (max_restarts=1)" in rounds.why_not_restart(KILLED, [raised(0)], 1)


def test_what_is_said_names_the_round_the_rank_and_the_cause():
    assert rounds.restart_line("train", 1, 3, KILLED) == (
        "@torch_distributed on step *train*: restart 1 of 3 after rank 3 (node 0) was killed "
        "by SIGKILL; every rank is started again")
    assert rounds.rounds_note([KILLED, raised(1)]) == (
        "Earlier rounds of this attempt (restarted in place): round 0: rank 3 (node 0) was "
        "killed by SIGKILL; round 1: rank 1 (node 0) raised ValueError: bad.")
    assert rounds.rounds_note([]) == ""


def test_each_round_has_its_own_keys_and_round_0_keeps_todays():
    first, second = naming.Keys(), naming.Keys(1)
    assert first.abort == "mftd/abort" and second.abort == "mftd/round/1/abort"
    for name, args in [("joined", ("node1",)), ("done", (1,)), ("failure", (1,)),
                       ("running", (1,)), ("rank_done", (2,)), ("progress", (1,)),
                       ("gather", (0, 2)), ("preempted", (1,)), ("stopped", (1,))]:
        assert getattr(first, name)(*args) != getattr(second, name)(*args), name
        assert getattr(second, name)(*args).startswith("mftd/round/1/"), name
    # the attempt's own: one store claim, one heartbeat count and log per node
    for name, args in [("beat", (1,)), ("log_chunk", (1, 3)), ("node_events", (1,))]:
        assert getattr(first, name)(*args) == getattr(second, name)(*args), name
    assert first.gang == second.gang and first.stacks == second.stacks
    assert first.word == "mftd/word" and second.word == "mftd/round/1/word"
    assert first.checkpoint != second.checkpoint


def test_a_node_that_cannot_take_part_in_the_next_round_is_named():
    assert rounds.nodes_not_stopped([1], 30.0, gone=False) == (
        "Not restarted in place: the agent of node 1 did not say within 30s that its ranks of "
        "the failed round stopped, so it is lost, and a restart in place needs every node: the "
        "attempt fails (@retry starts a new one).")
    assert rounds.nodes_not_stopped([1, 3], 30.0, gone=True).startswith(
        "Not restarted in place: the agent of nodes 1, 3 ended, so they are lost")
    assert "a SIGTERM reached node 2 while the failed round stopped" in \
        rounds.node_terminated(2)


def test_max_restarts_is_a_whole_number_of_0_or_more():
    assert resolve("train", {}, CONFIG).max_restarts == 0
    assert resolve("train", {"max_restarts": 3}, CONFIG).max_restarts == 3
    assert resolve("train", {}, dict(CONFIG, MAX_RESTARTS="2")).max_restarts == 2
    for bad in (-1, 1.5, "x", True):
        with pytest.raises(TorchDistributedConfigError, match="max_restarts=.* is not a whole "
                           "number of 0 or more. Give e.g. max_restarts=3"):
            resolve("train", {"max_restarts": bad}, CONFIG)
    with pytest.raises(TorchDistributedConfigError,
                       match="METAFLOW_TORCH_DISTRIBUTED_MAX_RESTARTS='-2'"):
        resolve("train", {}, dict(CONFIG, MAX_RESTARTS="-2"))

