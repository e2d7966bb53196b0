"""The remote log path at scale (bench/scale.py's store arm): the output of N-1 remote nodes
carried into node 0's log through the gang's store, by the product's own code.

On AWS Batch and Kubernetes each node other than 0 pumps its ranks' output through an
OutputPump whose sink is a LogShipper (NodeRunner, remote), and node 0's task copies it out of
the store with a LogReceiver into the task's stdout, which Metaflow captures. Locally the agents
pipe their output to node 0 instead, so a local run never uses this path. Here it runs as it
does remotely, without Metaflow around it:

- this process is node 0: it hosts the real ControlPlane store and runs the real LogReceiver
  (on its own client, as Leader._start does), writing into a pipe;
- a sink process reads that pipe and notes when each line arrived (as Metaflow's runtime
  stamps each line of a task's output as it reads it);
- each remote node is a process forked from this one (torch is imported once here, so the
  emulated nodes cost little memory), which forks its ranks (each writes numbered, timed lines
  to its pipe) and starts the real OutputPump with the real LogShipper as its sink;
- at the end each node drains its pump as an agent does (gang.DRAIN_TIMEOUT), and node 0 stops
  the receiver with the time the gang gives it (gang.REMOTE_DRAIN_TIMEOUT).

Prints one JSON line: lines written, delivered, lost, reordered, delays, node 0's CPU and the
store's request rate while idle (receiver polling alone) and while the lines flow.

    .venv/bin/python bench/scale_storelogs.py --nodes 16 --nproc 8 --rate 10000 --seconds 5
"""

import argparse
import json
import os
import re
import signal
import struct
import sys
import time

