"""The gang's control plane: one torch TCPStore hosted by node 0's task.

Ranks use it as their rendezvous store (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun);
node agents use it to check in, report failures and learn that the gang is aborting.
"""

import errno
import json
import os
import pickle
import socket
import time
from datetime import timedelta

from . import naming
from .errors import TorchDistributedEnvironmentError
from .failures import Failure
from .naming import PUBLIC_GANG_KEY, Keys

# Seconds a joining node waits for its gang's key once the store's public gang key is there
# (node 0 writes its gang's key first: a wait only when someone else wrote the public key).
GANG_KEY_WAIT = 2.0


def bind_listener(host="0.0.0.0", port=0):
    """A listening socket for the store. Port 0 lets the kernel choose a free port, so two gangs
    on one host never race for one; a fixed port that is taken raises OSError(EADDRINUSE)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def port_in_use_error(step_name, port):
    return TorchDistributedEnvironmentError(
        step_name, "port %d on node 0, where the gang's rendezvous store listens, is taken by "
        "another process on this instance. The port is derived from the run, step, task and "
        "attempt: a @retry moves to another one. If instances are shared between jobs, keep "
        "ports %d-%d free for gangs." % ((port,) + naming.REMOTE_PORT_RANGE))


def is_port_in_use(ex):
    """True when binding failed because the port is taken."""
    return isinstance(ex, OSError) and ex.errno == errno.EADDRINUSE


class ControlPlane:
    """The gang's keys in its store, under the gang attempt's secret (naming.Keys): a client
    that reaches the store without the secret cannot read, stop or confuse the gang."""

    def __init__(self, store, gang_id, secret):
        self._store = store
        self._keys = Keys(secret)
        self.gang_id = gang_id

    @classmethod
    def host(cls, listener, gang_id, secret, timeout):
        """Serve the store on `listener` (bound before any member was forked)."""
        from torch.distributed import TCPStore

        store = TCPStore(
            "127.0.0.1",
            listener.getsockname()[1],
            None,
            True,
            timedelta(seconds=timeout),
            wait_for_workers=False,
            # The store adopts (and at the end closes) the fd it is given: give it its own.
            master_listen_fd=os.dup(listener.fileno()),
        )
        control = cls(store, gang_id, secret)
        control.claim()
        return control

    def claim(self):
        """Mark the store as this gang's: under its secret, and in the open for the message of
        a node that reaches another gang's store (GangMismatch)."""
        self._set(self._keys.gang, self.gang_id)
        self._store.set(PUBLIC_GANG_KEY, self.gang_id)

    @classmethod
    def connect(cls, addr, port, gang_id, secret, timeout):
        """Join node 0's store. Raises GangMismatch if the store does not hold this gang's key
        (another gang's store, reached at the same address and port)."""
        from torch.distributed import TCPStore

        store = TCPStore(addr, port, None, False, timedelta(seconds=timeout))
        store.wait([PUBLIC_GANG_KEY])
        control = cls(store, gang_id, secret)
        if not control.holds_gang(GANG_KEY_WAIT):
            raise GangMismatch(store.get(PUBLIC_GANG_KEY).decode(), gang_id)
        return control

    def holds_gang(self, wait):
        """True once the store holds this gang's key under its secret (within `wait` s)."""
        deadline = time.monotonic() + wait
        while not self._store.check([self._keys.gang]):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return self._store.get(self._keys.gang).decode() == self.gang_id

    def _set(self, key, value):
        """TCPStore's set does not wait for the server; the check after it does (requests of one
        connection are served in order), so whoever looks next sees the value."""
        self._store.set(key, value)
        self._store.check([key])

    @classmethod
    def client(cls, addr, port, secret, timeout):
        """A client of node 0's store for a rank's own use (current.torch_distributed): a rank
        runs inside its gang, so the store is up and is its gang's. `timeout` a timedelta."""
        from torch.distributed import TCPStore

        return cls(TCPStore(addr, port, None, False, timeout), None, secret)

    def put_gathered(self, seq, rank, obj):
        """Rank `rank`'s value for the `seq`-th gather (current.torch_distributed.gather)."""
        self._store.set(self._keys.gather(seq, rank), pickle.dumps(obj))

    def take_gathered(self, seq, ranks, timeout, poll_s):
        """Every rank's value of the `seq`-th gather, in rank order, once all are there; the
        keys are deleted. Waits by polling in Python (store.wait would block in C++, and log a
        warning each time a shorter wait ran out), so that the gang's abort, a signal handled
        in Python, stops rank 0 at once instead of after the abort grace."""
        from torch.distributed import DistStoreError

        keys = [self._keys.gather(seq, r) for r in ranks]
        deadline = time.monotonic() + timeout.total_seconds()
        while not self._store.check(keys):
            if time.monotonic() >= deadline:
                raise DistStoreError(
                    "gather: ranks %s did not send their value within %s"
                    % ([r for r, k in zip(ranks, keys) if not self._store.check([k])], timeout))
            time.sleep(poll_s)
        values = [pickle.loads(self._store.get(k)) for k in keys]
        for k in keys:
            self._store.delete_key(k)
        return values

    def join(self, join_id):
        self._set(self._keys.joined(join_id), "1")

    def joined(self, join_id):
        return self._store.check([self._keys.joined(join_id)])

    def finish(self, node):
        self._set(self._keys.done(node), "1")

    def finished(self, node):
        return self._store.check([self._keys.done(node)])

    def report_running(self, node, ranks):
        self._set(self._keys.running(node), json.dumps(list(ranks)))

    def running(self, node):
        """Ranks node `node` said were still running when it reported its failure."""
        if not self._store.check([self._keys.running(node)]):
            return []
        return json.loads(self._store.get(self._keys.running(node)).decode())

    def report_failure(self, node, failure):
        self._set(self._keys.failure(node), failure.to_json())

    def failure(self, node):
        """The failure node `node` reported, or None."""
        if not self._store.check([self._keys.failure(node)]):
            return None
        return Failure.from_json(self._store.get(self._keys.failure(node)).decode())

    def rank_finished(self, rank):
        self._set(self._keys.rank_done(rank), "1")

    def rank_is_done(self, rank):
        return self._store.check([self._keys.rank_done(rank)])

    def beat(self, node):
        """Tell node 0 that node `node` is alive (see LeaderWatch._check_heartbeat)."""
        self._store.add(self._keys.beat(node), 1)

    def beats(self, node):
        """How many heartbeats node `node` has sent."""
        return self._store.add(self._keys.beat(node), 0)

    def ship_log(self, node, target_fd, data):
        """Queue output of node `node` (complete lines, for fd 1 or 2) for node 0's task log."""
        seq = self._store.add(self._keys.log_count(node), 1)
        stream = 1 if target_fd == 1 else 2
        self._store.set(self._keys.log_chunk(node, seq), bytes([stream]) + data)

    def end_log(self, node):
        self._set(self._keys.log_end(node), "1")

    def take_logs(self, node, after):
        """([(target fd, data)], last seq taken) of the chunks node `node` shipped after `after`;
        each chunk is deleted from the store once taken."""
        count = self._store.add(self._keys.log_count(node), 0)
        chunks = []
        for seq in range(after + 1, count + 1):
            key = self._keys.log_chunk(node, seq)
            if not self._store.check([key]):
                break  # counted but not written yet: take it next time
            raw = self._store.get(key)
            self._store.delete_key(key)
            chunks.append((raw[0], raw[1:]))
            after = seq
        return chunks, after

    def log_ended(self, node):
        return self._store.check([self._keys.log_end(node)])

    def publish_checkpoint(self, fields):
        self._set(self._keys.checkpoint, json.dumps(fields))

    def checkpoint(self):
        """What node 0 published with publish_checkpoint (waits for it)."""
        self._store.wait([self._keys.checkpoint])
        return json.loads(self._store.get(self._keys.checkpoint).decode())

    def send_node_events(self, node, record):
        self._set(self._keys.node_events(node), json.dumps(record))

    def node_events(self, node):
        """What node `node` sent of the gang's record, or None."""
        if not self._store.check([self._keys.node_events(node)]):
            return None
        return json.loads(self._store.get(self._keys.node_events(node)).decode())

    def abort(self):
        self._set(self._keys.abort, "1")

    def aborted(self):
        return self._store.check([self._keys.abort])


class GangMismatch(Exception):
    def __init__(self, found, expected):
        super().__init__(
            "the rendezvous store belongs to gang %s, not to this gang (%s): another job uses "
            "the same address and port" % (found, expected)
        )
