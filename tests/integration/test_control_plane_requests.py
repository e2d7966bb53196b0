"""What the gang's watches ask of node 0's store (issue 25: every node's polling goes through
it). Real TCPStore, each request counted by a proxy; the watches driven by hand with an
injected clock. An idle gang's node 0 reads one news key a poll, and every node's messages
and heartbeats once a second, not every node's keys every poll; a message is still seen at
the next poll, and a forger who reverts the news token delays it by at most a full look."""

from datetime import timedelta

import pytest
import torch.distributed  # noqa: F401 - imported before any store, as in a task
from torch.distributed import TCPStore

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import Failure
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import control as C
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.supervisor import (
    FULL_LOOK_INTERVAL,
    POLL_INTERVAL,
    AgentWatch,
    GangAborted,
    LeaderWatch,
    Phase,
    Slot,
)
from tests.integration.conftest import hosted_store
from tests.unit.fakes import Clock, FakeMember

GANG = "1700-train-5-0"
SECRET = "0123456789abcdef0123456789abcdef"
NODES = 64


class Counting:
    """A store client that counts the requests made through it."""

    def __init__(self, store):
        self._store = store
        self.calls = []

    def __getattr__(self, name):
        attr = getattr(self._store, name)

        def call(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)

        return call if callable(attr) else attr


def counted(port):
    """(a ControlPlane whose requests are counted, its counter)."""
    store = Counting(TCPStore("127.0.0.1", port, None, False, timedelta(seconds=5)))
    return C.ControlPlane(store, GANG, SECRET), store


@pytest.fixture
def gang():
    host, port = hosted_store(GANG, SECRET)
    node = C.ControlPlane.connect("127.0.0.1", port, GANG, SECRET, timeout=5)
    yield host, node, port


def idle_leader(port, clock):
    """Node 0's watch of a gang of NODES nodes, every other node joined and beating."""
    control, store = counted(port)
    watch = LeaderWatch([], control, Topology(NODES, 8), watch_nodes=range(1, NODES),
                        heartbeat_timeout=30.0, on_preempt=lambda *a: None,
                        clock=clock).begin()
    return watch, store


def agent(port, node, clock):
    """Node `node`'s watch, one rank of its running, its requests counted."""
    control, store = counted(port)
    rank = node * 8
    watch = AgentWatch([Slot(FakeMember(), node, rank, 0)], control, Topology(NODES, 8), node,
                       on_preempt=lambda *a: None, clock=clock).begin()
    return watch, store


def poll_for(watch, clock, seconds):
    """Poll as the watch's thread does for `seconds` of the clock; True once it ended."""
    for _ in range(int(round(seconds / POLL_INTERVAL))):
        if watch.poll_once():
            return True
        clock.now += POLL_INTERVAL
    return False


def test_reading_a_message_that_is_there_is_one_request(gang):
    _, node, port = gang
    node.report_failure(3, Failure(25, 3, "exit", 1.0, 1, local_rank=1))
    control, store = counted(port)
    assert control.failure(3).rank == 25
    assert control.failure(4) is None
    assert len(store.calls) == 2  # one each (check, then get: three)


def test_an_idle_node_0_asks_less_than_one_request_per_node_a_poll(gang):
    _, node, port = gang
    for n in range(1, NODES):
        node.beat(n)
    clock = Clock()
    watch, store = idle_leader(port, clock)
    assert not poll_for(watch, clock, 2.0)
    polls = int(2.0 / POLL_INTERVAL)
    # one news key a poll, every node's messages and heartbeats once a second
    assert len(store.calls) < polls * (NODES - 1), len(store.calls)
    assert len(store.calls) <= polls + 3 * 4 * (NODES - 1)


def test_a_failure_a_node_reports_is_seen_at_the_next_poll(gang):
    _, node, port = gang
    clock = Clock()
    watch, _ = idle_leader(port, clock)
    assert not poll_for(watch, clock, 0.5)
    node.report_failure(NODES - 1, Failure(NODES * 8 - 1, NODES - 1, "exit", 1.0, 1,
                                           local_rank=7))
    assert watch.poll_once()
    assert watch.phase is Phase.FAILED and watch.failures[0].rank == NODES * 8 - 1


def test_a_reverted_news_token_delays_a_failure_by_one_full_look_at_most(gang):
    host, node, port = gang
    clock = Clock()
    watch, _ = idle_leader(port, clock)
    assert not poll_for(watch, clock, 0.5)
    before = host.nodes_news()
    node.report_failure(5, Failure(41, 5, "exit", 1.0, 1, local_rank=1))
    # a forger puts the old token back: the watch sees no news...
    raw = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=5))
    raw.set(C.NODES_NEWS, before)
    assert not watch.poll_once()
    # ...until its next full look
    assert poll_for(watch, clock, FULL_LOOK_INTERVAL + POLL_INTERVAL)
    assert watch.failures[0].rank == 41


def test_a_finished_node_is_seen_at_the_next_poll(gang):
    _, node, port = gang
    clock = Clock()
    control, _ = counted(port)
    watch = LeaderWatch([], control, Topology(2, 1), watch_nodes=[1], clock=clock).begin()
    assert not watch.poll_once()
    node.finish(1)
    clock.now += POLL_INTERVAL
    assert watch.poll_once() and watch.phase is Phase.FINISHED


def test_an_idle_agent_asks_one_request_a_poll(gang):
    _, _, port = gang
    clock = Clock()
    watch, store = agent(port, NODES - 1, clock)
    assert not poll_for(watch, clock, 2.0)
    polls = int(2.0 / POLL_INTERVAL)
    # the news key a poll; a second, a full look (abort, preemption) and a heartbeat (its
    # write and the server's answer)
    assert len(store.calls) <= polls + 2 * (2 + 2), store.calls


def test_an_agent_hears_the_abort_at_its_next_poll(gang):
    host, _, port = gang
    clock = Clock()
    watch, _ = agent(port, 1, clock)
    assert not poll_for(watch, clock, 0.5)
    host.abort()
    with pytest.raises(GangAborted):
        watch.poll_once()


@pytest.mark.parametrize("libuv_takes_a_listen_fd", [(2, 8, 0), (99, 0, 0)],
                         ids=["this-torch's-store", "legacy-store-as-before-torch-2.8"])
def test_node_0_hosts_the_store_on_its_socket_with_either_of_torchs_stores(
        monkeypatch, libuv_takes_a_listen_fd):
    """torch before 2.8 refuses a listening socket in its libuv store; node 0 then hosts the
    gang's store with the legacy one. Both serve a member, and a torch rendezvous client, on the
    socket node 0 bound (torch 2.5.1 and 2.15.0 run the whole flow in .ci/torch_range)."""
    monkeypatch.setattr(C, "LIBUV_LISTEN_FD", libuv_takes_a_listen_fd)
    host, port = hosted_store("gang-legacy", "s3cret")
    assert host._store.libuvBackend is (libuv_takes_a_listen_fd == (2, 8, 0))
    member = C.ControlPlane.connect("127.0.0.1", port, "gang-legacy", "s3cret", timeout=5)
    member.report_failure(1, Failure(3, 1, "exit", 1.0, 1, message="boom"))
    assert host.failure(1).message == "boom"
    rendezvous = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=5))
    rendezvous.set("k", "v")
    assert host._store.get("k") == b"v"
