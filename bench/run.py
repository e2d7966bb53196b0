"""Benchmarks: @torch_distributed side by side with torchrun, Metaflow's @parallel and one process.

    .venv/bin/pip install -r bench/requirements.txt
    .venv/bin/python bench/run.py            # the full run (docs/benchmarks.md says how long)
    .venv/bin/python bench/run.py --quick    # every measurement once, small: a smoke test

One run measures, paired and repeated (the launchers of one repetition run back to back, in a
shuffled order): launch overhead at world sizes 1, 2, 4, 8 (whole-flow wall time, time to the
first collective, peak memory of the gang), steady-state DDP throughput, a rank-0 state dict
artifact, and failure detection. It writes bench/results/<timestamp>.json and regenerates
docs/benchmarks.md and docs/benchmarks_launch.png from it (bench/report.py). A run of the
launch part alone (`--only launch`, e.g. `--only launch --sizes 4,8`) writes only the page's
`world_size` section (issue 11) and keeps the rest.

Every flow runs in a fresh temporary folder (METAFLOW_HOME, local datastore and metadata), the
same isolation as the tests (tests/support.py).
"""

import argparse
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
FLOWS = HERE / "flows"
RESULTS = HERE / "results"
REPO = HERE.parent

# launcher name -> (flow file, extra environment)
LAUNCHERS = {
    "single": ("bench_single.py", {}),
    "torchrun": ("bench_torchrun.py", {}),
    "parallel": ("bench_parallel.py", {}),
    "ours_fork": ("bench_ours.py", {"BENCH_START_METHOD": "fork"}),
    "ours_exec": ("bench_ours.py", {"BENCH_START_METHOD": "exec"}),
    # torch imported by the task before the fork: the fix suggested in docs/benchmarks.md
    "ours_preload": ("bench_ours.py", {"BENCH_START_METHOD": "fork", "BENCH_PRELOAD": "1"}),
    # the gang's card off (issue 41: what drawing the card costs the launch)
    "ours_nocard": ("bench_ours.py", {"BENCH_START_METHOD": "fork",
                                      "METAFLOW_TORCH_DISTRIBUTED_CARD": "0"}),
    # one process per emulated node: what world_size alone meant on CPU before issue 11
    "ours_nodes": ("bench_ours.py", {"BENCH_START_METHOD": "fork", "BENCH_NODE_PER_RANK": "1"}),
}

FULL = dict(sizes=[1, 2, 4, 8], reps=5, ddp_world=2, ddp_steps=1000, ddp_reps=3,
            artifact_world=4, artifact_mb=200, artifact_reps=2, fail_world=4, fail_reps=3,
            parallel_fail_reps=1, parallel_bound=120.0)
