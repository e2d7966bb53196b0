"""What the seal of torch's own rendezvous (runtime/rendezvous_seal.py, issue 37) adds to
`init_process_group`: gangs of N ranks forked from one process that imported torch (as a
node's ranks are), each timing its `init_process_group("gloo")` and a first barrier, against a
TCPStore hosted as node 0 hosts it; torch's env:// as it is and through the seal, paired and
interleaved (the order rotates each repetition). With --before REV a third arm runs the seal
as it was at commit REV (the package's files of REV, extracted beside), in the same rotation,
so a change to the seal is measured before and after in one run. Each arm's ranks import the
package from a copy made when the bench starts (the working tree's, or REV's), so that edits
made while it runs change nothing.

    .venv/bin/python bench/rendezvous_seal.py --sizes 4,16,64 --repeat 5 --before HEAD

Writes bench/results/seal-<timestamp>.json and prints a Markdown table: per size, the median
of the slowest rank's init (the gang's), the paired difference of each sealed arm from torch's
env://, and the CPU time all ranks used (user and system) to the first barrier.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SECRET = "be" * 32


def rank_main(rank, world, port, sealed, out_fd, package_root=None):
    if package_root is not None:
        use_package(package_root)
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import (
        rendezvous_seal,
    )
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), TORCHELASTIC_USE_AGENT_STORE="True",
                      GLOO_SOCKET_IFNAME="lo")
    if sealed:
        rendezvous_seal.install("bench", SECRET, "bench-gang", 0)
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    formed = time.perf_counter()
    dist.barrier()
    done = time.perf_counter()
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = used.ru_utime + used.ru_stime - before.ru_utime - before.ru_stime
    os.write(out_fd, (json.dumps([rank, formed - start, done - start, cpu]) + "\n").encode())
    dist.destroy_process_group()


PACKAGE = "metaflow_extensions.torch_distributed.plugins.torch_distributed"


def use_package(package_root):
    """Make this process import the package's modules from `package_root` (a copy, extract):
    the package itself was imported as usual before the fork (metaflow refuses a second copy
    of an extension on the path), and its folder is pointed at the copy's files."""
    package = sys.modules[PACKAGE]
    for module in [m for m in sys.modules if m.startswith(PACKAGE + ".")]:
        del sys.modules[module]
    package.__path__ = [os.path.join(package_root, *PACKAGE.split("."))]


STORE_SERVER = (
    "import sys, time; from datetime import timedelta; import torch.distributed as dist\n"
    "s = dist.TCPStore('127.0.0.1', 0, None, True, timedelta(seconds=300),"
    " wait_for_workers=False)\n"
    "print(s.port, flush=True); sys.stdin.read()")


def one_gang(world, sealed, package_root=None):
    """{"init": [s per rank], "barrier": [...], "cpu": [...]} of one gang of `world` forked
    ranks. The store is served by a process of its own, as node 0's task serves it beside its
    ranks: this process starts no thread before it forks."""
    server = subprocess.Popen([sys.executable, "-c", STORE_SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        return _gang(world, sealed, int(server.stdout.readline()), package_root)
    finally:
        server.stdin.close()
        server.wait()


def _gang(world, sealed, port, package_root):
    read, write = os.pipe()
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(read)
                rank_main(rank, world, port, sealed, write, package_root)
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
    # cpu: what this rank's process used from init_process_group to the first barrier
    return {"init": [r[1] for r in rows], "barrier": [r[2] for r in rows],
            "cpu": [r[3] for r in rows]}


def extract(rev):
    """The package's files at commit `rev`, in a folder of their own: its path."""
    root = tempfile.mkdtemp(prefix="seal-before-")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "metaflow_extensions"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
    return root


def copy_tree():
    """The working tree's package files, copied to a folder of their own: its path."""
    root = tempfile.mkdtemp(prefix="seal-after-")
    shutil.copytree(REPO / "metaflow_extensions", Path(root) / "metaflow_extensions",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4,64")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", metavar="REV",
                        help="also run the seal as it was at this commit (arm 'before')")
    args = parser.parse_args()
    import importlib

    import torch
    import torch.distributed  # noqa: F401 - imported once, before the ranks are forked

    importlib.import_module(PACKAGE)  # with metaflow, once, before the ranks are forked
    arms = {"plain": (False, None), "sealed": (True, copy_tree())}
    if args.before:
        arms["before"] = (True, extract(args.before))
    before = args.before and subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.before], check=True,
        capture_output=True, text=True).stdout.strip()
    results = {"sizes": {}, "cpus": os.cpu_count(), "torch": torch.__version__,
               "before": before, "load_1min": [os.getloadavg()[0]]}
    for world in (int(s) for s in args.sizes.split(",")):
        runs = {kind: [] for kind in arms}
        for i in range(args.repeat):
            order = list(arms)[i % len(arms):] + list(arms)[:i % len(arms)]
            for kind in order:
                runs[kind].append(one_gang(world, *arms[kind]))
        results["sizes"][world] = runs
        results["load_1min"].append(os.getloadavg()[0])
    out = REPO / "bench" / "results" / ("seal-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    out.write_text(json.dumps(results, indent=1))
    print(table(results))
    print("written to %s" % out.relative_to(REPO))


def table(results):
    """Per size and measure, the median of each arm and each sealed arm's paired difference
    from torch's env:// (median, range)."""
    arms = [a for a in ("before", "sealed") if a in next(iter(results["sizes"].values()))]
    names = {"before": "sealed at %s" % results.get("before"), "sealed": "sealed"}
    lines = ["| ranks | measure | torch's env:// | %s |" % " | ".join(
                 "%s | its paired difference, median (range)" % names[a] for a in arms),
             "|---|---|---|%s" % ("---|---|" * len(arms))]
    for world, runs in results["sizes"].items():
        for measure, label, of in (("init", "init_process_group, slowest rank", max),
                                   ("cpu", "CPU time of all ranks, to the first barrier", sum)):
            if "cpu" not in runs["plain"][0] and measure == "cpu":
                continue
            plain = [of(r[measure]) for r in runs["plain"]]
            cells = []
            for arm in arms:
                mine = [of(r[measure]) for r in runs[arm]]
                diffs = [m - p for m, p in zip(mine, plain)]
                cells.append("%.3f s | %+.3f s (%+.3f to %+.3f)" % (
                    statistics.median(mine), statistics.median(diffs), min(diffs), max(diffs)))
            lines.append("| %s | %s | %.3f s | %s |" % (
                world, label, statistics.median(plain), " | ".join(cells)))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
