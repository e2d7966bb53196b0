"""The supervisor with real member processes and a real control plane (torch TCPStore)."""

import errno
import gc
import os
import sys
import threading
import time

import pytest
import torch.distributed  # noqa: F401 - imported before any store, as in a task

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import naming
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import (
    ControlPlane,
    GangMismatch,
    bind_listener,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import Failure
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
    fork_member,
    spawn_member,
    stop_members,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import supervisor
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.supervisor import (
    SYMPTOM_WAIT,
    AgentWatch,
    LeaderWatch,
    Phase,
    Place,
    Slot,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from tests.integration.conftest import hosted_store
from tests.unit.fakes import Clock

GANG = "1700-train-5-0"
SECRET = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def gang():
    """Node 0's control plane on a kernel-chosen port, and a second client of it (a node)."""
    host, port = hosted_store(GANG, SECRET)
    node = ControlPlane.connect("127.0.0.1", port, GANG, SECRET, timeout=5)
    yield host, node, port


@pytest.fixture
def started():
    """Members a test spawned: stopped at the end whatever happened."""
    members = []
    yield members
    stop_members(members, 0.2)


def member(started, rank, script, label=None):
    """A real process (an interpreter without site, for speed) running `script`."""
    proc = spawn_member(label or naming.rank_label(rank),
                        [sys.executable, "-S", "-c", "import sys, time\n" + script],
                        {"PATH": os.environ.get("PATH", "")})
    started.append(proc)
    return proc


def drive(watch, clock, seconds, step=0.1):
    """Poll `watch` (begun, no thread) while `clock` moves on by `seconds`; True once it ended.
    The watch's deadlines are on the injected clock: nothing here sleeps."""
    for _ in range(int(round(seconds / step))):
        if watch.poll_once():
            return True
        clock.now += step
    return watch.poll_once()


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, failure):
        self.calls.append(failure)


def test_reports_the_first_failing_member_with_its_rank_and_node(gang, started):
    host, _, _ = gang
    topo = Topology(1, 4)
    slots = [
        Slot(member(started, 1, "sys.exit(0)"), 0, 1, 1),
        Slot(member(started, 2, "time.sleep(0.3); sys.exit(3)"), 0, 2, 2),
        Slot(member(started, 3, "time.sleep(60)"), 0, 3, 3),
        Slot(member(started, 4, "time.sleep(1.5); sys.exit(5)"), 0, 4, 4),
    ]
    recorder = Recorder()
    begun = time.monotonic()
    sup = LeaderWatch(slots, host, topo, on_failure=recorder).start()
    assert sup.wait(10)
    assert time.monotonic() - begun < 1.4  # did not wait for ranks 3 and 4
    assert len(recorder.calls) == 1 and sup.failures == recorder.calls
    failure = recorder.calls[0]
    assert (failure.rank, failure.node, failure.local_rank) == (2, 0, 2)
    assert (failure.kind, failure.exitcode) == ("exit", 3)
    assert failure.describe() == "rank 2 (node 0, local rank 2) exited with code 3."
    assert slots[2].member.poll() is None  # stopping the rest is the caller's job


def test_the_failure_carries_the_members_error_file(gang, started, tmp_path):
    host, _, _ = gang
    error_file = tmp_path / "error-rank-1.json"
    error_file.write_text('{"message": {"message": "ValueError: lr", '
                          '"extraInfo": {"py_callstack": "Traceback: here"}}}')
    slot = Slot(member(started, 1, "sys.exit(1)"), 0, 1, 1, str(error_file))
    sup = LeaderWatch([slot], host, Topology(1, 2)).start()
    assert sup.wait(10)
    failure = sup.failures[0]
    assert (failure.kind, failure.message, failure.traceback) == \
        ("exception", "ValueError: lr", "Traceback: here")


class _SlowTeardown:
    """Like a DataLoader's persistent workers: freeing it takes seconds."""

    def __del__(self):
        time.sleep(30)


def _raise_then_tear_down_slowly():
    held = _SlowTeardown()  # noqa: F841 - held by the frame, so by the traceback
    raise ValueError("bad batch")


def test_a_raise_is_reported_while_the_member_still_tears_down(tmp_path):
    error_file = str(tmp_path / "error-rank-1.json")
    member = fork_member("[rank 1]", _raise_then_tear_down_slowly, {}, error_file=error_file)
    try:
        slot = Slot(member, 0, 1, 1, error_file)
        raised_at = time.time()
        sup = LeaderWatch([slot], None, Topology(1, 2), on_failure=Recorder()).start()
        assert sup.wait(10)
        failure = sup.failures[0]
        assert member.poll() is None, "reported only once the process was gone"
        assert (failure.rank, failure.kind, failure.message) == (1, "exception",
                                                                "ValueError: bad batch")
        assert "_raise_then_tear_down_slowly" in failure.traceback
        assert raised_at - 1 < failure.detected_at < time.time()
        assert sup.running_ranks() == []  # a rank that raised is not "still running"
        # then its process group is stopped as before: nothing is left
        assert stop_members([member], 0.2) == ["[rank 1]"]
        assert member.poll() is not None
    finally:
        stop_members([member], 0.2)
        os.close(member.stdout_fd)
        os.close(member.stderr_fd)


def test_a_killed_member_is_reported_as_a_signal(gang, started):
    host, _, _ = gang
    slot = Slot(member(started, 1, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                0, 1, 1)
    sup = LeaderWatch([slot], host, Topology(1, 2)).start()
    assert sup.wait(10)
    assert sup.failures[0].describe() == "rank 1 (node 0, local rank 1) was killed by SIGKILL."


def test_finishes_when_every_member_exits_0(gang, started):
    host, _, _ = gang
    slots = [Slot(member(started, r, "time.sleep(%s)" % (0.1 * r)), 0, r, r) for r in (1, 2, 3)]
    recorder = Recorder()
    sup = LeaderWatch(slots, host, Topology(1, 4), on_failure=recorder).start()
    assert not sup.wait(0.1)  # rank 3 is still running
    assert sup.wait(10)
    assert not sup.failed() and recorder.calls == []
    assert [s.member.poll() for s in slots] == [0, 0, 0]


def test_the_watch_sees_the_last_member_end_as_it_happens_not_a_poll_later(gang, started,
                                                                             monkeypatch):
    """Between two looks the watch sleeps on its members' exits: with a poll interval of a
    minute, the last member's end still ends the watch at once (the end of a gang step)."""
    monkeypatch.setattr(supervisor, "POLL_INTERVAL", 60.0)
    host, _, _ = gang
    slots = [Slot(member(started, r, "time.sleep(0.5)"), 0, r, r) for r in (1, 2)]
    sup = LeaderWatch(slots, host, Topology(1, 3), on_failure=Recorder()).start()
    assert sup.wait(20), "the watch slept through its members' exits"
    assert not sup.failed() and [s.member.poll() for s in slots] == [0, 0]


def test_rank_0s_end_wakes_the_task_waiting_for_it_at_once(gang, started, monkeypatch):
    """Node 0's task waits for rank 0's process (wait_for_leader) and is woken as it ends,
    while the other ranks still run, whatever the poll interval."""
    monkeypatch.setattr(supervisor, "POLL_INTERVAL", 60.0)
    host, _, _ = gang
    rank0 = Slot(member(started, 0, "time.sleep(0.5)"), 0, 0, 0)
    slots = [rank0, Slot(member(started, 1, "time.sleep(60)"), 0, 1, 1)]
    sup = LeaderWatch(slots, host, Topology(1, 2), leader_slot=rank0,
                      on_failure=Recorder()).start()
    waiter = threading.Thread(target=sup.wait_for_leader, daemon=True)
    waiter.start()
    waiter.join(20)
    assert not waiter.is_alive(), "rank 0 ended but its task slept on"
    assert rank0.member.poll() == 0 and not sup.wait(0)


def test_sees_a_failure_a_node_reports_through_the_control_plane(gang):
    host, node, _ = gang
    recorder = Recorder()
    sup = LeaderWatch([], host, Topology(3, 2), watch_nodes=[1, 2], on_failure=recorder).start()
    assert not sup.wait(0.2)
    reported = Failure(3, 1, "exception", time.time(), 1, "RuntimeError: node one broke",
                       "Traceback ...", local_rank=1)
    node.report_failure(1, reported)
    assert sup.wait(10)
    assert recorder.calls == [reported]


def test_waits_for_every_watched_node_to_finish(gang):
    host, node, _ = gang
    sup = LeaderWatch([], host, Topology(3, 1), watch_nodes=[1, 2]).start()
    node.finish(1)
    assert not sup.wait(0.3)  # node 2 has not finished
    node.finish(2)
    assert sup.wait(10)
    assert not sup.failed()


def test_a_node_that_never_joins_is_reported_missing_by_name(gang):
    host, node, _ = gang
    topo = Topology(3, 2)
    joins = {naming.node_join_id(n): Place(n) for n in (1, 2)}
    node.join(naming.node_join_id(1))
    clock = Clock()
    sup = LeaderWatch([], host, topo, watch_nodes=[1, 2], expected_joins=joins,
                      join_timeout=1.0, clock=clock).begin()
    assert not drive(sup, clock, 0.9)  # within the rendezvous timeout: still waiting
    assert drive(sup, clock, 0.2)  # past it: missing
    failure = sup.failures[0]
    assert (failure.kind, failure.node, failure.rank) == ("missing", 2, None)
    assert "node 2 (ranks 4-5)" in failure.message and "node 1" not in failure.message
    assert "1.0s" in failure.message
    assert failure.describe().startswith("node 2 did not join the gang")


def test_a_missing_exec_rank_is_named(gang, started):
    host, node, _ = gang
    slots = [Slot(member(started, r, "time.sleep(60)"), 0, r, r) for r in (1, 2)]
    joins = {naming.rank_join_id(1): Place(0, 1, 1), naming.rank_join_id(2): Place(0, 2, 2)}
    node.join(naming.rank_join_id(2))
    clock = Clock()
    sup = LeaderWatch(slots, host, Topology(1, 3), expected_joins=joins, join_timeout=0.5,
                      clock=clock).begin()
    assert drive(sup, clock, 0.7)
    failure = sup.failures[0]
    assert (failure.kind, failure.rank, failure.local_rank) == ("missing", 1, 1)
    assert "Missing: rank 1 (node 0)." in failure.message


def test_no_missing_node_once_every_node_joined(gang):
    host, node, _ = gang
    joins = {naming.node_join_id(1): Place(1)}
    clock = Clock()
    sup = LeaderWatch([], host, Topology(2, 1), watch_nodes=[1], expected_joins=joins,
                      join_timeout=0.3, clock=clock).begin()
    node.join(naming.node_join_id(1))
    assert not drive(sup, clock, 0.6)  # past the deadline, still watching: nothing is missing
    node.finish(1)
    assert drive(sup, clock, 0.1)
    assert not sup.failed()


def test_the_gang_is_assembled_when_the_last_expected_join_arrives(gang):
    host, node, _ = gang
    joins = {naming.node_join_id(1): Place(1), naming.rank_join_id(1): Place(0, 1, 1)}
    assembled = []
    clock = Clock()
    sup = LeaderWatch([], host, Topology(2, 2), watch_nodes=[1], expected_joins=joins,
                      join_timeout=30, on_assembled=lambda: assembled.append(clock.now),
                      clock=clock).begin()
    node.join(naming.node_join_id(1))
    assert not drive(sup, clock, 0.3)
    assert assembled == [] and not sup.assembled.is_set()  # rank 1 has not checked in yet
    joined = clock.now
    node.join(naming.rank_join_id(1))
    assert not drive(sup, clock, 0.2)
    assert sup.assembled.is_set() and assembled == [joined]  # at the next look, once
    node.finish(1)
    assert drive(sup, clock, 0.1) and not sup.failed()


def test_a_gang_without_expected_joins_is_assembled_at_once(gang):
    host, _, _ = gang
    assembled = []
    sup = LeaderWatch([], host, Topology(1, 2), on_assembled=lambda: assembled.append(1))
    sup.start()
    assert assembled == [1]  # forked ranks: nothing to wait for
    sup.report(Failure(0, 0, "exception", time.time(), message="ValueError: x"))
    assert sup.wait(10)


def test_a_gang_missing_a_node_is_never_assembled(gang):
    host, _, _ = gang
    assembled = []
    joins = {naming.node_join_id(1): Place(1)}
    sup = LeaderWatch([], host, Topology(2, 1), watch_nodes=[1], expected_joins=joins,
                      join_timeout=0.3, on_assembled=lambda: assembled.append(1)).start()
    assert sup.wait(10)
    assert sup.failures[0].kind == "missing"
    assert assembled == [] and not sup.assembled.is_set()


def test_an_agent_stops_when_node_0_aborts(gang, started):
    host, node, _ = gang
    slot = Slot(member(started, 2, "time.sleep(60)"), 1, 2, 0)
    recorder = Recorder()
    sup = AgentWatch([slot], node, Topology(2, 2), 1, on_failure=recorder).start()
    assert not sup.wait(0.2)
    host.abort()
    assert sup.wait(10)
    assert sup.aborted and sup.phase is Phase.ABORTED
    assert [f.kind for f in recorder.calls] == ["aborted"]
    assert slot.member.poll() is None  # the agent stops its ranks itself


def test_node_0s_own_abort_does_not_end_its_watch(gang, started):
    host, _, _ = gang
    slot = Slot(member(started, 1, "time.sleep(0.4)"), 0, 1, 1)
    host.abort()
    sup = LeaderWatch([slot], host, Topology(1, 2)).start()
    assert sup.wait(10)
    assert not sup.failed() and sup.phase is Phase.FINISHED


def test_report_from_outside_calls_on_failure_once(gang, started):
    host, _, _ = gang
    slot = Slot(member(started, 1, "time.sleep(0.3); sys.exit(2)"), 0, 1, 1)
    recorder = Recorder()
    sup = LeaderWatch([slot], host, Topology(1, 2), on_failure=recorder).start()
    rank0 = Failure(0, 0, "exception", time.time(), message="ValueError: x", local_rank=0)
    sup.report(rank0)
    assert sup.wait(1)
    sup.report(Failure(1, 0, "exit", time.time(), 2, local_rank=1))
    assert recorder.calls == [rank0]
    assert len(sup.failures) == 2


def test_a_node_with_the_wrong_secret_is_told_it_reached_another_gang(gang):
    _, _, port = gang
    with pytest.raises(GangMismatch) as info:
        ControlPlane.connect("127.0.0.1", port, GANG, "not-the-secret", timeout=5)
    assert GANG in str(info.value)


def test_connect_to_another_gangs_store_raises_gang_mismatch(gang):
    _, _, port = gang
    with pytest.raises(GangMismatch) as info:
        ControlPlane.connect("127.0.0.1", port, "1700-train-5-1", "another-secret",
                             timeout=5)
    assert GANG in str(info.value) and "1700-train-5-1" in str(info.value)


def test_two_gangs_on_port_0_get_different_ports_and_stay_apart():
    listeners = [bind_listener("127.0.0.1", 0) for _ in range(2)]
    ports = [l.getsockname()[1] for l in listeners]
    hosts = [ControlPlane.host(l, "gang-%d" % i, "secret-%d" % i, timeout=10) for i, l in enumerate(listeners)]
    for listener in listeners:
        listener.close()
    assert ports[0] != ports[1] and 0 not in ports
    clients = [ControlPlane.connect("127.0.0.1", p, "gang-%d" % i, "secret-%d" % i,
                                    timeout=10)
               for i, p in enumerate(ports)]
    clients[0].join("node1")
    assert hosts[0].joined("node1") and not hosts[1].joined("node1")
    with pytest.raises(GangMismatch):
        ControlPlane.connect("127.0.0.1", ports[1], "gang-0", "secret-0", timeout=10)


def test_a_fixed_port_in_use_raises_eaddrinuse():
    first = bind_listener("127.0.0.1", 0)
    try:
        with pytest.raises(OSError) as info:
            bind_listener("127.0.0.1", first.getsockname()[1])
        assert info.value.errno == errno.EADDRINUSE
    finally:
        first.close()


def test_closing_the_listener_after_hosting_never_closes_someone_elses_fd(tmp_path):
    """TCPStore(master_listen_fd=...) closes the fd it is given when it is destroyed, and the
    leader closes its listener while the store lives on: the store must own an fd of its own."""
    listener = bind_listener("127.0.0.1", 0)
    number = listener.fileno()
    host = ControlPlane.host(listener, GANG, SECRET, timeout=10)
    listener.close()  # what Leader.run's finally does, the store still alive
    other = os.open(tmp_path / "artifact.bin", os.O_WRONLY | os.O_CREAT)
    if other != number:  # the task's next file takes the freed number
        os.dup2(other, number)
        os.close(other)
    del host
    gc.collect()
    time.sleep(0.3)
    try:
        os.fstat(number)
    finally:
        try:
            os.close(number)
        except OSError:
            pass


def test_an_agent_sends_heartbeats_and_node_0_sees_them(gang, started):
    host, node, _ = gang
    topo = Topology(2, 1)
    agent = AgentWatch([Slot(member(started, 1, "time.sleep(60)"), 1, 1, 0)], node, topo,
                       1).start()
    try:
        time.sleep(2.5)
        assert host.beats(1) >= 2
        watch = LeaderWatch([], host, topo, watch_nodes=[1], heartbeat_timeout=2).start()
        assert not watch.wait(3)  # beats keep coming: no failure
        watch.finished.set()
    finally:
        agent.finished.set()


def test_a_node_that_stops_beating_is_reported_lost_by_name(gang):
    host, node, _ = gang
    topo = Topology(2, 2)
    node.beat(1)  # it started, then went silent
    recorder = Recorder()
    clock = Clock()
    sup = LeaderWatch([], host, topo, watch_nodes=[1], heartbeat_timeout=1.0,
                      on_failure=recorder, clock=clock).begin()
    assert not drive(sup, clock, 0.9)
    assert drive(sup, clock, 0.3)
    [failure] = recorder.calls
    assert failure.kind == "lost" and failure.node == 1
    assert "stopped sending heartbeats 1.0s ago: node 1 (ranks 2-3)" in failure.describe()


def test_a_node_that_never_beat_is_left_to_the_join_deadline(gang):
    host, _, _ = gang
    clock = Clock()
    sup = LeaderWatch([], host, Topology(2, 1), watch_nodes=[1], heartbeat_timeout=0.3,
                      expected_joins={naming.node_join_id(1): Place(1)},
                      join_timeout=60, clock=clock).begin()
    assert not drive(sup, clock, 10)  # far past the heartbeat timeout: not lost, not joined
    assert not sup.failed()


def test_a_node_that_joined_and_never_beat_is_reported_lost(gang):
    """A node frozen between its join and its first beat (seen once on the Step Functions
    emulation, under load: node 0 then waited for torch's own timeout): once it has joined,
    no beat counts as a silent node, timed from when node 0 saw the join."""
    host, node, _ = gang
    recorder = Recorder()
    clock = Clock()
    sup = LeaderWatch([], host, Topology(2, 2), watch_nodes=[1], heartbeat_timeout=0.5,
                      expected_joins={naming.node_join_id(1): Place(1)}, join_timeout=60,
                      on_failure=recorder, clock=clock).begin()
    assert not drive(sup, clock, 1.0)  # not joined yet: the join deadline's business
    node.join(naming.node_join_id(1))  # joined, then nothing
    assert drive(sup, clock, 1.0)
    [failure] = recorder.calls
    assert failure.kind == "lost" and failure.node == 1
    assert "stopped sending heartbeats 0.5s ago: node 1 (ranks 2-3)" in failure.describe()


def test_a_restarted_round_leaves_a_node_still_starting_to_the_join_deadline(gang):
    """Restarts in place: a node's agent beat through round 0, then loads round 1's checkpoint
    and starts its ranks without beating (a large checkpoint takes longer than the heartbeat
    timeout). Until it joins round 1 it is the join deadline's; once joined, its silence is
    counted again."""
    host, node, _ = gang
    for _ in range(3):
        node.beat(1)  # round 0's beats
    recorder = Recorder()
    clock = Clock()
    sup = LeaderWatch([], host.for_round(1), Topology(2, 2), watch_nodes=[1],
                      heartbeat_timeout=0.5, expected_joins={naming.node_join_id(1): Place(1)},
                      join_timeout=60, on_failure=recorder, clock=clock).begin()
    assert not drive(sup, clock, 1.5)  # silent, not joined yet: not lost
    node.for_round(1).join(naming.node_join_id(1))  # joined round 1, then nothing
    assert drive(sup, clock, 1.0)
    [failure] = recorder.calls
    assert failure.kind == "lost" and failure.node == 1, failure


def test_unfinished_ranks_are_named_on_every_node(gang, started):
    host, node, _ = gang
    topo = Topology(2, 2)
    slots = [Slot(member(started, 1, "time.sleep(60)"), 0, 1, 1)]
    sup = LeaderWatch(slots, host, topo, watch_nodes=[1])
    failure = sup.unfinished_failure(7.0)
    assert (failure.rank, failure.node, failure.kind) == (1, 0, "unfinished")
    assert "did not finish its step body within 7.0s after rank 0 finished its own (still " \
        "running: rank 1 (node 0); rank 2 (node 1); rank 3 (node 1))" in failure.describe()
    node.rank_finished(2)  # node 1 agent saw rank 2 finish
    assert host.rank_is_done(2)  # rank_finished waits for the server
    assert "(still running: rank 1 (node 0); rank 3 (node 1))" in \
        sup.unfinished_failure(7.0).describe()


def test_an_agent_tells_node_0_which_of_its_ranks_finished(gang, started):
    host, node, _ = gang
    slots = [Slot(member(started, 2, "sys.exit(0)"), 1, 2, 0),
             Slot(member(started, 3, "time.sleep(60)"), 1, 3, 1)]
    agent = AgentWatch(slots, node, Topology(2, 2), 1).start()
    try:
        wait_until(lambda: host.rank_is_done(2))
        assert not host.rank_is_done(3)
    finally:
        agent.finished.set()


def test_rank_0_still_busy_long_after_every_other_rank_finished_is_failed(gang, started):
    host, _, _ = gang
    leader = Slot(member(started, 0, "time.sleep(30)"), 0, 0, 0)
    slots = [leader, Slot(member(started, 1, "sys.exit(0)"), 0, 1, 1)]
    recorder = Recorder()
    begun = time.monotonic()
    sup = LeaderWatch(slots, host, Topology(1, 2), leader_slot=leader,
                     finish_timeout=0.5, on_failure=recorder).start()
    assert sup.wait(5)
    assert time.monotonic() - begun < 3
    [failure] = recorder.calls
    assert (failure.rank, failure.kind) == (0, "unfinished")
    assert "rank 0 (node 0, local rank 0) did not finish its step body within 0.5s after " \
        "every other rank finished its own" in failure.describe()


def test_rank_0_that_finishes_in_time_is_not_failed(gang, started):
    host, _, _ = gang
    leader = Slot(member(started, 0, "time.sleep(1.5)"), 0, 0, 0)
    slots = [leader, Slot(member(started, 1, "sys.exit(0)"), 0, 1, 1)]
    sup = LeaderWatch(slots, host, Topology(1, 2), leader_slot=leader, finish_timeout=5).start()
    assert not sup.wait(0.5)
    assert sup.wait(4) and not sup.failed()


def wait_until(probe, timeout=5):
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_not_done_while_a_check_in_is_pending(gang, started):
    host, _, _ = gang
    slots = [Slot(member(started, 1, "sys.exit(0)"), 0, 1, 1)]
    clock = Clock()
    sup = LeaderWatch(slots, host, Topology(1, 2), join_timeout=30, clock=clock,
                      expected_joins={naming.rank_join_id(1): Place(0, 1, 1)}).begin()
    while slots[0].member.poll() is None:
        time.sleep(0.02)  # a real process: it exits 0 on its own
    assert not drive(sup, clock, 1.0)  # exited 0, but never checked in: not a finished gang
    host.join(naming.rank_join_id(1))
    assert drive(sup, clock, 0.1) and not sup.failed()


def test_a_symptom_waits_for_the_root_cause_from_another_node(gang):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import \
        root_cause

    host, node, _ = gang
    recorder = Recorder()
    clock = Clock()
    sup = LeaderWatch([], host, Topology(3, 1), watch_nodes=[1, 2], on_failure=recorder,
                      clock=clock).begin()
    node.report_failure(1, Failure(1, 1, "exception", time.time(), local_rank=0,
                                   message="RuntimeError: Connection closed by peer",
                                   symptom=True))  # as its rank decided (failures.py)
    assert not drive(sup, clock, 0.4)
    assert not recorder.calls  # only a symptom so far: still waiting for its cause
    assert sup.phase is Phase.HOLDING
    node.report_failure(2, Failure(2, 2, "signal", time.time(), -9, local_rank=0))
    assert drive(sup, clock, 0.1)
    assert root_cause(sup.failures).rank == 2
    assert sup.phase is Phase.FAILED


def test_symptoms_alone_are_reported_after_the_wait(gang):
    host, node, _ = gang
    clock = Clock()
    sup = LeaderWatch([], host, Topology(2, 1), watch_nodes=[1], clock=clock).begin()
    node.report_failure(1, Failure(1, 1, "exception", time.time(), local_rank=0,
                                   message="RuntimeError: Connection closed by peer",
                                   symptom=True))  # as its rank decided (failures.py)
    assert not drive(sup, clock, SYMPTOM_WAIT - 0.2)  # held for its cause
    assert drive(sup, clock, 0.5)  # none came: the symptom is the outcome
    assert [f.rank for f in sup.failures] == [1]


def test_whoever_waits_sees_the_hung_rank_named_with_its_peers_timeouts(gang, started):
    """Stopping members (on_failure) takes time; the failures a waiter reads must already hold
    the hung rank, not only the first timeout (the main thread reads them as soon as it wakes)."""
    host, _, _ = gang
    slots = [Slot(member(started, 1, "time.sleep(60)"), 0, 1, 1)]

    def slow_stop(failure):
        time.sleep(1.0)

    sup = LeaderWatch(slots, host, Topology(1, 2), on_failure=slow_stop).start()
    sup.report(Failure(0, 0, "exception", time.time(), local_rank=0,
                       message="DistStoreError: wait timeout after 10000ms, keys: /default_pg/0"))
    assert sup.wait(5)
    assert [(f.rank, f.kind) for f in sup.failures] == [(0, "exception"), (1, "hung")]
