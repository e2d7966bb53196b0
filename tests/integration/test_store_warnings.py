"""Issue 37, point 8: malformed requests to the gang's store (whoever reaches its port can send
them) no longer flood node 0's task log with torch's C++ warnings: each kind is shown once a
minute, with its stack, then one line says how many more came. A real store, in a process
whose stderr goes through the output pump as node 0's task's does; the requests come from a
raw socket."""

import os
import socket
import struct
import subprocess
import sys
import time

from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
    OutputPump,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.storewarnings import (
    StoreWarnings,
)

HOST = """
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
print(store.port, flush=True)
sys.stdin.read()  # until the test closes it
"""

REQUESTS = 150  # torch logs about 50 a second, each with its stack
# torch's handshake (query VALIDATE, its magic number), then a SET whose key is 1 TiB long
MALFORMED = bytes([0]) + struct.pack("<I", 0x3C85F7CE) + bytes([1]) + struct.pack("<Q", 2**40)


def malformed_requests(port, count, batch=50):
    """`count` malformed requests, each on a connection of its own, `batch` at a time (each
    connection stays open until the server read its request)."""
    for _ in range(0, count, batch):
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(batch)]
        for conn in conns:
            conn.sendall(MALFORMED)
        for conn in conns:
            conn.settimeout(30)
            assert conn.recv(16) == b""  # the server dropped it, once it logged its warning
            conn.close()


def test_malformed_requests_put_one_warning_a_minute_in_the_log(tmp_path):
    log = open(tmp_path / "log", "wb")
    err_r, err_w = os.pipe()
    host = subprocess.Popen([sys.executable, "-c", HOST], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err_w)
    os.close(err_w)
    pump = OutputPump()
    pump.add(err_r, "", log.fileno())
    pump.start(close_in_child=[host.stdin.fileno(), host.stdout.fileno()])
    try:
        port = int(host.stdout.readline())
        started = time.monotonic()
        malformed_requests(port, REQUESTS)
        took = time.monotonic() - started
    finally:
        host.stdin.close()
        host.wait(timeout=30)
        pump.drain(10)
        log.close()
    text = (tmp_path / "log").read_bytes()
    headers = [l for l in text.splitlines() if l.startswith(b"[W")]
    assert len(headers) == 1, text[:2000]  # the first one, with its stack
    assert b"Exception raised from" in text
    assert (b"torch logged %d more warnings like \"[c10d] Error processing client message: "
            b"Invalid string size." % (REQUESTS - 1)) in text, text[-600:]
    assert len(text) < 5000, len(text)  # about 2,300 bytes a request before
    print("%d malformed requests in %.2f s: %d bytes of log" % (REQUESTS, took, len(text)))


def test_each_kind_once_a_window_then_a_count():
    warnings = StoreWarnings(window=60)
    header = (b"[W1205 14:05:58.608123759 TCPStoreLibUvBackend.cpp:126] [c10d] Error processing "
              b"client message: Invalid string size. size: %d, max: 8192")
    other = (b"[W1205 14:05:59.715310652 TCPStoreLibUvBackend.cpp:126] [c10d] Error processing "
             b"client message: Too many keys being waited. keys: 99, max: 131072")
    stack = [b"Exception raised from read_key at x.cpp:588 (most recent call first):",
             b"frame #0: c10::Error::Error() + 0x9d", b"frame #1: uv_run + 0x16f", b""]
    kept, notes = warnings.lines([header % 1, *stack, b"epoch 1", header % 2, *stack,
                                  other, *stack, header % 3, *stack, b"epoch 2"], now=0.0)
    assert notes == []
    assert kept == [header % 1, *stack, b"epoch 1", other, *stack, b"epoch 2"]
    assert warnings.due() == 60.0
    assert warnings.notes(59.0) == []
    [note] = warnings.notes(60.0)
    assert note.startswith(b"@torch_distributed: torch logged 2 more warnings like "
                           b"\"[c10d] Error processing client message: Invalid string size. "
                           b"size: 1, max: 8192\" in the last 60s, not shown")
    assert warnings.due() is None
    # a new window: shown again
    kept, _ = warnings.lines([header % 4, *stack], now=61.0)
    assert kept == [header % 4, *stack]
    # a line that only looks like it, from elsewhere, passes
    assert warnings.lines([b"[rank 1] [W1205 x TCPStore.cpp:1] hi"] * 2, now=62.0)[0] == [
        b"[rank 1] [W1205 x TCPStore.cpp:1] hi"] * 2
