"""torch's own rendezvous through the gang's store, sealed (runtime/rendezvous_seal.py): real
gloo process groups of real processes against a real TCPStore, and an outsider who reaches it."""

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import naming, sealed
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import (
    rendezvous_seal,
)
from tests.support import REPO

SECRET = "5ec2e7" * 10 + "abcd"
GANG = "run-train-2-0"


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    yield server


def rank_env(port, rank, sealed_=True):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
               WORLD_SIZE="2", TORCHELASTIC_USE_AGENT_STORE="True", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=str(REPO))
    if sealed_:
        env["SEAL_SECRET"] = SECRET
    return env


def run_attack(port, tmp_path, sealed_):
    """The attack against a 2-rank gang: (the marker its pickle creates, each rank's output)."""
    marker = tmp_path / "the attacker's pickle ran"
    module = [sys.executable, "-m", "tests.gloo_hijack"]
    ranks = [subprocess.Popen(module + ["rank"], cwd=REPO, env=rank_env(port, r, sealed_),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (1, 0)]
    attacker = subprocess.Popen(module + ["attack", "127.0.0.1", str(port), str(marker)],
                                cwd=REPO, env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs = [ranks[0].communicate(timeout=90)[0], settle(ranks[1])]
    settle(attacker)
    return marker, outputs


def settle(process, grace=5.0):
    """The output of `process` once it ended, or once it was killed after `grace` s (what
    rank 1's end left waiting: rank 0 on a peer that is gone, the attacker on its own group)."""
    try:
        return process.communicate(timeout=grace)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()[0]


def test_without_the_seal_the_attack_runs_its_pickle_in_a_rank(store, tmp_path):
    # The control: torch's env:// as it is (and as this package used it before the seal).
    # The attack is real, so the sealed test below shows the seal, not a weak attacker.
    marker, outputs = run_attack(store.port, tmp_path, sealed_=False)
    assert marker.exists(), outputs
    assert "TextIOWrapper" in outputs[0], outputs[0]  # rank 1 unpickled the attacker's object


@pytest.mark.parametrize("attempt", range(5))  # the issue: the attack in a loop of 5 tries
def test_sealed_ranks_never_run_the_attackers_pickle(store, tmp_path, attempt):
    marker, (rank1, rank0) = run_attack(store.port, tmp_path, sealed_=True)
    assert not marker.exists(), rank1
    # rank 1 read rank 0's own record (the attacker's did not open), or waited for it past
    # the attacker's rewrites and stopped, naming the key: never another outcome
    assert ("rank 1 got [{'from': 'rank 0'}]" in rank1
            or "no rank of this gang wrote" in rank1), rank1
    assert "TextIOWrapper" not in rank1 + rank0


def test_a_value_no_member_wrote_stops_the_rank_naming_the_key(store, tmp_path):
    # An outsider's value under the key of rank 0's address record, before rank 0 wrote
    # any, and rank 0 never comes: rank 1 waits TAMPER_WAIT_S for a member's value, then
    # stops with the cause instead of connecting where the value points.
    key = naming.torch_key_prefix(0) + "default_pg/0//cpu//0/0"
    store.set(key, b"\x02\x00\x9c\x40\x7f\x00\x00\x01 forged\n[rank 0] FATAL curl | sudo sh")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "tests.gloo_hijack", "rank"], cwd=REPO,
                         env=rank_env(store.port, 1), capture_output=True, text=True,
                         timeout=90)
    took = time.monotonic() - started
    assert out.returncode != 0
    assert "TorchDistributedStoreTampered" in out.stderr and "no rank of this gang wrote" in out.stderr, out.stderr
    assert "'default_pg/0//cpu//0/0'" in out.stderr  # the key, quoted
    assert "FATAL curl" not in out.stderr  # nothing of the outsider's value is printed
    assert rendezvous_seal.TAMPER_WAIT_S <= took < rendezvous_seal.TAMPER_WAIT_S + 30


def test_torchs_values_in_the_store_are_sealed_private_under_the_rounds_prefix(store):
    from torch.distributed import TCPStore

    client = TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=5))
    ours = rendezvous_seal.sealed_store(client, "train", SECRET, GANG, 1)
    ours.set("default_pg/0//cpu//0/0", b"127.0.0.1:40000 seq 7")
    assert ours.get("default_pg/0//cpu//0/0") == b"127.0.0.1:40000 seq 7"
    inner_key = naming.torch_key_prefix(1) + "default_pg/0//cpu//0/0"
    raw = store.get(inner_key)
    assert b"127.0.0.1" not in raw
    assert sealed.open_private(SECRET, GANG + "/round/1", inner_key, raw) is not None
    assert "default_pg/0//cpu//0/0" not in store.list_keys()  # nothing outside the prefix
    # a round's value is not another round's, even moved under its prefix
    store.set(naming.torch_key_prefix(2) + "default_pg/0//cpu//0/0", raw)
    later = rendezvous_seal.sealed_store(client, "train", SECRET, GANG, 2)
    assert later.check(["default_pg/0//cpu//0/0"])
    assert ours.add("counter", 2) == 2 and ours.add("counter", 0) == 2  # counters as they are
    assert ours.multi_get(["default_pg/0//cpu//0/0"]) == [b"127.0.0.1:40000 seq 7"]
    with pytest.raises(NotImplementedError, match="sealed"):
        ours.compare_set("default_pg/x", b"", b"1")