QUICK = dict(sizes=[1, 4], reps=1, ddp_world=2, ddp_steps=50, ddp_reps=1,
             artifact_world=2, artifact_mb=50, artifact_reps=1, fail_world=2, fail_reps=1,
             parallel_fail_reps=1, parallel_bound=15.0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TreeSampler(threading.Thread):
    """Peak of the summed RSS (and PSS, which counts pages shared after a fork once) of every
    process below `pid`, the Metaflow runtime itself excluded, sampled every `interval` s."""

    def __init__(self, pid, interval=0.1):
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_rss = self.peak_pss = 0
        self.peak_procs = 0
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            rss = pss = 0
            try:
                procs = self.root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    mem = p.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                rss += mem.rss
                pss += getattr(mem, "pss", mem.rss)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_procs = max(self.peak_procs, len(procs))
            self.stopped.wait(self.interval)


def kill_tree(proc):
    procs = [proc]
    try:
        procs += psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    for p in procs:
        try:
            p.kill()
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass


def leftovers(root, wait=5.0):
    """Kill, and count, processes of this flow (they carry its BENCH_MARK_DIR) still running
    `wait` s after it ended."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("BENCH_MARK_DIR") == str(root) and p.status() != "zombie":
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for p in found:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return len(found)


def bytes_under(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def compile_bytecode(python=sys.executable):
    """Compile the package `python` imports, and the benchmark's flows, to bytecode, as an
    installed package is (pip compiles at install). Without it, an editable install under
    PYTHONDONTWRITEBYTECODE=1 (this project's machines set it) compiles the package from source
    in every process of every flow: ~30 ms a process, more where a gang imports its runner."""
    where = subprocess.run(
        [python, "-c", "import metaflow_extensions.torch_distributed as m; print(m.__path__[0])"],
        capture_output=True, text=True, check=True, cwd=str(HERE)).stdout.strip()
    subprocess.run([python, "-m", "compileall", "-q", "-j0", where, str(HERE)],
                   check=True, stdout=subprocess.DEVNULL)


def flow_env(root, drop=()):
    """The environment of a benchmark flow run in `root`: this one's without Metaflow's,
    the benchmark's, the tests' (and the `drop` prefixes') settings or a launcher's rank
    variables, with a local datastore and metadata in `root`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("METAFLOW_", "BENCH_", "TD_", *drop))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update({
        "METAFLOW_HOME": str(root / "mfhome"),
        "METAFLOW_DEFAULT_DATASTORE": "local",
        "METAFLOW_DEFAULT_METADATA": "local",
        "METAFLOW_DATASTORE_SYSROOT_LOCAL": str(root),
        "USERNAME": "bench",
        # @parallel starts its local workers as `python`: the venv's must come first.
        "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        "BENCH_MARK_DIR": str(root),
    })
    return env


def run_flow(launcher, settings, bound=None):
    """Run one flow in a fresh folder; its measurements as a dict."""
    flow, extra = LAUNCHERS[launcher]
    root = Path(tempfile.mkdtemp(prefix="td-bench-"))
    env = flow_env(root)
    env["BENCH_PORT"] = str(free_port())
    env.update({k: str(v) for k, v in extra.items()})
    env.update({k: str(v) for k, v in settings.items()})
    load = os.getloadavg()[0]
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(FLOWS / flow), "--no-pylint", "run"], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc)
        out, _ = proc.communicate()
    ended = time.time()
    wall = time.monotonic() - started
    sampler.stopped.set()
    sampler.join()
    mark = root / "failed-at"
    record = {
        "launcher": launcher, "settings": settings, "wall": round(wall, 3),
        "returncode": None if timed_out else proc.returncode, "timed_out": timed_out,
        "peak_rss_mb": round(sampler.peak_rss / 2**20, 1),
        "peak_pss_mb": round(sampler.peak_pss / 2**20, 1),
        "peak_procs": sampler.peak_procs,
        "datastore_bytes": bytes_under(root / ".metaflow"),
        "load_1min": load,
        "result": parse_result(out),
    }
    record["leftovers"] = leftovers(root)
    ranks = sorted(root.glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    if ranks:
        record["ranks"] = [json.loads(p.read_text()) for p in ranks]
    if mark.exists():
        record["detection"] = round(ended - float(mark.read_text()), 3)
    expect_failure = settings.get("BENCH_KIND") == "fail"
    if not timed_out and (proc.returncode != 0) != expect_failure:
        record["output_tail"] = out[-4000:]
        print("  unexpected return code %s of %s %s:\n%s"
              % (proc.returncode, launcher, settings, out[-2000:]), file=sys.stderr)
    shutil.rmtree(root, ignore_errors=True)
    return record


def parse_result(output):
    for line in output.splitlines():
        if "BENCH_RESULT " in line:
            return json.loads(line.split("BENCH_RESULT ", 1)[1])
    return None


def shuffled(items, rng):
    items = list(items)
    rng.shuffle(items)
    return items


class Session:
    """The runs of one bench invocation, logged as they finish."""

    def __init__(self, log):
        self.log = log
        self.runs = []

    def go(self, rep, launcher, bound=None, **settings):
        rec = run_flow(launcher, settings, bound=bound)
        rec["rep"] = rep
        self.runs.append(rec)
        self.log("  %-12s %-44s wall %6.2fs  rc %-4s rss %6.0f MB%s%s" % (
            launcher, " ".join("%s=%s" % (k[6:].lower(), v) for k, v in settings.items()),
            rec["wall"], rec["returncode"], rec["peak_rss_mb"],
            "  detection %.2fs" % rec["detection"] if "detection" in rec else "",
            "  LEFT %d PROCESSES" % rec["leftovers"] if rec["leftovers"] else ""))
        return rec


PARTS = ("launch", "ddp", "artifact", "fail")


def measure(cfg, rng, log, parts=PARTS):
    s = Session(log)
    for rep in range(cfg["reps"] if "launch" in parts else 0):
        log("launch, repetition %d/%d" % (rep + 1, cfg["reps"]))
        for size in shuffled(cfg["sizes"], rng):
            for launcher in shuffled(LAUNCHERS, rng):
                s.go(rep, launcher, BENCH_KIND="launch", BENCH_WORLD=size)
    for rep in range(cfg["ddp_reps"] if "ddp" in parts else 0):
        log("ddp, repetition %d/%d" % (rep + 1, cfg["ddp_reps"]))
        for launcher in shuffled(["torchrun", "ours_fork"], rng):
            s.go(rep, launcher, BENCH_KIND="ddp", BENCH_WORLD=cfg["ddp_world"],
                 BENCH_STEPS=cfg["ddp_steps"])
    for rep in range(cfg["artifact_reps"] if "artifact" in parts else 0):
        log("artifact, repetition %d/%d" % (rep + 1, cfg["artifact_reps"]))
        for launcher in shuffled(["single", "ours_fork", "parallel"], rng):
            s.go(rep, launcher, BENCH_KIND="artifact", BENCH_WORLD=cfg["artifact_world"],
                 BENCH_MB=cfg["artifact_mb"])
    for when in ("before_init", "in_collective") if "fail" in parts else ():
        fail = dict(BENCH_KIND="fail", BENCH_WORLD=cfg["fail_world"], BENCH_FAIL_RANK=1,
                    BENCH_FAIL_WHEN=when)
        for rep in range(max(cfg["fail_reps"], cfg["parallel_fail_reps"])):
            log("failure %s, repetition %d" % (when, rep + 1))
            if rep < cfg["fail_reps"]:
                s.go(rep, "ours_fork", bound=cfg["parallel_bound"], **fail)
            if rep < cfg["parallel_fail_reps"]:
                s.go(rep, "parallel", bound=cfg["parallel_bound"], **fail)
    return s.runs


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import metaflow
    import torch

    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "metaflow": metaflow.__version__ if hasattr(metaflow, "__version__")
        else "?", "load_1min_before": os.getloadavg()[0],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every measurement once, small")
    parser.add_argument("--reps", type=int, help="repetitions of the launch measurements")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        help="world sizes of the launch measurements, e.g. 1,2,4,8")
    parser.add_argument("--seed", type=int, default=0, help="of the shuffled run order")
    parser.add_argument("--only", type=lambda s: s.split(","), default=list(PARTS),
                        help="comma-separated parts to run (%s); default all" % ",".join(PARTS))
    parser.add_argument("--no-docs", action="store_true", help="write the JSON only")
    parser.add_argument("--note", default="", help="a sentence for the docs, e.g. how loaded "
                        "the machine was by other work")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.reps:
        cfg["reps"] = args.reps
    if args.sizes:
        cfg["sizes"] = args.sizes
    options = (["--quick"] if args.quick else []) + (["--reps", str(args.reps)] if args.reps else []) \
        + (["--sizes", ",".join(map(str, args.sizes))] if args.sizes else []) \
        + (["--seed", str(args.seed)] if args.seed else []) \
        + (["--only", ",".join(args.only)] if list(args.only) != list(PARTS) else [])
    command = " ".join([".venv/bin/python", "bench/run.py", *options])
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS / ("%s%s.json" % (stamp, "-quick" if args.quick else ""))

    def log(msg):
        print(msg, flush=True)

    info = machine()
    compile_bytecode()
    started = time.time()
    log("bench: %s (%s)" % (command, json.dumps(cfg)))
    runs = measure(cfg, random.Random(args.seed), log, args.only)
    info["load_1min_after"] = os.getloadavg()[0]
    loads = [r["load_1min"] for r in runs]
    info["load_1min_median_during"] = statistics.median(loads) if loads else None
    data = {"command": command, "note": args.note, "config": cfg, "parts": list(args.only), "quick": args.quick, "machine": info,
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
            "duration_s": round(time.time() - started, 1), "runs": runs}
    out.write_text(json.dumps(data, indent=1))
    log("wrote %s (%.0f s)" % (out.relative_to(REPO), data["duration_s"]))
    if not args.no_docs:
        sys.path.insert(0, str(HERE))
        import report

        for path in report.write_docs(data, out.relative_to(REPO)):
            log("wrote %s" % path.relative_to(REPO))


if __name__ == "__main__":
    main()
