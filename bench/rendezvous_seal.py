"""What the seal of torch's own rendezvous (runtime/rendezvous_seal.py, issue 37) adds to
`init_process_group`: gangs of N ranks forked from one process that imported torch (as a
node's ranks are), each timing its `init_process_group("gloo")` and a first barrier, against a
TCPStore hosted as node 0 hosts it; torch's env:// as it is and through the seal, paired and
interleaved (the order alternates each repetition).

    .venv/bin/python bench/rendezvous_seal.py --sizes 4,64 --repeat 5

Writes bench/results/seal-<timestamp>.json and prints a Markdown table: per size, the median
of the slowest rank's init (the gang's), of the per-rank median, and the paired difference.
"""

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SECRET = "be" * 32


def rank_main(rank, world, port, sealed, out_fd):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import (
        rendezvous_seal,
    )
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), TORCHELASTIC_USE_AGENT_STORE="True",
                      GLOO_SOCKET_IFNAME="lo")
    if sealed:
        rendezvous_seal.install("bench", SECRET, "bench-gang", 0)
    start = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    formed = time.perf_counter()
    dist.barrier()
    done = time.perf_counter()
    os.write(out_fd, (json.dumps([rank, formed - start, done - start]) + "\n").encode())
    dist.destroy_process_group()


STORE_SERVER = (
    "import sys, time; from datetime import timedelta; import torch.distributed as dist\n"
    "s = dist.TCPStore('127.0.0.1', 0, None, True, timedelta(seconds=300),"
    " wait_for_workers=False)\n"
    "print(s.port, flush=True); sys.stdin.read()")


def one_gang(world, sealed):
    """{"init": [s per rank], "barrier": [...]} of one gang of `world` forked ranks. The store
    is served by a process of its own, as node 0's task serves it beside its ranks: this
    process starts no thread before it forks."""
    import subprocess

    server = subprocess.Popen([sys.executable, "-c", STORE_SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        return _gang(world, sealed, int(server.stdout.readline()))
    finally:
        server.stdin.close()
        server.wait()


def _gang(world, sealed, port):
    read, write = os.pipe()
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(read)
                rank_main(rank, world, port, sealed, write)
            except BaseException:  # noqa: BLE001 - a rank's failure is its exit status
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(write)
    with os.fdopen(read) as lines:
        rows = [json.loads(line) for line in lines]
    codes = [os.waitpid(pid, 0)[1] for pid in pids]
    if any(codes) or len(rows) != world:
        raise SystemExit("a gang of %d failed: %s" % (world, codes))
    rows.sort()
    return {"init": [r[1] for r in rows], "barrier": [r[2] for r in rows]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4,64")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import torch
    import torch.distributed  # noqa: F401 - imported once, before the ranks are forked

    results = {"sizes": {}, "cpus": os.cpu_count(), "torch": torch.__version__}
    for world in (int(s) for s in args.sizes.split(",")):
        runs = {"plain": [], "sealed": []}
        for i in range(args.repeat):
            order = ("plain", "sealed") if i % 2 == 0 else ("sealed", "plain")
            for kind in order:
                runs[kind].append(one_gang(world, kind == "sealed"))
        results["sizes"][world] = runs
    out = REPO / "bench" / "results" / ("seal-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    out.write_text(json.dumps(results, indent=1))
    print(table(results))
    print("written to %s" % out.relative_to(REPO))


def table(results):
    lines = ["| ranks | measure | torch's env:// | sealed | paired difference, median (range) |",
             "|---|---|---|---|---|"]
    for world, runs in results["sizes"].items():
        for measure, label in (("init", "init_process_group, slowest rank"),
                               ("barrier", "to the first barrier, slowest rank")):
            plain = [max(r[measure]) for r in runs["plain"]]
            sealed = [max(r[measure]) for r in runs["sealed"]]
            diffs = [s - p for s, p in zip(sealed, plain)]
            lines.append("| %s | %s | %.3f s | %.3f s | %+.3f s (%+.3f to %+.3f) |" % (
                world, label, statistics.median(plain), statistics.median(sealed),
                statistics.median(diffs), min(diffs), max(diffs)))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
