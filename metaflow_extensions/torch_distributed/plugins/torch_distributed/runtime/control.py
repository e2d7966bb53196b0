"""The gang's control plane: one torch TCPStore hosted by node 0's task.

Ranks use it as their rendezvous store (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun);
node agents use it to check in, report failures and learn that the gang is aborting. Every
value the package reads from it is sealed under the attempt's secret (sealed.py).
"""

import errno
import json
import os
import pickle
import resource
import secrets
import socket
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from ..core import capacity, naming, sealed
from ..core.errors import TorchDistributedEnvironmentError
from ..core.failures import Failure
from ..core.gangspec import Attempt
from ..core.naming import PUBLIC_GANG_KEY, Keys
from ..core.supported import LIBUV_LISTEN_FD, parse_version
from ..core.topology import Topology
from ..runtime.stacks import Report

if TYPE_CHECKING:  # torch is imported where a store is made, not with this module
    from torch.distributed import Store

# Seconds a joining node waits for its gang's key once the store's public gang key is there
# (node 0 writes its gang's key first: a wait only when someone else wrote the public key).
GANG_KEY_WAIT = 2.0

# Node 0's words on what follows a round, for the other nodes (restarts in place).
ROUND_RESTART = "restart"
ROUND_END = "end"

# A read of a key is a compare-and-set with this as both the expected and the new value: the
# store answers with the key's value, or with this when the key is not there, and changes
# nothing. One request, where TCPStore's check then get takes three (get waits for the key
# first), and it never waits: a key deleted meanwhile reads as absent. No sealed value is this.
_PROBE = b"\x00mftd-read"

# Keys whose value only says "look again" (naming.Keys.nodes_news, leader_news): after a
# sealed message the other side polls for, its sender writes a fresh token there, so that the
# other side reads one key a poll instead of every node's. Never sealed, and nothing is decided
# on them: a forged token costs a look, a reverted one delays the news until the watch's next
# full look (supervisor.py).
NODES_NEWS = naming.Keys().nodes_news
LEADER_NEWS = naming.Keys().leader_news


def read_now(store: "Store", key: str) -> Optional[bytes]:
    """The value under `key`, or None when it is absent, in one request that never waits: a
    compare-and-set that changes nothing (it answers with the value; over an absent key it
    answers with the expected value, _PROBE, which no sealed value is, and sets nothing)."""
    # torch's stub says str; the store takes and answers bytes
    value = store.compare_set(key, _PROBE, _PROBE)  # type: ignore[arg-type]
    return None if value == _PROBE else bytes(value)


def ensure_file_limit(step_name: str, topology: Topology) -> Optional[int]:
    """(Node 0, before its store listens.) Raise this process's soft limit of open files to
    what the gang's connections need (capacity.files_needed), within the hard limit; the new
    soft limit (None: it was enough). A hard limit too low for the gang is an error naming
    both numbers and the fix, before any rank starts: a refused connection later would fail a
    rank deep inside torch's rendezvous."""
    needed = capacity.files_needed(topology)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        raised = capacity.soft_limit_for(needed, soft, hard)
    except ValueError:
        raise TorchDistributedEnvironmentError(
            step_name, "a gang of %s needs up to %d open files on node 0 (a connection to its "
            "rendezvous store for every rank and node agent), but this process may open at most "
            "%d (its hard RLIMIT_NOFILE). Raise the limit where node 0 runs (ulimit -Hn; a "
            "container's nofile ulimit, e.g. AWS Batch's job definition ulimits or the "
            "container runtime's default), or use fewer ranks."
            % (topology.describe(), needed, hard)) from None
    if raised is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    return raised


def bind_listener(host: str, port: int = 0) -> socket.socket:
    """A listening socket for the store on the address `host` only (the one its peers reach:
    the loopback address when every node is on this host). Port 0 lets the kernel choose a
    free port, so two gangs on one host never race for one; a fixed port that is taken raises
    OSError(EADDRINUSE)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def loopback_interface() -> Optional[str]:
    """The name of this host's loopback interface ("lo" on Linux, "lo0" on macOS), or None."""
    names = {name for _, name in socket.if_nameindex()}
    return next((n for n in ("lo", "lo0") if n in names), None)