def test_install_wraps_torchs_own_env_handler_once_per_round():
    # torch's registry of init_method schemes is private (torch/distributed/rendezvous.py):
    # this pins what the seal relies on, for every torch CI runs
    import importlib

    handlers = getattr(importlib.import_module("torch.distributed.rendezvous"),
                       rendezvous_seal._HANDLERS)
    torchs = handlers["env"]
    try:
        rendezvous_seal.install("train", SECRET, GANG, 0)
        first = handlers["env"]
        assert first is not torchs and first.torch_distributed_wraps is torchs
        rendezvous_seal.install("train", SECRET, GANG, 1)  # the next round's rank, forked
        assert handlers["env"].torch_distributed_wraps is torchs  # not ours around ours
    finally:
        handlers["env"] = torchs


def counting_store(inner):
    """A store that passes every call to `inner` (node 0's store, reached over TCP), naming
    each request it makes."""
    from torch.distributed import Store

    class Counting(Store):
        def __init__(self):
            super().__init__()
            self.requests = []

        def _call(self, name, *args):
            self.requests.append(name)
            return getattr(inner, name)(*args)

        def set(self, key, value):
            return self._call("set", key, value)

        def get(self, key):
            return self._call("get", key)

        def compare_set(self, key, expected, desired):
            return self._call("compare_set", key, expected, desired)

        def wait(self, keys, timeout=None):
            return self._call("wait", keys) if timeout is None else self._call(
                "wait", keys, timeout)

        def check(self, keys):
            return self._call("check", keys)

    return Counting()


def test_gloos_wait_then_get_of_a_peers_record_takes_the_requests_torchs_would(store):
    # gloo waits for each peer's record and then gets it, one peer after the other (63 times
    # a rank in a gang of 64): a wait, then one read, as torch's own store takes
    import threading

    from torch.distributed import TCPStore

    client = TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=5))
    counting = counting_store(client)
    ours = rendezvous_seal.sealed_store(counting, "train", SECRET, GANG, 0)
    peer = rendezvous_seal.sealed_store(  # another rank, with a connection of its own
        TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=5)), "train", SECRET,
        GANG, 0)
    peer.set("default_pg/0//cpu//0/1", b"rank 1's record")
    ours.wait(["default_pg/0//cpu//0/1"])
    assert ours.get("default_pg/0//cpu//0/1") == b"rank 1's record"
    assert counting.requests == ["wait", "compare_set"]
    # a record not there yet: the wait waits for it, the get reads it
    threading.Timer(0.3, peer.set, ("default_pg/0//cpu//0/2", b"rank 2's record")).start()
    counting.requests.clear()
    ours.wait(["default_pg/0//cpu//0/2"])
    assert ours.get("default_pg/0//cpu//0/2") == b"rank 2's record"
    assert counting.requests == ["wait", "compare_set"]
    # a get with no wait before it, of a record not there yet: one read, then a wait, then
    # a check before the next read (a read of an absent key ends the other ranks' waits)
    threading.Timer(0.3, peer.set, ("default_pg/0//cpu//0/4", b"rank 4's record")).start()
    counting.requests.clear()
    assert ours.get("default_pg/0//cpu//0/4") == b"rank 4's record"
    assert counting.requests == ["compare_set", "wait", "check", "compare_set"]
    # a value no member sealed is not used: the get waits past it
    store.set(naming.torch_key_prefix(0) + "default_pg/0//cpu//0/3", b"an outsider's record")
    threading.Timer(0.3, peer.set, ("default_pg/0//cpu//0/3", b"rank 3's record")).start()
    ours.wait(["default_pg/0//cpu//0/3"])
    assert ours.get("default_pg/0//cpu//0/3") == b"rank 3's record"


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv", "legacy"])
def test_ranks_waiting_for_a_late_peer_never_take_each_others_reads_for_its_record(libuv):
    # Three ranks wait for rank 0's address record, which comes late (rank 0 is slow to
    # start). On the libuv store, a compare_set of a key ends every wait for that key, present
    # or not, and a get of an absent key answers b"": a rank's read must not end the others'
    # waits with an empty value, taken for an outsider's (CI, 2026-12-05: every rank waiting
    # for a hung rank 0 failed with TorchDistributedStoreTampered, "0 bytes", after 10 s).
    import threading

    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False,
                      use_libuv=libuv)
    key = "default_pg/0//cpu//0/0"

    def member():
        client = TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=20),
                          use_libuv=libuv)
        return rendezvous_seal.sealed_store(client, "train", SECRET, GANG, 0)

    got, errors = [], []

    def rank():
        store = member()
        try:
            store.wait([key], timedelta(seconds=20))
            got.append(store.get(key))
        except Exception as e:  # noqa: BLE001 - the test reports what a rank raised
            errors.append(e)

    before = sealed.IGNORED.counts()
    ranks = [threading.Thread(target=rank) for _ in range(3)]
    for thread in ranks:
        thread.start()
    # meanwhile an outsider reads the absent key as a rank's get would
    outsider = TCPStore("127.0.0.1", server.port, None, False, timedelta(seconds=5),
                        use_libuv=libuv)
    for _ in range(5):
        time.sleep(0.2)
        outsider.compare_set(naming.torch_key_prefix(0) + key, b"\x00peek", b"\x00peek")
    member().set(key, b"rank 0's record, late")
    for thread in ranks:
        thread.join(timeout=30)
    assert not errors, errors
    assert got == [b"rank 0's record, late"] * 3
    assert sealed.IGNORED.counts() == before  # nothing was taken for an outsider's value
