"""The gang's control plane: one torch TCPStore hosted by node 0's task.

Ranks use it as their rendezvous store (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun);
node agents use it to check in, report failures and learn that the gang is aborting.
"""

import json
import os
import socket
from datetime import timedelta

from .failures import Failure
from .naming import Keys


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


class ControlPlane:
    def __init__(self, store, gang_id):
        self._store = store
        self.gang_id = gang_id

    @classmethod
    def host(cls, listener, gang_id, timeout):
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
        store.set(Keys.gang, gang_id)
        return cls(store, gang_id)

    @classmethod
    def connect(cls, addr, port, gang_id, timeout):
        """Join node 0's store. Raises GangMismatch if the store belongs to another gang."""
        from torch.distributed import TCPStore

        store = TCPStore(addr, port, None, False, timedelta(seconds=timeout))
        store.wait([Keys.gang])
        found = store.get(Keys.gang).decode()
        if found != gang_id:
            raise GangMismatch(found, gang_id)
        return cls(store, gang_id)

    def _set(self, key, value):
        """TCPStore's set does not wait for the server; the check after it does (requests of one
        connection are served in order), so whoever looks next sees the value."""
        self._store.set(key, value)
        self._store.check([key])

    def join(self, join_id):
        self._set(Keys.joined(join_id), "1")

    def joined(self, join_id):
        return self._store.check([Keys.joined(join_id)])

    def finish(self, node):
        self._set(Keys.done(node), "1")

    def finished(self, node):
        return self._store.check([Keys.done(node)])

    def report_running(self, node, ranks):
        self._set(Keys.running(node), json.dumps(list(ranks)))

    def running(self, node):
        """Ranks node `node` said were still running when it reported its failure."""
        if not self._store.check([Keys.running(node)]):
            return []
        return json.loads(self._store.get(Keys.running(node)).decode())

    def report_failure(self, node, failure):
        self._set(Keys.failure(node), failure.to_json())

    def failure(self, node):
        """The failure node `node` reported, or None."""
        if not self._store.check([Keys.failure(node)]):
            return None
        return Failure.from_json(self._store.get(Keys.failure(node)).decode())

    def rank_finished(self, rank):
        self._set(Keys.rank_done(rank), "1")

    def rank_is_done(self, rank):
        return self._store.check([Keys.rank_done(rank)])

    def beat(self, node):
        """Tell node 0 that node `node` is alive (see Supervisor's heartbeat watch)."""
        self._store.add(Keys.beat(node), 1)

    def beats(self, node):
        """How many heartbeats node `node` has sent."""
        return self._store.add(Keys.beat(node), 0)

    def ship_log(self, node, target_fd, data):
        """Queue output of node `node` (complete lines, for fd 1 or 2) for node 0's task log."""
        seq = self._store.add(Keys.log_count(node), 1)
        stream = 1 if target_fd == 1 else 2
        self._store.set(Keys.log_chunk(node, seq), bytes([stream]) + data)

    def end_log(self, node):
        self._set(Keys.log_end(node), "1")

    def take_logs(self, node, after):
        """([(target fd, data)], last seq taken) of the chunks node `node` shipped after `after`;
        each chunk is deleted from the store once taken."""
        count = self._store.add(Keys.log_count(node), 0)
        chunks = []
        for seq in range(after + 1, count + 1):
            key = Keys.log_chunk(node, seq)
            if not self._store.check([key]):
                break  # counted but not written yet: take it next time
            raw = self._store.get(key)
            self._store.delete_key(key)
            chunks.append((raw[0], raw[1:]))
            after = seq
        return chunks, after

    def log_ended(self, node):
        return self._store.check([Keys.log_end(node)])

    def publish_checkpoint(self, fields):
        self._set(Keys.checkpoint, json.dumps(fields))

    def checkpoint(self):
        """What node 0 published with publish_checkpoint (waits for it)."""
        self._store.wait([Keys.checkpoint])
        return json.loads(self._store.get(Keys.checkpoint).decode())

    def send_node_events(self, node, record):
        self._set(Keys.node_events(node), json.dumps(record))

    def node_events(self, node):
        """What node `node` sent of the gang's record, or None."""
        if not self._store.check([Keys.node_events(node)]):
            return None
        return json.loads(self._store.get(Keys.node_events(node)).decode())

    def abort(self):
        self._set(Keys.abort, "1")

    def aborted(self):
        return self._store.check([Keys.abort])


class GangMismatch(Exception):
    def __init__(self, found, expected):
        super().__init__(
            "the rendezvous store belongs to gang %s, not to this gang (%s): another job uses "
            "the same address and port" % (found, expected)
        )