import torch.distributed  # noqa: F401 - before the nodes are forked: each shares it

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import GangSpec
from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import (
    DRAIN_TIMEOUT,
    REMOTE_DRAIN_TIMEOUT,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import (
    ControlPlane,
    bind_listener,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import OutputPump
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.remote_logs import (
    LogReceiver,
    LogShipper,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale_probe  # noqa: E402

GANG = "scale-bench-train-1-0"
SECRET = "5ca1e" * 12
LINE = re.compile(rb"^\[rank (\d+)\] SCALELOG (\d+) (\d+) ([\d.]+)$")


def spec(node, nodes, nproc, port):
    return GangSpec(role="agent", step_name="train", nodes=nodes, nproc_per_node=nproc,
                    node=node, master_addr="127.0.0.1", master_port=port, gang_id=GANG,
                    secret=SECRET, restart_count=0, accelerator="cpu", rendezvous_timeout_s=60,
                    finish_timeout_s=60, start_method="fork", work_dir="", task={},
                    top_args=[], backend="batch")


def sleep_until(t):
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


def read_start(go_fd):
    """The burst's start time, as main writes it once every node is up (8 bytes a reader:
    a pipe's writes and reads of 8 bytes are whole)."""
    return struct.unpack("d", os.read(go_fd, 8))[0]


def rank_writer(rank, fd, go_fd, per_rank, count):
    """A rank: `count` lines at `per_rank` lines a second from the start, each written at
    once."""
    start = read_start(go_fd)
    for i in range(count):
        sleep_until(start + i / per_rank)
        os.write(fd, b"SCALELOG %d %d %.6f\n" % (rank, i, time.time()))


def remote_node(node, nodes, nproc, port, go_fd, ready_fd, per_rank, count):
    """One remote node's processes: its ranks and its pump shipping to node 0; says it is up
    on `ready_fd`, its ranks start at the time main writes on `go_fd`. Never returns."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the node's own log (its container's): not measured here
        pump = OutputPump(tee=lambda: LogShipper(spec(node, nodes, nproc, port)))
        ranks = []
        for local in range(nproc):
            rank = node * nproc + local
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(r)
                    rank_writer(rank, w, go_fd, per_rank, count)
                finally:
                    os._exit(0)
            os.close(w)
            ranks.append(pid)
            pump.add(r, "[rank %d]" % rank, 1)
        pump.start()
        os.write(ready_fd, b"1")
        for pid in ranks:
            os.waitpid(pid, 0)
        code = 0 if pump.drain(DRAIN_TIMEOUT) else 3
    finally:
        os._exit(code)


def sink(fd, path):
    """Node 0's task log: each line with when it was read (a chunk's lines share a time)."""
    code = 1
    try:
        pending = b""
        with open(path, "wb") as out:
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                now = b"%.6f " % time.time()
                *lines, pending = (pending + chunk).split(b"\n")
                out.write(b"".join(now + line + b"\n" for line in lines))
        code = 0
    finally:
        os._exit(code)


def measure(nodes, nproc, rate, seconds, idle_s, out_dir):
    """`nodes` is the gang's size: nodes 1..nodes-1 ship, node 0 receives. Rank r writes
    rate / (nodes * nproc) lines a second, as in the local arm."""
    remote = list(range(1, nodes))
    world = nodes * nproc
    per_rank = rate / world
    count = int(per_rank * seconds)
    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    sink_r, sink_w = os.pipe()
    log_path = os.path.join(out_dir, "node0.log")
    sink_pid = os.fork()
    if sink_pid == 0:
        listener.close()
        os.close(sink_w)
        sink(sink_r, log_path)
    os.close(sink_r)
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pids = []
    for node in remote:
        pid = os.fork()
        if pid == 0:
            for fd in (sink_w, go_w, ready_r):
                os.close(fd)
            listener.close()
            remote_node(node, nodes, nproc, port, go_r, ready_w, per_rank, count)
        pids.append(pid)
    os.close(go_r)
    os.close(ready_w)
    host = ControlPlane.host(listener, GANG, SECRET, 60)
    listener.close()
    receiver = LogReceiver(ControlPlane.connect("127.0.0.1", port, GANG, SECRET, 60), remote,
                           {1: sink_w, 2: sink_w}).start()
    up = 0
    while up < len(remote):  # every node forked its ranks and started its pump
        got = os.read(ready_r, len(remote) - up)
        if not got:
            raise RuntimeError("a remote node ended before it was up")
        up += len(got)
    # the shippers connect as their pumps start: the idle window begins once they can have
    idle = [time.time() + 1.0, time.time() + 1.0 + idle_s]
    logs = [idle[1], idle[1] + seconds]
    os.write(go_w, struct.pack("d", logs[0]) * (len(remote) * nproc))
    me = os.getpid()
    sleep_until(idle[0] + 0.5)
    a = scale_probe.snapshot([me], port)
    sleep_until(idle[1] - 0.2)
    b = scale_probe.snapshot([me], port)
    sleep_until(logs[0])
    c = scale_probe.snapshot([me], port)
    sleep_until(logs[1])
    d = scale_probe.snapshot([me], port)
    codes = {}
    deadline = time.time() + 120
    while len(codes) < len(pids) and time.time() < deadline:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    for pid in pids:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
    nodes_done = time.time()
    receiver.stop(REMOTE_DRAIN_TIMEOUT)
    stopped = time.time()
    e = scale_probe.snapshot([me], port)
    os.close(sink_w)
    os.waitpid(sink_pid, 0)
    lines = analyse(log_path, remote, nproc, count, logs)
    del host
    return dict(
        nodes=nodes, shipping_nodes=len(remote), nproc=nproc,
        rate_offered=rate * len(remote) / nodes,
        per_rank_rate=per_rank, seconds=seconds, lines_per_rank=count,
        nodes_not_drained=sum(1 for c in codes.values() if c != 0),
        receiver_error=None if receiver.error is None else str(receiver.error),
        drain_after_nodes_s=round(stopped - nodes_done, 3),
        idle=scale_probe.rates(a, b), logging=scale_probe.rates(c, d),
        until_stopped=scale_probe.rates(c, e), **lines)


def analyse(path, nodes, nproc, count, window):
    """Loss, order and delay of every rank's lines in node 0's log."""
    expected = {n * nproc + lr: count for n in nodes for lr in range(nproc)}
    last = {}
    seen = {r: set() for r in expected}
    reordered = duplicates = foreign = 0
    lines = []
    with open(path, "rb") as f:
        for raw in f:
            at, _, line = raw.rstrip(b"\n").partition(b" ")
            m = LINE.match(line)
            if not m:
                continue
            rank, seq, written = int(m.group(2)), int(m.group(3)), float(m.group(4))
            if rank not in expected or int(m.group(1)) != rank:
                foreign += 1
                continue
            at = float(at)
            if seq in seen[rank]:
                duplicates += 1
            if seq <= last.get(rank, -1):
                reordered += 1
            last[rank] = seq
            seen[rank].add(seq)
            lines.append((written, at))
    return scale_probe.line_stats(sum(expected.values()), sum(len(s) for s in seen.values()),
                                  reordered, duplicates + foreign, lines, window)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--rate", type=float, default=10000.0, help="lines a second, the gang")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--idle", type=float, default=4.0)
    parser.add_argument("--out", required=True, help="a folder for node 0's log")
    args = parser.parse_args(argv)
    result = measure(args.nodes, args.nproc, args.rate, args.seconds, args.idle, args.out)
    print("SCALE_STORE_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
