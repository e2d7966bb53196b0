"""Scale benchmark (issue 25): gangs of 1 to 64 emulated nodes x 8 ranks on this host.

    .venv/bin/python bench/scale.py            # sizes 1, 4, 16, 32, 64: every arm (~20 min)
    .venv/bin/python bench/scale.py --quick    # sizes 1 and 4, short phases (< 3 min)
    .venv/bin/python bench/scale.py --sizes 16 --arms ours,store

Arms, each run for every size, one run at a time:

- `ours`: bench/flows/scale_gang.py through `python flow.py run`, the local backend: node 0 is
  the Metaflow task, nodes 1..N-1 spin-step node agents, ranks forked (scale_body.py). One run
  where every rank finishes (assembly, idle cost, logs, gather) and one where the last rank of
  the last node raises (teardown, the report naming it).
- `torchrun`: N `torchrun --nnodes=N --rdzv-backend=c10d` agents on this host running a worker
  that imports nothing heavy (bench/flows/scale_torchrun_worker.py): assembly, and teardown
  after the same rank fails.
- `store`: the remote log path (LogShipper -> store -> LogReceiver), which a local run never
  uses, measured by bench/scale_storelogs.py with the product's own classes.
- `nocard`: the failing run of `ours` with the gang's card off, for what drawing the card of
  a failed attempt adds to the task's end.

Memory: PSS of every process of a run, sampled every few seconds except while CPU or logs are
measured; a run whose processes pass --max-pss-gb, or that leaves less than --min-available-gb
of the host's memory available, is killed and recorded as such, and larger sizes of that arm
are skipped. Writes bench/results/scale-<timestamp>.json, then docs/benchmarks.md's "Scale"
section and docs/benchmarks_scale.png (bench/scale_report.py).
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
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
sys.path.insert(0, str(HERE))

import scale_probe  # noqa: E402
from run import flow_env, free_port, leftovers  # noqa: E402  (bench/run.py's, one copy)

FULL = dict(sizes=[1, 4, 16, 32, 64], nproc=8, rate=10000.0, idle_s=10.0, log_s=5.0,
            fail_idle_s=3.0, torchrun_cap_s=30.0, torchrun_bound_s=300.0, store_idle_s=4.0,
            flow_bound_s=1200.0)
QUICK = dict(sizes=[1, 4], nproc=8, rate=10000.0, idle_s=3.0, log_s=2.0, fail_idle_s=1.0,
             torchrun_cap_s=8.0, torchrun_bound_s=120.0, store_idle_s=2.0, flow_bound_s=300.0)
ARMS = ("ours", "torchrun", "store", "nocard")
# Seconds torchrun's workers sleep once in (the gang's memory is sampled then).
TORCHRUN_SLEEP_S = 3.0
LOG_LINE = re.compile(rb"^\[MFLOG\|0\|([^|]+)Z\|[^]]*\]\[rank (\d+)\] SCALELOG (\d+) (\d+) "
                      rb"([\d.]+)\s*$")
MFLOG_TIME = re.compile(rb"^\[MFLOG\|0\|([^|]+)Z\|")


def log(msg):
    print(msg, flush=True)


def load_now():
    with open("/proc/loadavg") as f:
        return f.read().strip()


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def sleep_until(t):
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


def mflog_time(stamp):
    """An mflog line's UTC timestamp (bytes) as time.time()."""
    return datetime.datetime.strptime(stamp.decode(), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()


class Guard(threading.Thread):
    """Samples the PSS of every process below `roots()` (the roots excluded unless
    `with_roots`) every `interval` s while not paused, keeps the peak and when each process
    was first seen; kills them all (`kill()`) past `max_pss` bytes or below `min_available`
    bytes of available memory (checked every 0.5 s, paused or not)."""

    def __init__(self, roots, kill, max_pss, min_available, interval=3.0, with_roots=False):
        super().__init__(daemon=True)
        self.roots, self.kill, self.interval = roots, kill, interval
        self.max_pss, self.min_available, self.with_roots = max_pss, min_available, with_roots
        self.peak_pss = 0
        self.peak_procs = 0
        self.samples = []  # (time, procs, pss bytes, seconds the sample took)
        self.seen = {}  # pid -> (created, command line)
        self.paused = threading.Event()
        self.stopped = threading.Event()
        self.killed_for = None

    def procs(self):
        found = []
        for pid in self.roots():
            try:
                root = psutil.Process(pid)
                found += ([root] if self.with_roots else []) + root.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
        return found

    def run(self):
        next_sample = 0.0
        while not self.stopped.is_set():
            available = psutil.virtual_memory().available
            if available < self.min_available:
                self._kill("only %.1f GiB of memory left available" % (available / 2**30))
                return
            if not self.paused.is_set() and time.time() >= next_sample:
                began = time.time()
                procs = self.procs()
                total = 0
                for p in procs:
                    total += scale_probe.pss_bytes(p.pid)
                    if p.pid not in self.seen:
                        try:
                            self.seen[p.pid] = (scale_probe.created(p.pid), p.cmdline())
                        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                            pass
                took = time.time() - began
                self.samples.append((round(began, 3), len(procs), total, round(took, 3)))
                self.peak_pss = max(self.peak_pss, total)
                self.peak_procs = max(self.peak_procs, len(procs))
                if total > self.max_pss:
                    self._kill("its processes' PSS reached %.1f GiB" % (total / 2**30))
                    return
                next_sample = time.time() + self.interval
            self.stopped.wait(0.5)

    def _kill(self, why):
        self.killed_for = why
        log("  MEMORY GUARD: %s; killing the run" % why)
        self.kill()

    def finish(self):
        self.stopped.set()
        self.join()
        return dict(peak_pss_mb=round(self.peak_pss / 2**20, 1), peak_procs=self.peak_procs,
                    pss_samples=len(self.samples),
                    pss_sample_max_s=max((s[3] for s in self.samples), default=None),
                    killed_for_memory=self.killed_for)


def kill_tree(pid):
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def wait_for_file(path, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.1)
    return None


def base_env(root, extra):
    out = root / "out"
    out.mkdir(parents=True, exist_ok=True)
    env = flow_env(root, drop=("SCALE_",))
    env.update({"PYTHONPATH": str(FLOWS), "SCALE_DIR": str(out)})
    env.update({k: str(v) for k, v in extra.items()})
    return env


# -- ours --------------------------------------------------------------------------------------

def node0_pids(schedule):
    """(the task, its pump, the node agents, every rank) of a running gang."""
    task = schedule["task_pid"]
    ranks = [r["pid"] for r in schedule["ranks"]]
    agents, pump = [], None
    try:
        for child in psutil.Process(task).children():
            if child.pid in ranks:
                continue
            if "spin-step" in " ".join(child.cmdline()):
                agents.append(child.pid)
            else:
                pump = child.pid
    except psutil.NoSuchProcess:
        pass
    return task, pump, agents, ranks


def run_ours(size, cfg, fail, guard_limits, card=True):
    """One run of the scale flow; its measurements. Without `card`, the gang's own card is
    off (METAFLOW_TORCH_DISTRIBUTED_CARD=0): what drawing it costs a failed task's end."""
    nproc = cfg["nproc"]
    world = size * nproc
    root = Path(tempfile.mkdtemp(prefix="td-scale-"))
    settings = dict(BENCH_NODES=size, BENCH_NPROC=nproc, BENCH_LOG_RATE=cfg["rate"],
                    BENCH_LOG_S=cfg["log_s"],
                    BENCH_IDLE_S=cfg["fail_idle_s"] if fail else cfg["idle_s"],
                    BENCH_LEAD_S=1.0 + 0.05 * size,
                    METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK="off")
    if fail:
        settings["BENCH_FAIL_RANK"] = world - 1
    if not card:
        settings["METAFLOW_TORCH_DISTRIBUTED_CARD"] = 0
    env = base_env(root, settings)
    record = dict(arm="ours" if card else "nocard", size=size, nproc=nproc, world=world,
                  fail=fail, load_before=load_now())
    out = root / "out"
    started = time.time()
    with open(root / "run.log", "wb") as run_log:
        proc = subprocess.Popen([sys.executable, str(FLOWS / "scale_gang.py"), "--no-pylint",
                                 "run"], cwd=root, env=env, stdout=run_log,
                                stderr=subprocess.STDOUT)
    guard = Guard(lambda: [proc.pid], lambda: kill_tree(proc.pid), *guard_limits)
    guard.start()
    schedule = wait_for_file(out / "schedule.json", proc, cfg["flow_bound_s"])
    if schedule is not None:
        record["pss_assembled_mb"] = tree_pss_mb(proc.pid)
    if schedule is not None and not fail:
        record.update(measure_idle(schedule, guard, proc.pid))
    elif schedule is not None:
        record.update(measure_teardown(schedule, out, proc, guard))
    try:
        proc.wait(timeout=max(1.0, cfg["flow_bound_s"] - (time.time() - started)))
        record["returncode"] = proc.returncode
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait()
        record["returncode"] = None
        record["timed_out"] = True
    record["wall_s"] = round(time.time() - started, 2)
    record.update(guard.finish())
    record["load_after"] = load_now()
    record["leftovers"] = leftovers(root)
    if schedule is not None:
        record.update(assembly(schedule, root, guard))
    if fail:
        record.update(failure_report(root, world - 1, size - 1, out))
    else:
        rank0 = out / "rank0.json"
        if rank0.exists():
            r0 = json.loads(rank0.read_text())
            record.update(gather_s=round(r0["gather_s"], 4), gather_ok=r0["gather_ok"])
            record["logs"] = local_logs(root, world, r0["lines_per_rank"],
                                        r0["schedule"]["logs"])
    expect = 1 if fail else 0
    if record.get("returncode") != expect:
        tail = (root / "run.log").read_bytes()[-3000:].decode(errors="replace")
        record["output_tail"] = tail
        log("  unexpected return code %s:\n%s" % (record.get("returncode"), tail))
    shutil.rmtree(root, ignore_errors=True)
    return record


def tree_pss_mb(pid):
    """The PSS of every process below `pid`, now (MB)."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    return round(sum(scale_probe.pss_bytes(p.pid) for p in procs) / 2**20, 1)


def measure_idle(schedule, guard, runtime):
    """Node 0's CPU and the store's requests over the idle window (heartbeats and polling
    alone), and while the lines flow: no PSS sampling from then until after the gather."""
    task, pump, agents, ranks = node0_pids(schedule)
    port = schedule["master_port"]
    pids = [p for p in [runtime, task, pump] + agents + ranks if p]
    sleep_until(schedule["idle"][0] + 0.3)
    guard.paused.set()
    sleep_until(schedule["idle"][0] + 1.0)
    a = scale_probe.snapshot(pids, port)
    sleep_until(schedule["idle"][1] - 0.3)
    b = scale_probe.snapshot(pids, port)
    sleep_until(schedule["logs"][0])
    c = scale_probe.snapshot(pids, port)
    sleep_until(schedule["logs"][1])
    d = scale_probe.snapshot(pids, port)
    sleep_until(schedule["gather"] + 1.0)
    guard.paused.clear()
    groups = {"task": [task], "pump": [pump] if pump else [], "agents": agents, "ranks": ranks,
              "metaflow_runtime": [runtime]}
    return dict(idle=scale_probe.rates(a, b, groups), logging=scale_probe.rates(c, d, groups))


def measure_teardown(schedule, out, proc, guard):
    """From the failing rank's raise to every process of the gang gone (node 0's task, its
    pump, every rank, agent and agent's pump), polled every 20 ms."""
    task = schedule["task_pid"]
    try:
        gang = [task] + [p.pid for p in psutil.Process(task).children(recursive=True)]
    except psutil.NoSuchProcess:
        return dict(teardown_error="the task was gone before the failure")
    failed = wait_for_file(out / "failed.json", proc, 120)
    if failed is None:
        return dict(teardown_error="the failing rank wrote no mark")
    guard.paused.set()
    members_gone = None
    deadline = time.time() + 120
    while time.time() < deadline:
        left = [p for p in gang if scale_probe.alive(p)]
        if members_gone is None and left in ([], [task]):
            members_gone = time.time()
        if not left:
            break
        time.sleep(0.02)
    gone = time.time() if not left else None
    guard.paused.clear()
    return dict(failed_at=failed["at"], failed_rank=failed["rank"], failed_node=failed["node"],
                gang_processes=len(gang), left_after_120s=len(left),
                teardown_members_s=round(members_gone - failed["at"], 3) if members_gone else None,
                teardown_all_s=round(gone - failed["at"], 3) if gone else None)


def task_dir(root):
    found = sorted(root.glob(".metaflow/ScaleGang/*/train/*"))
    return found[0] if found else None


def assembly(schedule, root, guard):
    """Task start to every rank in its body (and to the first), to the last node's check-in
    (its agent's join, from the gang's record), and how long the node agents took to start."""
    t0 = schedule["task_created"]
    arrived = [r["arrived"] for r in schedule["ranks"]]
    out = dict(assembly_s=round(max(arrived) - t0, 3), first_rank_s=round(min(arrived) - t0, 3))
    tdir = task_dir(root)
    record = None
    if tdir is not None and (tdir / "0.torch_distributed_record").exists():
        record = json.loads((tdir / "0.torch_distributed_record").read_text())
    if record is None:
        return out
    joins = [n["joined_gang"] for k, n in record["node_info"].items()
             if k != "0" and n.get("joined_gang")]
    if joins:
        out["last_checkin_s"] = round(max(joins) - t0, 3)
    # an agent's start: its process created (first seen by the guard) to its first rank forked
    starts = []
    by_node = {}
    for pid, (created, argv) in guard.seen.items():
        if "spin-step" in argv and "--task-id" in argv and created:
            m = re.search(r"-node-(\d+)$", argv[argv.index("--task-id") + 1])
            if m:  # the agent, or one of its forks (same command line): the earliest
                node = int(m.group(1))
                by_node[node] = min(created, by_node.get(node, created))
    for node, created in by_node.items():
        spawned = [r["spawned"] for r in record["node_info"].get(str(node), {})
                   .get("ranks", {}).values() if r.get("spawned")]
        if spawned:
            starts.append(min(spawned) - created)
    if starts:
        out["agent_start_median_s"] = round(sorted(starts)[len(starts) // 2], 3)
        out["agent_start_max_s"] = round(max(starts), 3)
        out["agents_seen"] = len(starts)
    return out


def local_logs(root, world, per_rank, window):
    """Every SCALELOG line in the task's stdout log (what Metaflow stored): lost, reordered
    within a rank, and the delay from the rank's write to Metaflow's stamp as it read it."""
    tdir = task_dir(root)
    path = tdir / "0.runtime_stdout.log" if tdir else None
    if path is None or not path.exists():
        return dict(error="no task log")
    seen = {r: set() for r in range(world)}
    last = {}
    reordered = unexpected = 0
    lines = []
    with open(path, "rb") as f:
        for raw in f:
            m = LOG_LINE.match(raw)
            if not m:
                continue
            rank, body_rank, seq = int(m.group(2)), int(m.group(3)), int(m.group(4))
            if rank != body_rank or rank not in seen or seq in seen[rank]:
                unexpected += 1
                continue
            if seq <= last.get(rank, -1):
                reordered += 1
            last[rank] = seq
            seen[rank].add(seq)
            lines.append((float(m.group(5)), mflog_time(m.group(1))))
    return scale_probe.line_stats(world * per_rank, sum(len(s) for s in seen.values()),
                                  reordered, unexpected, lines, window)


def failure_report(root, rank, node, out):
    """When the task's log first named the failing rank as the gang's failure, and whether it
    named the right one."""
    failed = out / "failed.json"
    tdir = task_dir(root)
    path = tdir / "0.runtime_stderr.log" if tdir else None
    if not failed.exists() or path is None or not path.exists():
        return dict(report_error="no mark or no task log")
    at = json.loads(failed.read_text())["at"]
    out = {}
    record_path = tdir / "0.torch_distributed_record"
    if record_path.exists():  # node 0's abort (it saw the failure), the gang's end
        record = json.loads(record_path.read_text())
        aborts = [t for name, t in record["phases"] if name == "abort"]
        if aborts:
            out["detected_s"] = round(aborts[0] - at, 3)
        out["gang_ended_s"] = round(record["ended"] - at, 3)
        out["record_root_cause_rank"] = (record.get("root_cause") or {}).get("rank")
    wanted = ("rank %d (node %d, local rank" % (rank, node)).encode()
    for raw in path.read_bytes().splitlines():
        if b"@torch_distributed on step" in raw and b"(node " in raw:
            m = MFLOG_TIME.match(raw)
            return dict(out, report_s=round(mflog_time(m.group(1)) - at, 3) if m else None,
                        report_names_rank=wanted in raw,
                        report_line=raw.split(b"]", 1)[-1].decode(errors="replace")[:300])
    return dict(out, report_s=None, report_names_rank=False)


# -- torchrun ----------------------------------------------------------------------------------

def run_torchrun(size, cfg, fail, guard_limits):
    """N torchrun agents on this host, each with its own session (a node)."""
    nproc = cfg["nproc"]
    world = size * nproc
    root = Path(tempfile.mkdtemp(prefix="td-scale-tr-"))
    settings = dict(BENCH_SLEEP_S=600 if fail else TORCHRUN_SLEEP_S)
    if fail:
        settings["BENCH_FAIL_RANK"] = world - 1
    env = base_env(root, settings)
    out = root / "out"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=%d" % size,
            "--nproc-per-node=%d" % nproc, "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:%d" % free_port(), "--rdzv-id=scale",
            "--max-restarts=0", str(FLOWS / "scale_torchrun_worker.py")]
    record = dict(arm="torchrun", size=size, nproc=nproc, world=world, fail=fail,
                  load_before=load_now())
    agents = []
    started = time.time()
    for node in range(size):
        with open(root / ("agent-%d.log" % node), "wb") as f:
            agents.append(subprocess.Popen(argv, cwd=root, env=env, stdout=f,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def kill_all():
        for a in agents:
            try:
                os.killpg(a.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    guard = Guard(lambda: [a.pid for a in agents], kill_all, *guard_limits, interval=1.0,
                  with_roots=True)
    guard.start()
    # torchrun's c10d rendezvous of many agents on 2 cores may not complete: given up after
    # torchrun_bound_s, and recorded as such
    bound = time.time() + cfg["torchrun_bound_s"]

    def arrived():
        return sorted(out.glob("in-*[0-9]"))

    while len(arrived()) < world and time.time() < bound and guard.killed_for is None \
            and any(a.poll() is None for a in agents):
        time.sleep(0.1)
    record["workers_in"] = len(arrived())
    if len(arrived()) < world and time.time() >= bound:
        record["gave_up_after_s"] = cfg["torchrun_bound_s"]
    if len(arrived()) == world:
        times = [tuple(map(float, p.read_text().split())) for p in arrived()]
        record["assembly_s"] = round(max(t[0] for t in times) - started, 3)
        record["first_rank_s"] = round(min(t[0] for t in times) - started, 3)
        # a node's workers are started once its rendezvous round completed
        record["last_checkin_s"] = round(max(t[1] for t in times) - started, 3)
        record["pss_assembled_mb"] = round(sum(
            scale_probe.pss_bytes(p.pid) for p in guard.procs()) / 2**20, 1)
        if fail:
            record.update(torchrun_teardown(out, agents, cfg["torchrun_cap_s"], guard))
    while not fail and time.time() < bound and any(a.poll() is None for a in agents):
        time.sleep(0.1)
    kill_all()
    for a in agents:
        a.wait()
    record["wall_s"] = round(time.time() - started, 2)
    record["returncodes"] = sorted({a.returncode for a in agents})
    record.update(guard.finish())
    record["load_after"] = load_now()
    record["leftovers"] = leftovers(root)
    shutil.rmtree(root, ignore_errors=True)
    return record


def torchrun_teardown(out, agents, cap, guard):
    """From the failing worker's exit to its node's processes gone, and to every process gone,
    watched for at most `cap` s: torchrun stops the failed node's workers; the other nodes'
    agents only learn of it at their exit barrier (torch.distributed.elastic: 300 s by
    default), their workers run on."""
    deadline = time.time() + 120
    mark = out / "failed"
    while not mark.exists() and time.time() < deadline:
        time.sleep(0.02)
    if not mark.exists():
        return dict(teardown_error="the failing worker wrote no mark")
    failed_at, failing_agent = mark.read_text().split()
    failed_at, failing_agent = float(failed_at), int(failing_agent)
    guard.paused.set()
    procs = {}
    for a in agents:
        try:
            procs[a.pid] = [a.pid] + [c.pid for c in psutil.Process(a.pid).children(True)]
        except psutil.NoSuchProcess:
            procs[a.pid] = []
    node_gone = all_gone = None
    while time.time() < failed_at + cap:
        left = {a: [p for p in ps if scale_probe.alive(p)] for a, ps in procs.items()}
        if node_gone is None and not left.get(failing_agent):
            node_gone = time.time()
        if not any(left.values()):
            all_gone = time.time()
            break
        time.sleep(0.02)
    guard.paused.clear()
    left = sum(1 for ps in procs.values() for p in ps if scale_probe.alive(p))
    return dict(failed_at=failed_at, teardown_cap_s=cap,
                teardown_failed_node_s=round(node_gone - failed_at, 3) if node_gone else None,
                teardown_all_s=round(all_gone - failed_at, 3) if all_gone else None,
                left_at_cap=left)


# -- the store's log path ----------------------------------------------------------------------

def run_store(size, cfg, guard_limits, rate=None):
    root = Path(tempfile.mkdtemp(prefix="td-scale-store-"))
    env = base_env(root, {})
    argv = [sys.executable, str(HERE / "scale_storelogs.py"), "--nodes", str(size),
            "--nproc", str(cfg["nproc"]), "--rate", str(rate or cfg["rate"]),
            "--seconds", str(cfg["log_s"]), "--idle", str(cfg["store_idle_s"]),
            "--out", str(root)]
    record = dict(arm="store", size=size, nproc=cfg["nproc"], load_before=load_now())
    started = time.time()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    guard = Guard(lambda: [proc.pid], lambda: kill_tree(proc.pid), *guard_limits,
                  interval=4.0, with_roots=True)
    guard.start()
    try:
        output, _ = proc.communicate(timeout=cfg["flow_bound_s"])
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        output, _ = proc.communicate()
    record["wall_s"] = round(time.time() - started, 2)
    record["returncode"] = proc.returncode
    record.update(guard.finish())
    record["load_after"] = load_now()
    for line in output.decode(errors="replace").splitlines():
        if line.startswith("SCALE_STORE_RESULT "):
            record.update(json.loads(line.split(" ", 1)[1]))
            break
    else:
        record["output_tail"] = output.decode(errors="replace")[-3000:]
    shutil.rmtree(root, ignore_errors=True)
    return record


# -- the run -----------------------------------------------------------------------------------

def machine():
    import metaflow
    import torch

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--",
                            "metaflow_extensions"], capture_output=True, text=True).stdout
    return dict(cpu=cpu, cores=os.cpu_count(), product_commit=head + ("+changes" if dirty else ""),
                memory_gb=round(psutil.virtual_memory().total / 2**30, 1),
                python=sys.version.split()[0], torch=torch.__version__,
                metaflow=getattr(metaflow, "__version__", "?"), uptime_before=uptime())


def summarize(rec):
    bits = ["%-8s %3d x %d%s" % (rec["arm"], rec["size"], rec["nproc"],
                                 " fail" if rec.get("fail") else "     ")]
    for key, fmt in (("assembly_s", "assembly %.2fs"), ("last_checkin_s", "checkin %.2fs"),
                     ("gather_s", "gather %.3fs"), ("detected_s", "detected %.2fs"),
                     ("gang_ended_s", "gang ended %.2fs"),
                     ("teardown_members_s", "members gone %.2fs"),
                     ("teardown_failed_node_s", "failed node gone %.2fs"),
                     ("teardown_all_s", "all gone %.2fs"), ("left_at_cap", "left at cap %d"),
                     ("report_s", "report %.2fs"), ("delay_max_s", "store delay max %.2fs"),
                     ("delay_max_steady_s", "steady %.2fs"), ("delivered_per_s", "%.0f lines/s"),
                     ("pss_assembled_mb", "pss %.0fMB"), ("peak_pss_mb", "peak %.0fMB"),
                     ("wall_s", "wall %.0fs")):
        if rec.get(key) is not None:
            bits.append(fmt % rec[key])
    if rec.get("logs", {}).get("delay_max_s") is not None:
        lg = rec["logs"]
        bits.append("logs %s/s lost %d max %.2fs steady max %.2fs" % (
            lg.get("delivered_per_s"), lg["lines_lost"], lg["delay_max_s"],
            lg["delay_max_steady_s"] or 0))
    if "idle" in rec and rec["arm"] == "ours":
        bits.append("idle task %s%% pump %s%% %s req/s" % (
            rec["idle"]["cpu_pct"].get("task"), rec["idle"]["cpu_pct"].get("pump"),
            rec["idle"].get("requests_per_s")))
        bits.append("logging cpu %s" % rec["logging"]["cpu_pct"])
    if rec.get("killed_for_memory"):
        bits.append("KILLED: " + rec["killed_for_memory"])
    if rec.get("gave_up_after_s"):
        bits.append("NOT ASSEMBLED within %gs (%d workers in)" % (rec["gave_up_after_s"],
                                                               rec.get("workers_in", 0)))
    if rec.get("leftovers"):
        bits.append("LEFT %d PROCESSES" % rec["leftovers"])
    return "  ".join(bits)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes 1 and 4, short phases")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--arms", type=lambda s: s.split(","), default=list(ARMS),
                        help="comma-separated: %s" % ",".join(ARMS))
    parser.add_argument("--store-rates", type=lambda s: [float(x) for x in s.split(",")],
                        default=[], help="extra line rates of the store arm at its largest size")
    parser.add_argument("--store-sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[], help="extra sizes of the store arm alone (cheap)")
    parser.add_argument("--max-pss-gb", type=float, default=14.0)
    parser.add_argument("--min-available-gb", type=float, default=2.5)
    parser.add_argument("--label", default="", help="a word for this run, e.g. before/after")
    parser.add_argument("--note", default="")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.sizes:
        cfg["sizes"] = args.sizes
    limits = (args.max_pss_gb * 2**30, args.min_available_gb * 2**30)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = RESULTS / ("scale-%s%s.json" % (stamp, "-quick" if args.quick else ""))
    command = " ".join([".venv/bin/python", "bench/scale.py"] + (argv or sys.argv[1:]))
    info = machine()
    started = time.time()
    log("scale bench: %s (%s)" % (command, json.dumps(cfg)))
    log("  %s" % info["uptime_before"])
    runs = []
    skipped = []
    over = set()  # arms a size of which ran out of memory: larger sizes are skipped

    def go(arm, size, fn):
        if arm in over:
            skipped.append(dict(arm=arm, size=size, why="a smaller size ran out of memory"))
            log("  %-8s %3d: skipped (a smaller size ran out of memory)" % (arm, size))
            return
        rec = fn()
        rec["uptime"] = uptime()
        runs.append(rec)
        log(summarize(rec))
        if rec.get("killed_for_memory"):
            over.add(arm)

    for size in cfg["sizes"]:
        if "ours" in args.arms:
            go("ours", size, lambda: run_ours(size, cfg, False, limits))
            go("ours", size, lambda: run_ours(size, cfg, True, limits))
        if "torchrun" in args.arms:
            go("torchrun", size, lambda: run_torchrun(size, cfg, False, limits))
            go("torchrun", size, lambda: run_torchrun(size, cfg, True, limits))
        if "store" in args.arms and size > 1:
            go("store", size, lambda: run_store(size, cfg, limits))
        if "nocard" in args.arms:
            go("nocard", size, lambda: run_ours(size, cfg, True, limits, card=False))
    for size in args.store_sizes:
        go("store", size, lambda: run_store(size, cfg, limits))
    for rate in args.store_rates:
        size = max(cfg["sizes"])
        go("store", size, lambda: run_store(size, cfg, limits, rate))
    data = dict(command=command, label=args.label, note=args.note, quick=args.quick,
                config=cfg, arms=args.arms, machine=info,
                started=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
                duration_s=round(time.time() - started, 1), uptime_after=uptime(),
                max_pss_gb=args.max_pss_gb, runs=runs, skipped=skipped)
    path.write_text(json.dumps(data, indent=1))
    log("wrote %s (%.0f s)" % (path.relative_to(REPO), data["duration_s"]))
    if not args.no_docs:
        import scale_report

        for written in scale_report.write_docs([data], [str(path.relative_to(REPO))]):
            log("wrote %s" % written.relative_to(REPO))


if __name__ == "__main__":
    main()
