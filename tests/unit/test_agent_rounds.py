"""A node agent's wait for node 0's word after a round of a gang restarted in place
(gang/agent.py, Agent._next_round), driven on an injected clock: the seam is the control
plane, faked; the end-to-end paths are in tests/e2e/test_restarts.py."""

import types

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import Agent, common
from tests import records
from tests.unit.fakes import Clock


class Control:
    """Node 0's store as an agent reads it between rounds: node 0's word comes at `word_at`."""

    round = 0

    def __init__(self, clock, word=None, word_at=None):
        self.clock, self.said, self.word_at = clock, word, word_at
        self.stopped, self.preempted, self.asked = [], [], 0

    def report_stopped(self, node):
        self.stopped.append(node)

    def report_preempted(self, node):
        self.preempted.append(node)

    def word(self):
        self.asked += 1
        return self.said if self.word_at is not None and self.clock() >= self.word_at else None


class Runner:
    def __init__(self):
        self.slots, self.started, self.stopped = [], [], 0

    def stop(self, ranks_only=False):
        self.stopped += 1

    def new_round(self, spec):
        self.spec = spec

    def start_ranks(self, local_ranks):
        self.started = list(local_ranks)


def agent(clock):
    spec = records.spec(blueprint_changes=dict(rendezvous_timeout_s=60.0, max_restarts=2))
    return Agent(spec, Topology(2, 2), clock=clock, sleep=clock.sleep)


def supervisor(sigterm_at=None):
    return types.SimpleNamespace(sigterm_at=sigterm_at)


def test_node_0s_restart_starts_the_next_round_with_one_more_restart_count():
    clock = Clock()
    control, runner = Control(clock, "restart", word_at=5.0), Runner()
    node = agent(clock)
    assert node._next_round(runner, control, supervisor())
    assert control.stopped == [1] and runner.stopped == 1  # said so, after stopping its ranks
    assert runner.started == [0, 1] and node.spec.restart_count == 1
    assert 5.0 <= clock.now < 5.2  # it waited for the word, polling


def test_no_word_within_the_wait_leaves_the_gang():
    clock = Clock()
    control, runner = Control(clock), Runner()
    assert not agent(clock)._next_round(runner, control, supervisor())
    waited = 60.0 + common.NODES_STOP_WAIT
    assert waited <= clock.now < waited + 1 and control.asked > 100
    assert runner.started == []


def test_node_0s_end_or_a_sigterm_leaves_at_once():
    clock = Clock()
    assert not agent(clock)._next_round(Runner(), Control(clock, "end", 0.0), supervisor())
    assert clock.now == 0.0
    control = Control(clock, "restart", 0.0)
    assert not agent(clock)._next_round(Runner(), control, supervisor(sigterm_at=1.0))
    assert control.preempted == [1] and control.stopped == []  # told node 0 instead
