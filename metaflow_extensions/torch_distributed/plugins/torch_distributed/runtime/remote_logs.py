"""The output of remote nodes, carried into node 0's task log.

Metaflow keeps (and `python flow.py logs` shows) the log of the task, which is node 0's. A
remote node's pump therefore also ships every line it writes to node 0 through the gang's
store, and node 0 writes those lines, already rank-prefixed, into the task's stdout and stderr.
The node's own container log keeps a copy.
"""

import os
import queue
import sys
import threading
import time
from typing import Callable, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..core.gangspec import GangSpec
from ..runtime.control import ControlPlane

# Seconds between two looks for new chunks on node 0.
POLL_INTERVAL = 0.1
# Seconds a remote node's shipper gathers its pump's writes into one chunk: node 0 takes a
# chunk, not a write, at a time (two requests each), however many lines its ranks print.
SHIP_INTERVAL = POLL_INTERVAL / 2
# Seconds a remote node's pump spends shipping what is left when its ranks are done.
CLOSE_TIMEOUT = 10.0


class LogShipper:
    """The pump's sink on a remote node: ships its writes to node 0, in order, from a thread of
    the pump process, so the pump's local writes never wait for the network or for node 0 to
    come up. What the pump wrote within SHIP_INTERVAL s goes as one chunk per stream. On any
    store error it stops shipping (the local copy goes on)."""

    def __init__(self, spec: GangSpec) -> None:
        self.spec = spec
        # (target fd, data) to ship, then None: the end
        self._queue: queue.Queue[Optional[Tuple[int, bytes]]] = queue.Queue()
        self._broken = False
        self._thread = threading.Thread(target=self._run, name="torch-distributed-ship",
                                        daemon=True)
        self._thread.start()

    def __call__(self, target_fd: int, data: bytes) -> None:
        if not self._broken:
            self._queue.put((target_fd, data))

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Ship what is queued (at most `timeout` seconds), then tell node 0 this is the end."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            control = ControlPlane.of_attempt(self.spec.attempt,
                                              self.spec.blueprint.rendezvous_timeout_s)
            while True:
                writes, ended = self._gather()
                for target_fd, data in _by_stream(writes):
                    control.ship_log(self.spec.node, target_fd, data)
                if ended:
                    control.end_log(self.spec.node)
                    return
        except Exception as ex:  # noqa: BLE001 - node 0 gone: keep the local log going
            self._broken = True
            os.write(2, ("[node %d] cannot ship this node's output to node 0 any more (%s); "
                         "it stays in this node's own log\n" % (self.spec.node, ex)).encode())

    def _gather(self) -> Tuple[List[Tuple[int, bytes]], bool]:
        """(the writes queued within SHIP_INTERVAL s of the first, whether close() came)."""
        writes: List[Tuple[int, bytes]] = []
        item = self._queue.get()
        deadline = time.monotonic() + SHIP_INTERVAL
        while item is not None:
            writes.append(item)
            left = deadline - time.monotonic()
            if left <= 0:
                return writes, False
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                return writes, False
        return writes, True


def _by_stream(writes: Sequence[Tuple[int, bytes]]) -> List[Tuple[int, bytes]]:
    """[(target fd, data)] with each run of writes to the same stream joined, in order."""
    runs: List[Tuple[int, List[bytes]]] = []
    for target_fd, data in writes:
        if runs and runs[-1][0] == target_fd:
            runs[-1][1].append(data)
        else:
            runs.append((target_fd, [data]))
    return [(target_fd, b"".join(parts)) for target_fd, parts in runs]


class LogReceiver:
    """Node 0's side: a thread copying the chunks of `nodes` into `out_fds` ({1: fd, 2: fd}),
    and passing each to `tee(target fd, data)` if given."""

    def __init__(self, control: ControlPlane, nodes: Iterable[int], out_fds: Mapping[int, int],
                 tee: Optional[Callable[[int, bytes], object]] = None) -> None:
        self.control = control
        self.tee = tee
        self.nodes = list(nodes)
        self.out_fds = out_fds
        self._taken = {node: 0 for node in self.nodes}
        self._stop = threading.Event()
        self.error: Optional[Exception] = None
        self._thread = threading.Thread(target=self._run, name="torch-distributed-logs",
                                        daemon=True)

    def start(self) -> "LogReceiver":
        self._thread.start()
        return self

    def stop(self, timeout: float) -> None:
        """Copy what the nodes still ship, until each said it ended or `timeout` passed."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            return
        try:
            pending = set(self.nodes)
            while pending and time.monotonic() < deadline:
                for node in list(pending):
                    ended = self.control.log_ended(node)  # before taking: nothing comes after
                    if not self._copy(node) and ended:
                        pending.discard(node)
                time.sleep(POLL_INTERVAL / 2)
        except Exception as ex:  # noqa: BLE001 - reported below, never hides the step's result
            self.error = ex
        if self.error is not None:
            print("@torch_distributed: lost part of the remote nodes' output: %s" % self.error,
                  file=sys.stderr)

    def _run(self) -> None:
        try:
            while not self._stop.wait(POLL_INTERVAL):
                for node in self.nodes:
                    self._copy(node)
        except Exception as ex:  # noqa: BLE001 - kept for stop() to report
            self.error = ex

    def _copy(self, node: int) -> bool:
        chunks, self._taken[node] = self.control.take_logs(node, self._taken[node])
        for target, data in chunks:
            fd = self.out_fds.get(target, self.out_fds[2])
            if self.tee is not None:
                self.tee(target, data)
            while data:
                data = data[os.write(fd, data):]
        return bool(chunks)
