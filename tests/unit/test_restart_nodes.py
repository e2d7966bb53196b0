"""Node 0's wait, after a failed round of a multi-node gang with restarts in place, for every
other node's agent to say that its ranks stopped (gang.Leader._wait_for_nodes_to_stop): the
seam is the control plane, faked; the end-to-end paths are in tests/e2e/test_restarts.py."""

import types

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import (
    Topology)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import Leader, common
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.supervisor import (
    Slot)
from tests import records
from tests.unit.fakes import Clock, FakeMember


class Control:
    """The store as node 0 reads it: which nodes said they stopped, or were told to stop."""

    def __init__(self, stopped=(), preempted=()):
        self.stopped = set(stopped)
        self.preempted = set(preempted)

    def node_stopped(self, node):
        return node in self.stopped

    def node_preempted(self, node):
        return node in self.preempted


def waiting(control, nodes=3, agents=None, clock=None):
    """What node 0 says after waiting for the other nodes (None: every one stopped), on a
    clock that moves only while node 0 sleeps."""
    clock = clock or Clock()
    leader = records.leader(Topology(nodes, 2))
    assert isinstance(leader, Leader)
    leader.clock, leader.sleep = clock, clock.sleep
    slots = [Slot(member, node) for node, member in (agents or {}).items()]
    attempt = types.SimpleNamespace(control=control, runner=types.SimpleNamespace(slots=slots))
    return leader._wait_for_nodes_to_stop(attempt)


def test_every_node_stopped_restarts():
    assert waiting(Control(stopped={1, 2})) is None
    assert waiting(Control(), nodes=1) is None  # one node: nothing to wait for


def test_a_silent_node_is_lost():
    clock = Clock()
    said = waiting(Control(stopped={1}), clock=clock)
    assert said.startswith("Not restarted in place: the agent of node 2 did not say within "
                           "%gs that its ranks of the failed round stopped, so it is lost"
                           % common.NODES_STOP_WAIT), said
    assert common.NODES_STOP_WAIT <= clock.now < common.NODES_STOP_WAIT + 1  # waited it out


def test_a_node_that_says_it_stopped_late_but_in_time_restarts():
    clock = Clock()

    class Late(Control):
        def node_stopped(self, node):
            return node == 1 or clock.now >= common.NODES_STOP_WAIT - 1

    assert waiting(Late(), clock=clock) is None
    assert clock.now < common.NODES_STOP_WAIT


def test_a_local_agent_that_ended_is_lost_at_once():
    said = waiting(Control(stopped={2}), agents={1: FakeMember(code=-9), 2: FakeMember()})
    assert said.startswith("Not restarted in place: the agent of node 1 ended, so it is lost")


def test_a_node_told_to_stop_meanwhile_ends_the_attempt():
    said = waiting(Control(stopped={1}, preempted={2}))
    assert "a SIGTERM reached node 2 while the failed round stopped" in said
