"""A remote node's output carried into node 0's log through the gang's store (real TCPStore,
real pump process)."""

import os
import subprocess
import sys

import torch.distributed  # noqa: F401

from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import (
    ControlPlane,
    bind_listener,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import OutputPump
from tests import records
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.remote_logs import (
    LogReceiver,
    LogShipper,
)

GANG = "1700-train-5-0"
SECRET = "0123456789abcdef0123456789abcdef"


def spec(port, node=1, rendezvous_timeout_s=5.0):
    return records.spec(node=node, blueprint_changes=dict(
                            nproc_per_node=1, rendezvous_timeout_s=rendezvous_timeout_s),
                        attempt_changes=dict(master_port=port, gang_id=GANG, secret=SECRET,
                                             backend="batch"))


def read_all(fd):
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def test_a_pumps_lines_reach_node_0_prefixed_and_on_their_stream(tmp_path):
    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    host = ControlPlane.host(listener, GANG, SECRET, timeout=5)
    listener.close()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    receiver = LogReceiver(ControlPlane.connect("127.0.0.1", port, GANG, SECRET, 5), [1],
                           {1: out_w, 2: err_w}).start()

    # node 1: a member writing to both streams, through a pump that ships to node 0
    member = subprocess.Popen(
        [sys.executable, "-S", "-c",
         "import sys\nfor i in range(200): print('line', i)\n"
         "print('oops', file=sys.stderr)\nsys.stdout.write('no newline')"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    local = tmp_path / "node1.log"
    with open(local, "wb") as node_log:
        pump = OutputPump(tee=lambda: LogShipper(spec(port)))
        pump.add(os.dup(member.stdout.fileno()), "[rank 1]", node_log.fileno())
        pump.add(os.dup(member.stderr.fileno()), "[rank 1]", node_log.fileno())
        pump.start()
        member.stdout.close()
        member.stderr.close()
        member.wait(10)
        assert pump.drain(10)
    receiver.stop(5)
    assert receiver.error is None
    os.close(out_w)
    os.close(err_w)
    out, err = read_all(out_r).decode(), read_all(err_r).decode()
    # The pump's target here is one file for both streams (not fd 1): shipped as stderr.
    shipped = out + err
    assert all("[rank 1] line %d\n" % i in shipped for i in range(200))
    assert "[rank 1] oops\n" in shipped and "[rank 1] no newline\n" in shipped
    assert local.read_text().count("[rank 1] line") == 200  # the node keeps its own copy
    assert host.log_ended(1)


def test_stdout_and_stderr_stay_apart():
    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    host = ControlPlane.host(listener, GANG, SECRET, timeout=5)
    listener.close()
    shipper = LogShipper(spec(port))
    shipper(1, b"[rank 1] to stdout\n")
    shipper(2, b"[rank 1] to stderr\n")
    shipper.close()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    LogReceiver(host, [1], {1: out_w, 2: err_w}).start().stop(5)
    os.close(out_w)
    os.close(err_w)
    assert read_all(out_r) == b"[rank 1] to stdout\n"
    assert read_all(err_r) == b"[rank 1] to stderr\n"


def test_a_shipper_whose_node_0_is_gone_keeps_quiet_after_one_note(capfd):
    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    listener.close()  # nobody serves this port
    shipper = LogShipper(spec(port, rendezvous_timeout_s=0.5))
    shipper(1, b"x\n")
    shipper(1, b"y\n")
    shipper.close()
    err = capfd.readouterr().err
    assert err.count("cannot ship this node's output to node 0") == 1


def test_a_burst_of_writes_reaches_node_0_as_a_few_chunks_in_order():
    """Node 0 takes a chunk at a time (issue 25: one chunk per write made node 0's receiver
    fall behind at 10,000 lines/s across 64 nodes): what a node's pump writes within a
    shipping interval goes as one chunk per stream, each stream's lines in order."""
    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    host = ControlPlane.host(listener, GANG, SECRET, timeout=5)
    listener.close()
    shipper = LogShipper(spec(port))
    for i in range(1000):
        shipper(1, b"[rank 1] out %d\n" % i)
        if i % 100 == 0:
            shipper(2, b"[rank 1] err %d\n" % i)
    shipper.close()
    assert host.log_ended(1)
    chunks, taken = host.take_logs(1, 0)
    assert taken < 50, taken  # 1,010 writes
    out = b"".join(data for fd, data in chunks if fd == 1)
    err = b"".join(data for fd, data in chunks if fd == 2)
    assert out == b"".join(b"[rank 1] out %d\n" % i for i in range(1000))
    assert err == b"".join(b"[rank 1] err %d\n" % i for i in range(0, 1000, 100))
