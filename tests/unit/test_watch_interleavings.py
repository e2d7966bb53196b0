"""No failure is ever lost: node 0's watch driven through every interleaving of rank 0's
failure (its error written down, its exit) and the rest of the gang ending, with an injected
clock and fake members (no thread, no sleep). The bug this pins (from when rank 0 ran in the
task): rank 0's collective failed (a symptom) after its peers had left the body, the watch held
the symptom for its cause, then saw every member finished and ended as FINISHED, and the step
was recorded as a success."""

import itertools

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
    Failure,
    save_exception,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
    record_error,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.supervisor import (
    SYMPTOM_WAIT,
    LeaderWatch,
    Phase,
    Slot,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from tests.unit.fakes import Clock, FakeMember


def rank0_failure(symptom):
    # gloo's word for a peer that went away, raised inside torch.distributed: a symptom; a
    # user's ValueError: a cause
    return Failure(0, 0, "exception", 1.0, local_rank=0,
                   message=("RuntimeError: Connection closed by peer" if symptom
                            else "ValueError: bad batch"), symptom=symptom)


def raised(symptom):
    """An exception as rank 0's body raises it: a peer gone (torch.distributed's own error, a
    symptom) or the user's ValueError (a cause)."""
    import torch.distributed as dist

    try:
        raise (dist.DistNetworkError("Connection closed by peer") if symptom
               else ValueError("bad batch"))
    except Exception as ex:  # noqa: BLE001 - the exception, with its traceback
        return ex


# rank 0's process writes its error down (its error file, then the exception's record), then
# exits with status 1, at every place among its peers' finishing and the watch's polls
EVENTS = ("peers_done", "writes_error", "exits", "poll", "poll")
ORDERS = sorted(o for o in set(itertools.permutations(EVENTS))
                if o.index("writes_error") < o.index("exits"))


@pytest.mark.parametrize("symptom", [True, False], ids=["symptom", "cause"])
@pytest.mark.parametrize("order", ORDERS, ids=lambda o: "-".join(o))
def test_rank_0s_failure_fails_the_watch_whatever_the_order(order, symptom, tmp_path):
    clock = Clock()
    members = [FakeMember() for _ in range(4)]
    error_file = str(tmp_path / "error-rank-0.json")
    slots = [Slot(members[0], 0, 0, 0, error_file)] + [
        Slot(m, 0, r, r) for r, m in enumerate(members[1:], 1)]
    calls = []
    watch = LeaderWatch(slots, None, Topology(1, 4), leader_slot=slots[0], finish_timeout=30,
                        on_failure=calls.append, clock=clock).begin()
    ex = raised(symptom)
    for event in order:
        if event == "peers_done":
            for m in members[1:]:
                m.code = 0
        elif event == "writes_error":
            record_error(ex, error_file)
            save_exception(ex, 1.0, error_file)
        elif event == "exits":
            members[0].code = 1
        else:
            watch.poll_once()
        clock.now += 0.05
    for _ in range(int(SYMPTOM_WAIT / 0.05) + 5):  # the thread goes on polling
        if watch.poll_once():
            break
        clock.now += 0.05
    assert watch.finished.is_set()
    assert watch.phase is Phase.FAILED, order
    [failure] = watch.failures
    assert calls == [failure]
    assert (failure.rank, failure.kind, failure.is_symptom()) == (0, "exception", symptom)
    assert failure.message == ("DistNetworkError: Connection closed by peer" if symptom
                               else "ValueError: bad batch"), failure.message


def test_a_report_after_the_watch_finished_is_still_recorded():
    clock = Clock()
    member = FakeMember()
    watch = LeaderWatch([Slot(member, 0, 1, 1)], None, Topology(1, 2), clock=clock).begin()
    member.code = 0
    assert watch.poll_once() and watch.phase is Phase.FINISHED
    watch.report(rank0_failure(True))
    assert watch.failed() and watch.phase is Phase.FAILED


def test_a_hung_rank_is_named_when_a_peers_timeout_closed_another_peers_connection():
    """Ranks 1 and 3 time out waiting for rank 2 and leave; rank 0, still waiting, then sees
    its connection to them closed (not a timeout). Rank 2, running without an error, is the
    one they all waited for (seen on a 2 x 2 gang with a process-group timeout of 8 s)."""
    clock = Clock()
    members = {rank: FakeMember() for rank in (1, 2, 3)}
    watch = LeaderWatch([Slot(m, rank // 2, rank, rank % 2) for rank, m in members.items()],
                        None, Topology(2, 2), finish_timeout=30,
                        on_failure=lambda f: None, clock=clock).begin()
    for rank in (1, 3):
        watch.report(Failure(rank, rank // 2, "exception", 1.0, local_rank=rank % 2,
                             symptom=True, message="RuntimeError: Timed out waiting 8000ms "
                             "for recv operation to complete"))
    watch.report(Failure(0, 0, "exception", 1.2, local_rank=0, symptom=True,
                         message="RuntimeError: Connection closed by peer [127.0.0.1]:17122"))
    for _ in range(int((SYMPTOM_WAIT + 6) / 0.05)):
        if watch.poll_once():
            break
        clock.now += 0.05
    assert watch.phase is Phase.FAILED
    hung = [f for f in watch.failures if f.kind == "hung"]
    assert [(f.rank, f.node) for f in hung] == [(2, 1)], watch.failures


class _Broken(FakeMember):
    """A member whose poll raises `error`: what the watch's thread meets."""

    def __init__(self, error):
        super().__init__()
        self.error = error

    def poll(self):
        raise self.error


@pytest.mark.parametrize("error, says", [
    (TypeError("%d format: a real number is required, not NoneType"),
     "stopped watching the gang on an error of the package's own (please report it with this "
     "traceback): TypeError: %d format"),
    (ConnectionResetError("connection reset by peer"),
     "lost the gang's control plane: connection reset by peer"),
])
def test_a_bug_of_the_watch_is_not_reported_as_a_lost_control_plane(error, says):
    """CI once reported 'lost the gang's control plane: %d format: ...': a TypeError of the
    package's own, reported as the network's, without a trace of where it came from."""
    watch = LeaderWatch([Slot(_Broken(error), 0, 1, 1)], None, Topology(1, 2)).start()
    assert watch.wait(10)
    [failure] = watch.failures
    assert failure.message.startswith(says), failure.message
    if isinstance(error, TypeError):
        assert "Traceback (most recent call last)" in failure.message
        assert "in poll" in failure.message  # the frame that raised


# -- rank 0 as one of the slots (its own process, start method fork) ------------------------------

def _leader_watch(clock, nproc=3, finish_timeout=30):
    members = [FakeMember() for _ in range(nproc)]
    slots = [Slot(m, 0, r, r) for r, m in enumerate(members)]
    calls = []
    watch = LeaderWatch(slots, None, Topology(1, nproc), finish_timeout=finish_timeout,
                        on_failure=calls.append, clock=clock, leader_slot=slots[0]).begin()
    return watch, members, calls


def test_rank_0s_process_running_on_after_every_other_rank_finished_is_timed():
    clock = Clock()
    watch, members, calls = _leader_watch(clock)
    for m in members[1:]:
        m.code = 0
    assert not watch.poll_once()  # the others done, rank 0 runs: not finished
    assert not watch.leader_ended.is_set()
    clock.now += 29.9
    assert not watch.poll_once()
    clock.now += 0.2
    assert watch.poll_once() and watch.phase is Phase.FAILED
    [failure] = calls
    assert (failure.rank, failure.kind) == (0, "unfinished") and "after every other rank " \
        "finished its own" in failure.message and "Metaflow task" not in failure.message


def test_rank_0s_process_ending_first_is_seen_and_the_rest_finish_the_watch():
    clock = Clock()
    watch, members, _ = _leader_watch(clock)
    members[0].code = 0
    assert not watch.poll_once() and watch.leader_ended.is_set()  # wait_for_leader returns
    for m in members[1:]:
        m.code = 0
    assert watch.poll_once() and watch.phase is Phase.FINISHED


@pytest.mark.parametrize("code, kind", [(1, "exit"), (-9, "signal")])
def test_rank_0s_process_failing_fails_the_watch_like_any_rank(code, kind):
    clock = Clock()
    watch, members, calls = _leader_watch(clock)
    members[0].code = code
    assert watch.poll_once() and watch.phase is Phase.FAILED
    [failure] = calls
    assert failure.rank == 0 and failure.kind == kind


def test_a_hung_rank_0_process_is_named_from_its_slot_once():
    """As a slot rank 0 is among the running ranks once."""
    clock = Clock()
    watch, members, _ = _leader_watch(clock, nproc=2)
    assert watch.running_ranks() == [0, 1]


class _Probes:
    """A node's probes (stacks.NodeProgress) as a watch reads them."""

    def __init__(self, reports):
        self.reports = reports

    def read(self):
        return dict(self.reports)


def test_a_hung_rank_named_by_its_own_nodes_agent_comes_with_its_stack():
    """Rank 3 (node 1) times out waiting for rank 2 (node 1) before any rank of node 0 does:
    node 1's agent names rank 2 itself, from its own ranks' probes, with the stack they saw
    (it had none: 1 run in 10 of tests/e2e/test_hangs.py's gang lost the stack that way)."""
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.supervisor \
        import AgentWatch

    stack = '  File "gang_flow.py", line 70, in maybe_fail\n    time.sleep(3600)\n'
    members = {rank: FakeMember() for rank in (2, 3)}
    slots = [Slot(m, 1, rank, rank % 2) for rank, m in members.items()]
    timeout = Failure(3, 1, "exception", 1.0, local_rank=1, symptom=True,
                      message="RuntimeError: Timed out waiting 18000ms for send operation")
    for probes in (_Probes({2: {"stack": stack}, 3: {"stack": ""}}), None):
        watch = AgentWatch(slots, None, Topology(2, 2), 1, clock=Clock(), progress=probes,
                           progress_interval=2.5)
        hung = watch._hung_rank([timeout])
        assert (hung.rank, hung.node, hung.kind) == (2, 1, "hung"), hung
        if probes is not None:
            assert hung.message.endswith(
                ". Its stack as its probe last saw it (most recent call last):\n" + stack)
        else:  # no probes (hang_timeout=0): where to look instead
            assert hung.message.endswith("see the debugging guide to dump its stack next time")