def interface_toward(address: str) -> Optional[str]:
    """The name of this host's network interface whose IPv4 address is the one its packets to
    `address` leave from (the kernel's route, asked with a UDP connect that sends nothing), or
    None where it cannot be told (IPv6, no route, not Linux)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))
            local = probe.getsockname()[0]
    except OSError:
        return None
    return next((name for _, name in socket.if_nameindex() if _ipv4_of(name) == local), None)


def _ipv4_of(name: str) -> Optional[str]:
    import fcntl
    import struct

    SIOCGIFADDR = 0x8915  # Linux
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def port_in_use_error(step_name: str, port: int) -> TorchDistributedEnvironmentError:
    return TorchDistributedEnvironmentError(
        step_name, "port %d on node 0, where the gang's rendezvous store listens, is taken by "
        "another process on this instance. The port is derived from the run, step, task and "
        "attempt: a @retry moves to another one. If instances are shared between jobs, keep "
        "ports %d-%d free for gangs." % ((port,) + naming.REMOTE_PORT_RANGE))


def bind_error(step_name: str, address: str, ex: OSError) -> TorchDistributedEnvironmentError:
    return TorchDistributedEnvironmentError(
        step_name, "node 0 cannot listen for the gang's rendezvous store on %s, the address "
        "its other nodes are given (MASTER_ADDR): %s. The address must be one of this "
        "machine's own." % (address, ex))


def is_port_in_use(ex: BaseException) -> bool:
    """True when binding failed because the port is taken."""
    return isinstance(ex, OSError) and ex.errno == errno.EADDRINUSE


class ControlPlane:
    """The gang's messages in its store. Key names are public; every value the package reads
    is sealed under the gang attempt's secret, bound to its key and to the attempt
    (sealed.py), and one that does not open is ignored as if it were not there, and counted
    (sealed.IGNORED): a client that reaches the store without the secret can neither stop,
    join, fail, finish nor feed the gang, and nothing it wrote is ever unpickled. It can
    still delete or overwrite values, delaying the gang until a timeout names what is missing
    (docs/security.md)."""

    def __init__(self, store: "Store", gang_id: str, secret: str, round_: int = 0,
                 beats_sent: int = 0) -> None:
        self._store = store
        self._keys = Keys(round_)
        self.gang_id = gang_id
        self._secret = secret
        self._beats_sent = beats_sent  # heartbeats count on across rounds (beat)
        self._logs_shipped = 0
        self._beats_seen: Dict[int, int] = {}  # node -> the last heartbeat count that opened
        self._progress_sent = 0
        # node -> (number, reports) of its latest progress
        self._progress_seen: Dict[int, Tuple[int, Dict[int, Report]]] = {}
        # what each node's latest heartbeat and progress say the other one's count is (sent)
        self._progress_claimed: Dict[int, int] = {}
        self._beats_claimed: Dict[int, int] = {}
        # key -> the last value of it that opened: a key that never goes away (a heartbeat,
        # progress) read absent after it was there was deleted by someone outside the gang
        self._last_opened: Dict[str, bytes] = {}
        self.deleted: Set[str] = set()  # such keys, absent at their last read (tampered)

    def forget_rendezvous(self) -> None:
        """Delete every key of the store that is not the package's: what torch's process
        groups of a stopped round wrote (their peers' addresses, barriers' counters). Each
        round's ranks keep torch's keys under a prefix of the round (rendezvous_seal.py), so
        nothing of a stopped round is read by the next; this frees the store of them. A torch
        whose store cannot list its keys (2.9.1 cannot) keeps them: a few kB a round."""
        list_keys = getattr(self._store, "list_keys", None)
        if list_keys is None:
            return
        for key in list_keys():
            if not key.startswith(naming.KEY_PREFIX):
                self._store.delete_key(key)

    def num_keys(self) -> int:
        """How many keys the store holds (every round's, torch's and the package's)."""
        return int(self._store.num_keys())

    @property
    def round(self) -> int:
        """The gang's round this client speaks for (0 until a restart in place)."""
        return self._keys.round

    def for_round(self, round_: int) -> "ControlPlane":
        """The same store and client, speaking for the gang's round `round_` (Keys)."""
        return ControlPlane(self._store, self.gang_id, self._secret, round_, self._beats_sent)

    @classmethod
    def host(cls, listener: socket.socket, gang_id: str, secret: str,
             timeout: float) -> "ControlPlane":
        """Serve the store on `listener` (bound before any member was forked)."""
        import torch
        from torch.distributed import TCPStore

        # torch before 2.8 refuses a listening socket in its libuv store (NotImplementedError):
        # its legacy store takes one, speaks the same protocol, and is what it used before 2.4.
        legacy = parse_version(torch.__version__) < LIBUV_LISTEN_FD
        store = TCPStore(
            listener.getsockname()[0],
            listener.getsockname()[1],
            None,
            True,
            timedelta(seconds=timeout),
            wait_for_workers=False,
            # The store adopts (and at the end closes) the fd it is given: give it its own.
            master_listen_fd=os.dup(listener.fileno()),
            **({"use_libuv": False} if legacy else {}),
        )
        control = cls(store, gang_id, secret)
        control.claim()
        return control

    def claim(self) -> None:
        """Mark the store as this gang's: sealed, and in the open for the message of a node
        that reaches another gang's store (GangMismatch)."""
        self._set(self._keys.gang, self.gang_id.encode())
        self._store.set(PUBLIC_GANG_KEY, self.gang_id)

    @classmethod
    def connect(cls, addr: str, port: int, gang_id: str, secret: str,
                timeout: float) -> "ControlPlane":
        """Join node 0's store. Raises GangMismatch if the store does not hold this gang's
        sealed claim (another gang's store, reached at the same address and port)."""
        from torch.distributed import TCPStore

        store = TCPStore(addr, port, None, False, timedelta(seconds=timeout))
        store.wait([PUBLIC_GANG_KEY])
        control = cls(store, gang_id, secret)
        if not control.holds_gang(GANG_KEY_WAIT):
            raise GangMismatch(store.get(PUBLIC_GANG_KEY).decode(errors="replace"), gang_id)
        return control

    @classmethod
    def of_attempt(cls, attempt: Attempt, timeout: float) -> "ControlPlane":
        """Join the store of the gang attempt `attempt` (gangspec.Attempt): connect()."""
        return cls.connect(attempt.master_addr, attempt.master_port, attempt.gang_id,
                           attempt.secret, timeout)

    def holds_gang(self, wait: float) -> bool:
        """True once the store holds this gang's claim, sealed under its secret (within
        `wait` s)."""
        deadline = time.monotonic() + wait
        while self._read(self._keys.gang, "claim") != self.gang_id.encode():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    @classmethod
    def client(cls, addr: str, port: int, gang_id: str, secret: str, timeout: timedelta,
               round_: int = 0) -> "ControlPlane":
        """A client of node 0's store for a rank's own use (current.torch_distributed): a rank
        runs inside its gang, so the store is up and is its gang's. `timeout` a timedelta;
        `round_` the gang's round the rank belongs to."""
        from torch.distributed import TCPStore

        return cls(TCPStore(addr, port, None, False, timeout), gang_id, secret, round_)

    # -- sealing: the one place values are written and read -------------------------------------

    def _put(self, key: str, payload: bytes) -> None:
        # torch's stub says str; the store takes bytes as well (and keeps them as they are)
        self._store.set(key, sealed.seal(  # type: ignore[arg-type]
            self._secret, self.gang_id, key, payload))

    def _set(self, key: str, payload: bytes) -> None:
        """_put, then wait for the server: TCPStore's set does not wait, the check after it
        does (requests of one connection are served in order), so whoever looks next sees the
        value."""
        self._put(key, payload)
        self._store.check([key])

    def _read(self, key: str, kind: str) -> Optional[bytes]:
        """The payload under `key` if it is there and opens under this attempt's secret; None
        otherwise (a value that does not open is counted in sealed.IGNORED as `kind`)."""
        value = self._probe(key)
        return None if value is None else self._open(key, value, kind)

    def _read_kept(self, key: str, kind: str) -> Optional[bytes]:
        """_read, for a key that a member writes again and again and nobody deletes (a
        heartbeat, progress): read absent after a value of it opened, it was deleted from
        outside the gang, which is counted in sealed.IGNORED as `kind` "deleted" (once for each
        value deleted) and kept in `deleted`."""
        value = self._probe(key)
        if value is None:
            last = self._last_opened.get(key)
            if last is not None:
                sealed.IGNORED.note(kind + " deleted", key, last)
                self.deleted.add(key)
            return None
        payload = self._open(key, value, kind)
        if payload is not None:
            self._last_opened[key] = value
            self.deleted.discard(key)
        return payload

    def _probe(self, key: str) -> Optional[bytes]:
        return read_now(self._store, key)

    def _open(self, key: str, value: bytes, kind: str) -> Optional[bytes]:
        payload = sealed.unseal(self._secret, self.gang_id, key, value)
        if payload is None:
            sealed.IGNORED.note(kind, key, value)
        return payload

    def _flag(self, key: str, kind: str) -> bool:
        return self._read(key, kind) == b"1"

    def _json(self, key: str, kind: str) -> Any:
        payload = self._read(key, kind)
        return None if payload is None else json.loads(payload.decode())

    def _tell(self, news_key: str) -> None:
        """Say that there is news (a fresh token under `news_key`, waited for as _set does):
        after the message, so that whoever sees the token finds the message."""
        self._store.set(news_key, secrets.token_hex(8))
        self._store.check([news_key])

    def _news(self, news_key: str) -> bytes:
        return self._probe(news_key) or b""

    def nodes_news(self) -> bytes:
        """The token the other nodes last wrote under NODES_NEWS (b"": none yet): it changes
        after each check-in, finish, failure report, ranks still running and preemption."""
        return self._news(NODES_NEWS)

    def leader_news(self) -> bytes:
        """The token node 0 last wrote under LEADER_NEWS (b"": none yet): it changes after
        the gang's abort and preemption."""
        return self._news(LEADER_NEWS)

    # -- the gang's messages ----------------------------------------------------------------------

    def put_gathered(self, seq: int, rank: int, obj: object) -> None:
        """Rank `rank`'s value for the `seq`-th gather (current.torch_distributed.gather)."""
        self._put(self._keys.gather(seq, rank), pickle.dumps(obj))

    def take_gathered(self, seq: int, ranks: Iterable[int], timeout: timedelta,
                      poll_s: float) -> List[Any]:
        """Every rank's value of the `seq`-th gather, in rank order, once all are there and
        open; the keys are deleted. A value is unpickled only after its seal opened. Waits by
        polling in Python (store.wait would block in C++, and log a warning each time a shorter
        wait ran out), so that the gang's abort, a signal handled in Python, stops rank 0 at
        once instead of after the abort grace."""
        from torch.distributed import DistStoreError

        keys = {r: self._keys.gather(seq, r) for r in ranks}
        payloads: Dict[int, bytes] = {}
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            for r, key in keys.items():
                if r not in payloads:
                    payload = self._read(key, "gather")
                    if payload is not None:
                        payloads[r] = payload
            if len(payloads) == len(keys):
                break
            if time.monotonic() >= deadline:
                raise DistStoreError(
                    "gather: ranks %s did not send their value within %s"
                    % ([r for r in keys if r not in payloads], timeout))
            time.sleep(poll_s)
        for key in keys.values():
            self._store.delete_key(key)
        return [pickle.loads(payloads[r]) for r in keys]

    def join(self, join_id: str) -> None:
        self._set(self._keys.joined(join_id), b"1")
        self._tell(NODES_NEWS)

    def joined(self, join_id: str) -> bool:
        return self._flag(self._keys.joined(join_id), "joined")

    def finish(self, node: int) -> None:
        self._set(self._keys.done(node), b"1")
        self._tell(NODES_NEWS)

    def finished(self, node: int) -> bool:
        return self._flag(self._keys.done(node), "done")

    def report_running(self, node: int, ranks: Iterable[int]) -> None:
        self._set(self._keys.running(node), json.dumps(list(ranks)).encode())
        self._tell(NODES_NEWS)

    def running(self, node: int) -> List[int]:
        """Ranks node `node` said were still running when it reported its failure."""
        return self._json(self._keys.running(node), "running") or []

    def report_failure(self, node: int, failure: Failure) -> None:
        self._set(self._keys.failure(node), failure.to_json().encode())
        self._tell(NODES_NEWS)

    def failure(self, node: int) -> Optional[Failure]:
        """The failure node `node` reported, or None."""
        payload = self._read(self._keys.failure(node), "failure")
        return None if payload is None else Failure.from_json(payload.decode())

    def report_own_failures(self, node: int, failures: Iterable[Failure]) -> None:
        """What node `node`'s ranks failed of on their own, once its agent stopped them (it
        may report none of them as its failure: node 0 aborted the gang first)."""
        self._set(self._keys.own_failures(node),
                  json.dumps([f.to_dict() for f in failures]).encode())

    def own_failures(self, node: int) -> List[Failure]:
        """The failures node `node` reported with report_own_failures; [] before it did."""
        found = self._json(self._keys.own_failures(node), "own failures") or []
        return [Failure(**f) for f in found]

    def rank_finished(self, rank: int) -> None:
        self._set(self._keys.rank_done(rank), b"1")

    def rank_is_done(self, rank: int) -> bool:
        return self._flag(self._keys.rank_done(rank), "rank done")

    # A node's heartbeat and its progress each carry the count of the other that its agent
    # sent (both are sent by the agent's one client, each waited for by the store before the
    # next message): every value node 0 reads of one says how many of the other were in the
    # store by then. So node 0, which reads a node's heartbeat and progress in turn, always
    # finds at least the count the other one claimed, unless someone outside the gang deleted
    # it or put an older one back. A count that stays behind its claim is tampering, not a
    # node that died or hangs (LeaderWatch's Overdue); a key read absent after it was there is
    # a deletion (_read_kept). Both keep the seal's guarantees: a claim is read only from a
    # value that opened.

    def beat(self, node: int) -> None:
        """Tell node 0 that node `node` is alive (see LeaderWatch._check_heartbeat): the count
        of beats this client sent, so that a value replayed from earlier does not look new,
        and the count of progress it sent. Waited for, as every message but a log chunk and a
        gathered value: a read from another connection right after it sees it."""
        self._beats_sent += 1
        self._set(self._keys.beat(node),
                  ("%d %d" % (self._beats_sent, self._progress_sent)).encode())

    def beats(self, node: int) -> int:
        """How many heartbeats node `node` has sent (the highest count that opened)."""
        payload = self._read_kept(self._keys.beat(node), "heartbeat")
        count, *claim = [int(n) for n in payload.decode().split()] if payload else [0]
        if claim:
            self._progress_claimed[node] = max(claim[0], self._progress_claimed.get(node, 0))
        self._beats_seen[node] = max(count, self._beats_seen.get(node, 0))
        return self._beats_seen[node]

    def beats_claimed(self, node: int) -> int:
        """How many heartbeats node `node`'s latest progress read said it had sent."""
        return self._beats_claimed.get(node, 0)

    def send_progress(self, node: int, reports: Mapping[int, Report]) -> None:
        """Where node `node`'s ranks stand ({rank: stacks report}), numbered by this client so
        that a value replayed from earlier is not taken for news (see progress), with the count
        of heartbeats it sent."""
        self._progress_sent += 1
        self._set(self._keys.progress(node), json.dumps(
            {"n": self._progress_sent, "b": self._beats_sent, "ranks": reports}).encode())

    def progress(self, node: int) -> Dict[int, Report]:
        """{rank: report} node `node` last sent, or {}: the latest by its number."""
        payload = self._read_kept(self._keys.progress(node), "progress")
        value = None if payload is None else json.loads(payload.decode())
        if value is not None and value.get("n", 0) > self.progress_number(node):
            self._progress_seen[node] = (value["n"], {int(r): rep
                                                       for r, rep in value["ranks"].items()})
            self._beats_claimed[node] = max(value.get("b", 0), self.beats_claimed(node))
        return self._progress_seen.get(node, (0, {}))[1]

    def progress_number(self, node: int) -> int:
        """The number of node `node`'s latest progress read (0: none yet)."""
        return self._progress_seen.get(node, (0, {}))[0]

    def progress_claimed(self, node: int) -> int:
        """How many progress messages node `node`'s latest heartbeat said it had sent."""
        return self._progress_claimed.get(node, 0)

    def key_of(self, message: str, node: int) -> str:
        """The key of node `node`'s `message` ("heartbeat" or "progress") this round."""
        return self._keys.beat(node) if message == "heartbeat" else self._keys.progress(node)

    def ship_log(self, node: int, target_fd: int, data: bytes) -> None:
        """Queue output of node `node` (complete lines, for fd 1 or 2) for node 0's task log.
        One client ships a node's output (remote_logs.LogShipper): it numbers the chunks."""
        self._logs_shipped += 1
        stream = 1 if target_fd == 1 else 2
        self._put(self._keys.log_chunk(node, self._logs_shipped), bytes([stream]) + data)

    def end_log(self, node: int) -> None:
        self._set(self._keys.log_end(node), b"1")

    def take_logs(self, node: int, after: int) -> Tuple[List[Tuple[int, bytes]], int]:
        """([(target fd, data)], last seq taken) of the chunks node `node` shipped after `after`,
        in order; each chunk is deleted from the store once taken. A chunk that does not open
        is left where it is (the node's own chunk of that number overwrites it) and stops the
        take there, so no line is taken out of order."""
        chunks: List[Tuple[int, bytes]] = []
        while True:
            key = self._keys.log_chunk(node, after + 1)
            payload = self._read(key, "log")
            if not payload:
                return chunks, after
            self._store.delete_key(key)
            chunks.append((payload[0], payload[1:]))
            after += 1

    def log_ended(self, node: int) -> bool:
        return self._flag(self._keys.log_end(node), "log end")

    def publish_checkpoint(self, fields: Optional[Mapping[str, Any]]) -> None:
        self._set(self._keys.checkpoint, json.dumps(fields).encode())

    def checkpoint(self, timeout_s: float) -> Optional[Dict[str, Any]]:
        """What node 0 published with publish_checkpoint (waits up to `timeout_s` for it;
        None if nothing that opens came by then)."""
        deadline = time.monotonic() + timeout_s
        while True:
            payload = self._read(self._keys.checkpoint, "checkpoint")
            if payload is not None:
                return json.loads(payload.decode())
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def report_facts(self, node: int, facts: Mapping[str, Any]) -> None:
        """What node `node` runs with (nodefacts.NodeFacts.to_dict), for the nodes that
        compare theirs with it."""
        self._set(self._keys.facts(node), json.dumps(facts).encode())

    def facts(self, node: int, timeout_s: float) -> Optional[Dict[str, Any]]:
        """What node `node` reported with report_facts (waits up to `timeout_s` for it; None
        if nothing that opens came by then)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._json(self._keys.facts(node), "facts")
            if found is not None or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)

    def report_checked(self, node: int) -> None:
        """Node `node`'s facts matched node 0's (nodefacts.py)."""
        self._set(self._keys.checked(node), b"1")
        self._tell(NODES_NEWS)

    def checked(self, node: int) -> bool:
        return self._flag(self._keys.checked(node), "checked")

    def send_node_events(self, node: int, record: Mapping[str, Any]) -> None:
        self._set(self._keys.node_events(node), json.dumps(record).encode())

    def node_events(self, node: int) -> Optional[Dict[str, Any]]:
        """What node `node` sent of the gang's record, or None."""
        return self._json(self._keys.node_events(node), "node record")

    def abort(self) -> None:
        self._set(self._keys.abort, b"1")
        self._tell(LEADER_NEWS)

    def preempt_gang(self) -> None:
        self._set(self._keys.preempt, b"1")
        self._tell(LEADER_NEWS)

    def gang_preempted(self) -> bool:
        return self._flag(self._keys.preempt, "preempt")

    def request_stacks(self, count: int) -> None:
        """Ask every node for its ranks' stacks, the `count`-th time (stacks.py)."""
        self._set(self._keys.stacks, str(count).encode())

    def stacks_requested(self) -> int:
        """How many times node 0 asked for stacks so far (0: never, or nothing that opens)."""
        payload = self._read(self._keys.stacks, "stacks")
        return int(payload.decode()) if payload is not None else 0

    def report_preempted(self, node: int) -> None:
        self._set(self._keys.preempted(node), b"1")
        self._tell(NODES_NEWS)

    def node_preempted(self, node: int) -> bool:
        return self._flag(self._keys.preempted(node), "preempted")

    def aborted(self) -> bool:
        return self._flag(self._keys.abort, "abort")

    def report_stopped(self, node: int) -> None:
        self._set(self._keys.stopped(node), b"1")

    def node_stopped(self, node: int) -> bool:
        return self._flag(self._keys.stopped(node), "stopped")

    def say_word(self, word: str) -> None:
        """Node 0's word on what follows this round: ROUND_RESTART or ROUND_END."""
        self._set(self._keys.word, word.encode())

    def word(self) -> Optional[str]:
        """Node 0's word on what follows this round, or None while it has said none."""
        payload = self._read(self._keys.word, "word")
        return None if payload is None else payload.decode()


class GangMismatch(Exception):
    """The store reached holds no claim of this gang sealed under its secret. `found` is the
    store's public gang key, which anyone may have written: it is shown escaped and cut."""

    def __init__(self, found: str, expected: str) -> None:
        super().__init__(
            "the rendezvous store belongs to gang %s, not to this gang (%s): another job uses "
            "the same address and port, or a process outside the gang deleted this gang's "
            "claim from the store (its public gang key is not sealed, and reads as written)"
            % (sealed.shown(found), expected)
        )
