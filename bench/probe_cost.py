"""What hang detection's probe (stacks.py) costs a training rank (issue 23: under 1 %).

Two measurements, in one run:

1. One sample: the time of Probe._write (collective count, main-thread stack, JSON, atomic
   rename) in a process with a gloo group, from a stack 30 frames deep.
2. A DDP training loop (2 ranks, gloo, CPU) timed with no probe, the probe at its default
   interval (5 s: hang_timeout 600) and at its shortest (0.5 s), runs interleaved so that the
   machine's drift hits every variant alike; the median step time of each and its ratio to
   no probe.
3. Node 0's straggler watch (core/stragglers.py, issue 41): what one look of the gang costs
   node 0's task per hang check (Window.add with a full window of 120 s), for gangs of 4, 64
   and 512 ranks at the default and the shortest probe interval, and that as a share of one
   core. The ranks' probe is unchanged by it: node 0 reads the reports it read already.
4. A rank's Flight Recorder read (stacks.flight_recorder, issue 41 point 5): its time with a
   full buffer (torch's 2000 entries), which a probe pays only once its rank started no
   collective for half the hang timeout (so never in the training loop of 2.), and that as a
   share of one core at the default hang timeout (one read per 300 s).

    .venv/bin/python bench/probe_cost.py [--steps 300] [--repeats 5]

Writes bench/results/probe-<timestamp>.json and prints a summary.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import stragglers
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import stacks

VARIANTS = {"none": None, "default (5 s)": stacks.interval_for(600),
            "shortest (0.5 s)": stacks.MIN_INTERVAL}


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample_cost(n=2000):
    """Seconds per Probe._write, from a stack 30 frames deep."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with tempfile.TemporaryDirectory() as work:
            probe = stacks.Probe(stacks.probe_file(work, 0), 3600, 0, history_after=10 ** 9)

            def deep(k):
                if k:
                    return deep(k - 1)
                began = time.perf_counter()
                for _ in range(n):
                    probe._write(done=False)
                return (time.perf_counter() - began) / n

            return deep(30)
    finally:
        dist.destroy_process_group()


def history_cost(n=20):
    """(seconds per stacks.flight_recorder read of a full buffer, entries torch kept), or
    (None, 0) on a torch that keeps no Flight Recorder for gloo."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # what the gang sets
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        x = torch.ones(16)
        for _ in range(2100):
            dist.all_reduce(x)
        seq = stacks.collective_count()
        if isinstance(stacks.flight_recorder(seq), str):
            return None, 0
        began = time.perf_counter()
        for _ in range(n):
            stacks.flight_recorder(seq)
        return (time.perf_counter() - began) / n, 2000
    finally:
        dist.destroy_process_group()


def look_cost(world, interval, n=200):
    """Seconds per Window.add of a gang of `world` ranks, looks `interval` s apart, its window
    (stragglers.WINDOW_S) full; rank 1 the straggler."""
    window = stragglers.Window()
    look = {r: r != 1 for r in range(world)}
    now = 0.0
    for _ in range(int(stragglers.WINDOW_S / interval) + 1):
        now += interval
        window.add(now, look)
    began = time.perf_counter()
    for _ in range(n):
        now += interval
        window.add(now, look)
    return (time.perf_counter() - began) / n


def _train(rank, port, interval, steps, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    work = tempfile.mkdtemp()
    probe = stacks.Probe(stacks.probe_file(work, rank), interval, rank,
                         stacks.history_after(600)).start() if interval else None
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        *[torch.nn.Linear(256, 256) for _ in range(4)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    for _ in range(20):  # warm-up
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    dist.barrier()
    began = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - began
    if probe is not None:
        probe.stop()
    if rank == 0:
        Path(out).write_text(json.dumps(elapsed / steps))
    dist.destroy_process_group()


def step_time(interval, steps):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    mp.spawn(_train, args=(_port(), interval, steps, out), nprocs=2)
    return json.loads(Path(out).read_text())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    per_sample = sample_cost()
    per_read, entries = history_cost()
    looks = {"%d ranks, a look every %g s" % (world, interval):
             {"us": look_cost(world, interval) * 1e6, "interval_s": interval}
             for world in (4, 64, 512) for interval in (stacks.interval_for(600),
                                                         stacks.MIN_INTERVAL)}
    for cost in looks.values():
        cost["core_pct"] = cost["us"] / 1e6 / cost["interval_s"] * 100
    times = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, interval in VARIANTS.items():  # interleaved
            times[name].append(step_time(interval, args.steps))
    base = statistics.median(times["none"])
    result = {
        "sample_us": per_sample * 1e6,
        "steps": args.steps, "repeats": args.repeats,
        "step_ms": {n: statistics.median(t) * 1e3 for n, t in times.items()},
        "ratio_to_none": {n: statistics.median(t) / base for n, t in times.items()},
        "raw_s": times, "cpus": os.cpu_count(), "torch": torch.__version__,
        "straggler_look": looks, "load_1min": os.getloadavg()[0],
        "flight_recorder_read_ms": None if per_read is None else per_read * 1e3,
        "flight_recorder_entries": entries,
        "flight_recorder_core_pct_default": None if per_read is None
        else per_read / (stacks.history_after(600) * stacks.interval_for(600)) * 100,
    }
    results = REPO / "bench" / "results"
    results.mkdir(exist_ok=True)
    path = results / ("probe-%s.json" % time.strftime("%Y%m%dT%H%M%S"))
    path.write_text(json.dumps(result, indent=2))
    print("one sample: %.0f us" % result["sample_us"])
    for name in VARIANTS:
        print("%-18s %.3f ms/step  x%.4f" % (name, result["step_ms"][name],
                                            result["ratio_to_none"][name]))
    for name, cost in looks.items():
        print("node 0, straggler look, %-32s %7.1f us  %.4f%% of a core"
              % (name, cost["us"], cost["core_pct"]))
    if per_read is None:
        print("Flight Recorder: torch %s keeps none for gloo" % torch.__version__)
    else:
        print("Flight Recorder read, %d entries: %.1f ms (%.4f%% of a core at hang_timeout 600)"
              % (entries, result["flight_recorder_read_ms"],
                 result["flight_recorder_core_pct_default"]))
    print("written", path.relative_to(REPO))


if __name__ == "__main__":
    main()
