"""Issue 37, points 4 and 5: deleting a node's messages from the gang's store is seen, and so
is a flood of the store. A real store
hosted as node 0 hosts it, node 1's real agent watch (beats and progress, as agent.py makes
it, with a member process of its own), node 0's real watch, and an intruder in a process of
its own that knows only the port and deletes a key of node 1 in a loop."""

import os
import subprocess
import sys
import time

import pytest
import torch.distributed  # noqa: F401 - imported before any store, as in a task

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import naming, sealed
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import stacks
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import (
    ControlPlane,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.floodwatch import (
    STORE_MAX_KEYS_ENV,
    STORE_MAX_MB_ENV,
    FloodWatch,
    max_keys,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
    spawn_member,
    stop_members,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.supervisor import (
    AgentWatch,
    LeaderWatch,
    Slot,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.card import ignored_note
from tests.integration.conftest import hosted_store

GANG = "1700-train-37-0"
SECRET = "0123456789abcdef0123456789abcdef"
KEYS = naming.Keys()
TOPO = Topology(2, 1)

# An outsider's loop: once told (a line on stdin), delete KEY as fast as the store answers,
# until killed.
DELETER = """
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timedelta(seconds=30))
print("ready", flush=True)
sys.stdin.readline()
while True:
    store.delete_key(sys.argv[2])
"""


class Hang:
    """When the gang hung (None: it still moves)."""
    since = None


class Hung:
    """A node's ranks as their probes see them (stacks.NodeProgress's read): training until
    the Hang began, then every rank waits in an all_reduce and no collective completes."""

    def __init__(self, ranks):
        self.ranks = list(ranks)

    def read(self):
        quiet = 0.0 if Hang.since is None else time.monotonic() - Hang.since
        return {r: stacks.Report(quiet_s=quiet, seq=7, waiting="all_reduce", where="train.py:9",
                                 stack="", age_s=0.1, done=False) for r in self.ranks}


@pytest.fixture
def gang():
    host, port = hosted_store(GANG, SECRET)
    node = ControlPlane.connect("127.0.0.1", port, GANG, SECRET, timeout=5)
    rank1 = spawn_member(naming.rank_label(1), [sys.executable, "-S", "-c",
                                                "import time; time.sleep(60)"],
                         {"PATH": os.environ.get("PATH", "")})
    hang_timeout = 4.0
    agent = AgentWatch([Slot(rank1, 1, 1, 0)], node, TOPO, 1, progress=Hung([1]),
                       progress_interval=stacks.interval_for(hang_timeout) / 2).start()
    intruders = []
    Hang.since = None

    def intruder(key):
        """An intruder ready to delete `key`: call it to start (when it did: the hang too)."""
        proc = subprocess.Popen([sys.executable, "-c", DELETER, str(port), key],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        intruders.append(proc)
        assert proc.stdout.readline() == b"ready\n"

        def go():
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            Hang.since = time.monotonic()
            return Hang.since
        return go

    yield host, intruder, hang_timeout
    for proc in intruders:
        proc.kill()
        proc.wait()
    agent.finished.set()
    stop_members([rank1], 0.2)


def _new_ignored(before):
    now = sealed.IGNORED.counts()
    return {k: n - before.get(k, 0) for k, n in now.items() if n - before.get(k, 0)}


def test_a_node_whose_progress_is_deleted_in_a_loop_during_a_hang_is_failed_in_time(gang):
    """Before: node 0 held node 1's last progress that got through, its quiet time frozen
    below hang_timeout, and gave no verdict until the deletions stopped."""
    host, intruder, hang_timeout = gang
    before = sealed.IGNORED.counts()
    failures = []
    watch = LeaderWatch([], host, TOPO, watch_nodes=[1], heartbeat_timeout=30,
                        progress=Hung([0]), hang_timeout=hang_timeout,
                        on_failure=failures.append)
    go = intruder(KEYS.progress(1))
    watch.start()
    time.sleep(1.0)  # node 0 sees node 1's progress
    started = go()  # the gang hangs as the deletions begin
    try:
        assert watch.wait(hang_timeout + 6), "no verdict while node 1's progress is deleted"
    finally:
        watch.finished.set()
    took = time.monotonic() - started
    [failure] = failures
    assert failure.kind == "tampered" and failure.node == 1, failure.describe()
    text = failure.describe()
    assert "keeps sending its progress, but it stopped reaching node 0" in text
    assert "store is being tampered with" in text and KEYS.progress(1) in text
    assert took < hang_timeout, took
    assert _new_ignored(before).get("progress deleted", 0) >= 1
    print("progress deleted in a loop: failed %.1f s after the deletions began" % took)


def test_a_healthy_node_whose_heartbeat_is_deleted_is_named_tampered_not_dead(gang):
    """Before: node 1 was reported as having died ("stopped sending heartbeats"), and nothing
    counted the deletions."""
    host, intruder, _ = gang
    before = sealed.IGNORED.counts()
    failures = []
    heartbeat_timeout = 2.0
    # hang detection on (the default), so node 1's progress carries its heartbeats' count
    watch = LeaderWatch([], host, TOPO, watch_nodes=[1], heartbeat_timeout=heartbeat_timeout,
                        progress=Hung([0]), hang_timeout=600, on_failure=failures.append)
    go = intruder(KEYS.beat(1))
    watch.start()
    time.sleep(1.0)  # node 0 sees node 1's heartbeats
    started = go()
    try:
        assert watch.wait(heartbeat_timeout + 6)
    finally:
        watch.finished.set()
    took = time.monotonic() - started
    [failure] = failures
    text = failure.describe()
    assert failure.kind == "tampered" and failure.node == 1, text
    assert "keeps sending its heartbeat, but it stopped reaching node 0" in text
    assert "store is being tampered with" in text and KEYS.beat(1) in text
    assert "stopped sending heartbeats" not in text
    assert took < heartbeat_timeout + 2.0, took  # one read a second
    assert _new_ignored(before).get("heartbeat deleted", 0) >= 1
    assert "heartbeat deleted" in ignored_note(_new_ignored(before))  # node 0's note at the end
    print("heartbeat deleted in a loop: failed %.1f s after the deletions began" % took)


# An outsider's flood: `count` keys of `size` bytes, in one multi_set of `batch` keys at a time.
FLOODER = """
import sys
from datetime import timedelta
from torch.distributed import TCPStore
port, count, size, batch = (int(a) for a in sys.argv[1:5])
store = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
value = b"x" * size
for start in range(0, count, batch):
    n = min(batch, count - start)
    store.multi_set(["flood/%d" % i for i in range(start, start + n)], [value] * n)
print("done", flush=True)
"""


def _flooded(host, port, count, size, batch, env):
    """Node 0's watch of a gang of 4 ranks (FloodWatch as the leader makes it, with `env`), while an
    outsider floods the store: (its failures, seconds from the flood's start to the verdict)."""
    failures = []
    rank0 = spawn_member(naming.rank_label(0), [sys.executable, "-S", "-c",
                                                "import time; time.sleep(60)"],
                         {"PATH": os.environ.get("PATH", "")})
    watch = flooder = None
    try:
        watch = LeaderWatch([Slot(rank0, 0, 0, 0)], host, Topology(1, 4),
                            on_failure=failures.append,
                            flood=FloodWatch(host.num_keys, 4, env=env)).start()
        flooder = subprocess.Popen([sys.executable, "-c", FLOODER, str(port), str(count),
                                    str(size), str(batch)], stdout=subprocess.PIPE)
        assert flooder.stdout.readline() == b"done\n"
        flooded_at = time.monotonic()
        assert watch.wait(5), "the flood went unseen"
    finally:
        if watch is not None:
            watch.finished.set()
        if flooder is not None:
            flooder.kill()
            flooder.wait()
        stop_members([rank0], 0.2)
    return failures, time.monotonic() - flooded_at


def test_a_store_flooded_with_keys_fails_the_gang_naming_the_flood():
    """Before: the store took any number of keys, and node 0 said nothing."""
    host, port = hosted_store(GANG, SECRET)
    limit = max_keys(4, {})
    failures, took = _flooded(host, port, limit + 1, 8, 20_000, env={})
    [failure] = failures
    text = failure.describe()
    assert failure.kind == "tampered" and failure.node == 0, text
    # the gang's own two keys (its claim), and the flood's
    assert "the store was flooded: it holds %d keys, more than the %d" % (limit + 3, limit) \
        in text, text
    assert STORE_MAX_KEYS_ENV in text and "MASTER_ADDR:MASTER_PORT" in text
    print("%d keys: failed %.1f s after the flood" % (limit + 1, took))


def test_a_store_flooded_with_large_values_fails_the_gang_before_node_0s_memory_is_at_risk():
    """A few large values (the issue's attacker wrote 8 MiB ones until node 0 grew by 500 MB):
    node 0's growth is counted, here against a limit lowered to 32 MiB."""
    host, port = hosted_store(GANG, SECRET)
    failures, took = _flooded(host, port, 6, 8 << 20, 1, env={STORE_MAX_MB_ENV: "32"})
    [failure] = failures
    text = failure.describe()
    assert failure.kind == "tampered" and failure.node == 0, text
    assert "the store was flooded: node 0's task, which hosts it, grew by" in text, text
    assert "more than the 32 MiB it may (%s)" % STORE_MAX_MB_ENV in text, text
    print("6 x 8 MiB: failed %.1f s after the flood" % took)
